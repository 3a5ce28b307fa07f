//! What a full offline session's queue does to a QoS 1/2 message, per
//! `queue_full_policy`, with a real MQTT 5 publisher (rumqttc) and an offline
//! persistent subscriber whose queue holds 10: which messages it gets when it comes
//! back, and what the publisher was told. An MQTT 3.1.1 publisher under `refuse`
//! cannot be told 0x97: its connection closes and it resends after reconnecting.
//! (`crates/statehub/tests/queue_full.rs` runs the same with a data directory.)

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use statehub_broker::codec::{Connect, ConnectProperties, Packet, Publish, QoS, ReasonCode};
use statehub_broker::{Broker, BrokerConfig, QueueFull};
use statehub_test_support::v5pub::{publish_each, PubAckReason};
use statehub_test_support::*;
use tokio::time::timeout;

const CAP: usize = 10;

fn config(policy: QueueFull) -> BrokerConfig {
    BrokerConfig {
        max_queued_messages: CAP,
        queue_full_policy: policy,
        ..Default::default()
    }
}

fn persistent(id: &str) -> Connect {
    Connect {
        clean_start: false,
        properties: ConnectProperties {
            session_expiry_interval: Some(600),
            ..Default::default()
        },
        ..connect_packet(V5, id)
    }
}

/// A persistent session subscribed to `filters` at QoS 1, left offline.
async fn offline_subscriber(b: &Broker, addr: SocketAddr, id: &str, filters: &[&str]) {
    let (mut s, _) = RawClient::connect_with(addr, persistent(id)).await;
    for f in filters {
        s.subscribe(f, opts(QoS::AtLeastOnce)).await;
    }
    s.disconnect().await;
    assert!(wait_until(WAIT, || b.connection_count() == 0).await);
}

/// Resumes `id`'s session and returns the payloads of every message it gets, in
/// order, acknowledging each; `dup`: how many came with DUP set.
async fn come_back(addr: SocketAddr, id: &str) -> (Vec<String>, usize) {
    let (mut s, ack) = RawClient::connect_with(addr, persistent(id)).await;
    assert!(ack.session_present);
    let (mut got, mut dup) = (Vec::new(), 0);
    while let Event::Packet(Packet::Publish(p)) = s.next_event(QUIET).await {
        s.ack(&p).await;
        dup += usize::from(p.dup);
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    (got, dup)
}

fn names(prefix: &str, range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i}")).collect()
}

/// An offline subscriber, 15 QoS 1 messages from an MQTT 5 publisher: what the
/// publisher was told and what the subscriber gets when it comes back.
async fn fifteen_to_a_queue_of_ten(cfg: BrokerConfig) -> (Broker, Vec<PubAckReason>, Vec<String>) {
    let (b, addr) = start_broker(cfg).await;
    offline_subscriber(&b, addr, "sub", &["t"]).await;
    let reasons = publish_each(addr, "pub5", "t", &names("m", 0..15)).await;
    let (got, _) = come_back(addr, "sub").await;
    (b, reasons, got)
}

#[tokio::test]
async fn drop_oldest_is_the_default_and_keeps_the_newest() {
    let cfg = BrokerConfig {
        max_queued_messages: CAP,
        ..Default::default()
    };
    let (b, reasons, got) = fifteen_to_a_queue_of_ten(cfg).await;
    assert!(
        reasons.iter().all(|r| *r == PubAckReason::Success),
        "{reasons:?}"
    );
    assert_eq!(got, names("m", 5..15));
    let m = b.metrics();
    assert_eq!(m.dropped_queue_full_oldest.load(Ordering::Relaxed), 5);
    assert_eq!(m.dropped_queue_full_newest.load(Ordering::Relaxed), 0);
    assert_eq!(m.dropped.load(Ordering::Relaxed), 5);
}

#[tokio::test]
async fn drop_newest_keeps_the_first_and_acknowledges_every_message() {
    let (b, reasons, got) = fifteen_to_a_queue_of_ten(config(QueueFull::DropNewest)).await;
    assert!(
        reasons.iter().all(|r| *r == PubAckReason::Success),
        "{reasons:?}"
    );
    assert_eq!(got, names("m", 0..10));
    let m = b.metrics();
    assert_eq!(m.dropped_queue_full_newest.load(Ordering::Relaxed), 5);
    assert_eq!(m.dropped_queue_full_oldest.load(Ordering::Relaxed), 0);
    assert_eq!(m.dropped.load(Ordering::Relaxed), 5);
}

#[tokio::test]
async fn refuse_answers_0x97_for_what_the_queue_cannot_take() {
    let (b, reasons, got) = fifteen_to_a_queue_of_ten(config(QueueFull::Refuse)).await;
    let mut want = vec![PubAckReason::Success; CAP];
    want.extend([PubAckReason::QuotaExceeded; 5]);
    assert_eq!(reasons, want);
    assert_eq!(got, names("m", 0..10));
    let m = b.metrics();
    assert_eq!(m.refused_quota.load(Ordering::Relaxed), 5);
    assert_eq!(
        m.dropped.load(Ordering::Relaxed),
        0,
        "nothing acknowledged was lost"
    );
}

#[tokio::test]
async fn drop_oldest_never_drops_a_message_in_flight() {
    let (b, addr) = start_broker(config(QueueFull::DropOldest)).await;
    let (mut s, _) = RawClient::connect_with(addr, persistent("sub")).await;
    s.subscribe("t", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(addr, V5, "pub").await;
    for p in names("m", 0..3) {
        publisher
            .publish_simple("t", QoS::AtLeastOnce, p.as_bytes())
            .await;
    }
    // Received, not acknowledged: in flight when the subscriber goes.
    for _ in 0..3 {
        s.expect_publish().await;
    }
    s.disconnect().await;
    assert!(wait_until(WAIT, || b.connection_count() == 1).await);
    for p in names("m", 3..15) {
        let code = publisher
            .publish_simple("t", QoS::AtLeastOnce, p.as_bytes())
            .await;
        assert_eq!(code, ReasonCode::SUCCESS);
    }
    let (got, dup) = come_back(addr, "sub").await;
    // The three in flight are resent first; the queue kept the newest seven.
    let mut want = names("m", 0..3);
    want.extend(names("m", 8..15));
    assert_eq!(got, want);
    assert_eq!(dup, 3);
    let m = b.metrics();
    assert_eq!(m.dropped_queue_full_oldest.load(Ordering::Relaxed), 5);
}

#[tokio::test]
async fn refuse_is_all_or_nothing_for_every_subscriber_and_the_retained_message() {
    let (b, addr) = start_broker(config(QueueFull::Refuse)).await;
    offline_subscriber(&b, addr, "full", &["t", "x"]).await;
    offline_subscriber(&b, addr, "roomy", &["t"]).await;
    let mut publisher = RawClient::connect(addr, V5, "pub").await;
    for p in names("x", 0..8) {
        publisher
            .publish_simple("x", QoS::AtLeastOnce, p.as_bytes())
            .await;
    }
    for p in names("t", 0..2) {
        let code = publisher
            .publish_simple("t", QoS::AtLeastOnce, p.as_bytes())
            .await;
        assert_eq!(code, ReasonCode::SUCCESS);
    }
    // "full" holds 10 now: "roomy" has room, but a message goes to all or none.
    let code = publisher.publish_simple("t", QoS::AtLeastOnce, b"t2").await;
    assert_eq!(code, ReasonCode::QUOTA_EXCEEDED);
    // QoS 2, retained: PUBREC 0x97, no receipt kept (the same packet id again is a
    // new message, refused again, not a duplicate answered 0x00), nothing retained.
    let retained = Publish {
        retain: true,
        packet_id: Some(77),
        ..publish("t", QoS::ExactlyOnce, b"t3")
    };
    assert_eq!(
        publisher.publish(retained.clone()).await,
        ReasonCode::QUOTA_EXCEEDED
    );
    assert_eq!(
        publisher.publish(retained).await,
        ReasonCode::QUOTA_EXCEEDED
    );
    let mut late = RawClient::connect(addr, V5, "late").await;
    late.subscribe("t", opts(QoS::AtLeastOnce)).await;
    late.expect_nothing(QUIET).await;

    assert_eq!(come_back(addr, "roomy").await.0, names("t", 0..2));
    let mut want = names("x", 0..8);
    want.extend(names("t", 0..2));
    assert_eq!(come_back(addr, "full").await.0, want);
    assert_eq!(b.metrics().refused_quota.load(Ordering::Relaxed), 3);
    assert_eq!(b.retained_count(), 0);
}

#[tokio::test]
async fn refuse_closes_an_mqtt_311_publisher_which_resends_after_reconnecting() {
    use rumqttc::{AsyncClient, Event as E311, MqttOptions, Packet as In311, QoS};
    let (b, addr) = start_broker(config(QueueFull::Refuse)).await;
    offline_subscriber(&b, addr, "sub", &["t"]).await;
    let mut o = MqttOptions::new("pub311", addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut el) = AsyncClient::new(o, 20);
    for p in names("m", 0..11) {
        client
            .publish("t", QoS::AtLeastOnce, false, p)
            .await
            .unwrap();
    }
    let (mut acked, mut closed) = (0, false);
    let wait = async {
        while !closed {
            match el.poll().await {
                Ok(E311::Incoming(In311::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(_) => closed = true,
            }
        }
    };
    timeout(WAIT, wait).await.expect("the connection closes");
    assert_eq!(acked, CAP, "the first ten acknowledged, the eleventh not");
    let m = b.metrics();
    assert_eq!(m.refused_quota.load(Ordering::Relaxed), 1);
    assert_eq!(m.refused_quota_closed.load(Ordering::Relaxed), 1);

    // Once the subscriber has read its queue, the publisher's next connection
    // resends the unacknowledged message, and it goes through.
    let (mut s, _) = RawClient::connect_with(addr, persistent("sub")).await;
    for want in names("m", 0..10) {
        let p = s.expect_publish_ack().await;
        assert_eq!(p.payload, want.as_bytes());
    }
    assert!(wait_until(WAIT, || b.queued_total().0 == 0).await);
    let resent = async {
        loop {
            if let Ok(E311::Incoming(In311::PubAck(_))) = el.poll().await {
                return;
            }
        }
    };
    timeout(WAIT, resent)
        .await
        .expect("the resent message's PUBACK");
    assert_eq!(s.expect_publish_ack().await.payload, "m10".as_bytes());
}
