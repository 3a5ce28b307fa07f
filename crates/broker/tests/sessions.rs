//! Sessions across connections: queued messages, in-flight resend with DUP,
//! session expiry, and wills (abnormal close, normal DISCONNECT, 0x04, delay).

use std::time::Duration;

use bytes::Bytes;
use statehub_broker::codec::{
    Connect, ConnectProperties, Disconnect, LastWill, Packet, PubResponse, QoS, ReasonCode,
    WillProperties,
};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

fn persistent(id: &str, clean_start: bool) -> Connect {
    let mut c = connect_packet(V5, id);
    c.clean_start = clean_start;
    c.properties = ConnectProperties {
        session_expiry_interval: Some(60),
        ..Default::default()
    };
    c
}

#[tokio::test]
async fn queued_qos1_messages_are_delivered_after_reconnect() {
    let (_b, addr) = start_default().await;
    let (mut s, _) = RawClient::connect_with(addr, persistent("q1", true)).await;
    s.subscribe("q1/#", opts(QoS::ExactlyOnce)).await;
    s.disconnect().await;
    let mut publ = RawClient::connect(addr, V5, "q1pub").await;
    publ.publish_simple("q1/a", QoS::AtLeastOnce, b"1").await;
    publ.publish_simple("q1/a", QoS::AtMostOnce, b"qos0 not queued")
        .await;
    publ.publish_simple("q1/b", QoS::ExactlyOnce, b"2").await;
    publ.publish_simple("q1/a", QoS::AtLeastOnce, b"3").await;

    let (mut s, ack) = RawClient::connect_with(addr, persistent("q1", false)).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(s.expect_publish_ack().await.payload);
    }
    assert_eq!(
        got,
        vec![
            Bytes::from_static(b"1"),
            Bytes::from_static(b"2"),
            Bytes::from_static(b"3")
        ]
    );
    s.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn rumqttc_v311_persistent_session() {
    let (b, addr) = start_default().await;
    let mut o = v4c::options(addr, "r4persist");
    o.set_clean_session(false);
    {
        let (c, mut rx) = v4c::connect(o.clone()).await;
        c.subscribe("p4/t", v4c::QoS::AtLeastOnce).await.unwrap();
        v4c::next_suback(&mut rx).await;
        c.disconnect().await.unwrap();
        assert!(wait_until(WAIT, || b.connection_count() == 0).await);
    }
    let mut publ = RawClient::connect(addr, V311, "p4pub").await;
    publ.publish_simple("p4/t", QoS::AtLeastOnce, b"while away")
        .await;
    let (_c, mut rx) = v4c::connect(o).await;
    let got = v4c::next_publish(&mut rx).await;
    assert_eq!(&got.payload[..], b"while away");
}

#[tokio::test]
async fn unacknowledged_qos1_is_resent_with_dup_on_resume() {
    let (b, addr) = start_default().await;
    let (mut s, _) = RawClient::connect_with(addr, persistent("dup1", true)).await;
    s.subscribe("dup/t", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "duppub").await;
    publ.publish_simple("dup/t", QoS::AtLeastOnce, b"again")
        .await;
    let first = s.expect_publish().await;
    assert!(!first.dup);
    drop(s); // no PUBACK, TCP closed
    assert!(wait_until(WAIT, || b.connection_count() == 1).await);

    let (mut s, ack) = RawClient::connect_with(addr, persistent("dup1", false)).await;
    assert!(ack.session_present);
    let again = s.expect_publish().await;
    assert!(again.dup, "resent PUBLISH must have DUP set [MQTT-3.3.1-1]");
    assert_eq!(again.packet_id, first.packet_id, "same packet identifier");
    assert_eq!(again.payload, first.payload);
    s.ack(&again).await;
    s.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn qos2_exchange_resumes_with_pubrel() {
    let (b, addr) = start_default().await;
    let (mut s, _) = RawClient::connect_with(addr, persistent("dup2", true)).await;
    s.subscribe("dup2/t", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "dup2pub").await;
    publ.publish_simple("dup2/t", QoS::ExactlyOnce, b"two")
        .await;
    let first = s.expect_publish().await;
    let id = first.packet_id.unwrap();
    s.send(&Packet::PubRec(PubResponse::ok(id))).await;
    assert!(matches!(s.expect().await, Packet::PubRel(r) if r.packet_id == id));
    drop(s);
    assert!(wait_until(WAIT, || b.connection_count() == 1).await);

    let (mut s, _) = RawClient::connect_with(addr, persistent("dup2", false)).await;
    match s.expect().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, id),
        other => panic!("expected the PUBREL to be resent, got {other:?}"),
    }
    s.send(&Packet::PubComp(PubResponse::ok(id))).await;
    s.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn session_expires_after_its_interval() {
    let (b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut c = connect_packet(V5, "expiring");
    c.clean_start = false;
    c.properties.session_expiry_interval = Some(60);
    let (mut s, ack) = RawClient::connect_with(addr, c.clone()).await;
    assert!(!ack.session_present);
    s.subscribe("gone/t", opts(QoS::AtLeastOnce)).await;
    drop(s);
    assert!(wait_until(WAIT, || b.connection_count() == 0).await);
    clock.advance(Duration::from_secs(59));
    let (s, ack) = RawClient::connect_with(addr, c.clone()).await;
    assert!(ack.session_present, "still within the 60 s expiry");
    drop(s);
    assert!(wait_until(WAIT, || b.connection_count() == 0).await);
    // The clock restarts at the second disconnect.
    clock.advance(Duration::from_secs(59));
    assert!(b.has_session("expiring"));
    clock.advance(Duration::from_secs(2));
    assert!(wait_until(WAIT, || !b.has_session("expiring")).await);
    let (mut s, ack) = RawClient::connect_with(addr, c).await;
    assert!(
        !ack.session_present,
        "session should have expired after 60 s"
    );
    // ... and its subscription with it.
    let mut publ = RawClient::connect(addr, V5, "gonepub").await;
    assert_eq!(
        publ.publish_simple("gone/t", QoS::AtLeastOnce, b"x").await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    s.expect_nothing(QUIET).await;
}

fn with_will(id: &str, delay: Option<u32>, session_expiry: u32) -> Connect {
    let mut c = connect_packet(V5, id);
    c.properties.session_expiry_interval = Some(session_expiry);
    c.will = Some(LastWill {
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: bs(&format!("will/{id}")),
        payload: Bytes::from_static(b"gone"),
        properties: WillProperties {
            will_delay_interval: delay,
            content_type: Some(bs("text/plain")),
            user_properties: vec![(bs("who"), bs(id))],
            ..Default::default()
        },
    });
    c
}

async fn watcher(addr: std::net::SocketAddr, id: &str) -> RawClient {
    let mut w = RawClient::connect(addr, V5, &format!("watch-{id}")).await;
    w.subscribe("will/#", opts(QoS::AtLeastOnce)).await;
    w
}

#[tokio::test]
async fn will_is_published_on_abnormal_close() {
    let (_b, addr) = start_default().await;
    let mut w = watcher(addr, "abn").await;
    let (c, _) = RawClient::connect_with(addr, with_will("abn", None, 0)).await;
    drop(c);
    let got = w.expect_publish_ack().await;
    assert_eq!(&*got.topic, "will/abn");
    assert_eq!(&got.payload[..], b"gone");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    assert_eq!(got.properties.content_type.as_deref(), Some("text/plain"));
    assert_eq!(got.properties.user_properties, vec![(bs("who"), bs("abn"))]);
}

#[tokio::test]
async fn will_is_not_published_on_normal_disconnect() {
    let (_b, addr) = start_default().await;
    let mut w = watcher(addr, "norm").await;
    let (c, _) = RawClient::connect_with(addr, with_will("norm", None, 0)).await;
    c.disconnect().await;
    w.expect_nothing(Duration::from_millis(500)).await;
}

#[tokio::test]
async fn will_is_published_on_disconnect_with_will_message() {
    let (_b, addr) = start_default().await;
    let mut w = watcher(addr, "dww").await;
    let (mut c, _) = RawClient::connect_with(addr, with_will("dww", None, 0)).await;
    c.send(&Packet::Disconnect(Disconnect::with_reason(
        ReasonCode::DISCONNECT_WITH_WILL,
    )))
    .await;
    assert_eq!(&*w.expect_publish_ack().await.topic, "will/dww");
}

#[tokio::test]
async fn will_is_published_on_keep_alive_timeout() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut w = watcher(addr, "kat").await;
    let mut connect = with_will("kat", None, 0);
    connect.keep_alive = 10;
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    clock.advance(Duration::from_secs(16));
    c.expect_disconnect(ReasonCode::KEEP_ALIVE_TIMEOUT).await;
    assert_eq!(&*w.expect_publish_ack().await.topic, "will/kat");
}

#[tokio::test]
async fn v311_will_on_abnormal_close() {
    let (_b, addr) = start_default().await;
    let mut w = watcher(addr, "v3").await;
    let mut connect = connect_packet(V311, "v3will");
    connect.will = Some(LastWill {
        qos: QoS::AtMostOnce,
        retain: true,
        topic: bs("will/v3"),
        payload: Bytes::from_static(b"bye"),
        properties: WillProperties::default(),
    });
    let (c, _) = RawClient::connect_with(addr, connect).await;
    drop(c);
    assert_eq!(&w.expect_publish().await.payload[..], b"bye");
    // Will Retain: stored as a retained message.
    let mut late = RawClient::connect(addr, V5, "late").await;
    late.subscribe("will/v3", opts(QoS::AtMostOnce)).await;
    let got = late.expect_publish().await;
    assert!(got.retain);
    assert_eq!(&got.payload[..], b"bye");
}

#[tokio::test]
async fn delayed_will_is_not_sent_if_the_client_reconnects_in_time() {
    let (b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut w = watcher(addr, "delay").await;
    let connect = with_will("delay", Some(30), 60);
    let (c, _) = RawClient::connect_with(addr, connect.clone()).await;
    drop(c);
    assert!(wait_until(WAIT, || b.connection_count() == 1).await);
    clock.advance(Duration::from_secs(20));
    let mut again = connect;
    again.clean_start = false;
    again.will = None;
    let (mut c, ack) = RawClient::connect_with(addr, again).await;
    assert!(ack.session_present);
    clock.advance(Duration::from_secs(20));
    w.expect_nothing(QUIET).await;
    c.ping().await;
}

#[tokio::test]
async fn delayed_will_is_sent_after_the_delay() {
    let (b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut w = watcher(addr, "late").await;
    let (c, _) = RawClient::connect_with(addr, with_will("late", Some(30), 60)).await;
    drop(c);
    assert!(wait_until(WAIT, || b.connection_count() == 1).await);
    clock.advance(Duration::from_secs(29));
    w.expect_nothing(QUIET).await;
    clock.advance(Duration::from_secs(2));
    let got = w.expect_publish_ack().await;
    assert_eq!(&*got.topic, "will/late");
}

#[tokio::test]
async fn will_delay_is_capped_by_session_expiry() {
    let (_b, addr) = start_default().await;
    let mut w = watcher(addr, "cap").await;
    // Delay 30 s but the session ends at once (expiry 0): the will goes out now.
    let (c, _) = RawClient::connect_with(addr, with_will("cap", Some(30), 0)).await;
    drop(c);
    assert_eq!(&*w.expect_publish_ack().await.topic, "will/cap");
}

/// A message from another node that some sessions here held already (they moved
/// here from its node, and its forward reached this node only after them) goes to
/// every other matching session, and to those only through a shared group picked for
/// this node (a copy they never held).
#[tokio::test]
async fn a_remote_message_skips_the_sessions_that_held_it_but_not_their_shared_groups() {
    use statehub_broker::{Gate, Message, SharedPick, SharedPicks};
    use std::sync::Arc;
    let (broker, addr) = start_default().await;
    let mut held = RawClient::connect(addr, V5, "held").await;
    held.subscribe("r/1", opts(QoS::AtLeastOnce)).await;
    let mut member = RawClient::connect(addr, V5, "member").await;
    member
        .subscribe("$share/g/r/1", opts(QoS::AtLeastOnce))
        .await;
    let mut other = RawClient::connect(addr, V5, "other").await;
    other.subscribe("r/1", opts(QoS::AtLeastOnce)).await;
    let picks = SharedPicks::new(vec![SharedPick {
        filter: "r/1".into(),
        group: "g".into(),
        node: "here".into(),
        here: true,
    }]);
    let held_by: Vec<Arc<str>> = vec![Arc::from("held"), Arc::from("member")];
    let gate = Arc::new(Gate::default());
    gate.open();
    for (payload, held_by) in [(&b"late"[..], &held_by[..]), (b"next", &[])] {
        let msg = Message::from_publish(
            publish("r/1", QoS::AtLeastOnce, payload),
            None,
            broker.now(),
        );
        broker.route_remote_gated(msg, (&picks, held_by), &gate);
    }
    assert_eq!(other.expect_publish_ack().await.payload, &b"late"[..]);
    assert_eq!(
        member.expect_publish_ack().await.payload,
        &b"late"[..],
        "its group's copy"
    );
    assert_eq!(
        held.expect_publish_ack().await.payload,
        &b"next"[..],
        "not `late` again"
    );
}
