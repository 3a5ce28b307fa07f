//! The bounds on what sessions keep: a finite maximum Session Expiry by default
//! (3.1.1 sessions without Clean Session included), a cap on persistent sessions
//! (CONNACK 0x97, return code 3 for 3.1.1), and a bound on what every session's queue
//! holds together.

use std::sync::atomic::Ordering;
use std::time::Duration;

use statehub_broker::codec::{Disconnect, Packet, QoS, ReasonCode};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

const DAY: u32 = 24 * 3600;

#[tokio::test]
async fn session_expiry_is_capped_at_a_day_by_default_for_v5_and_v311() {
    let (b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let (v5, ack) = RawClient::connect_with(addr, persistent_connect("forever-5", u32::MAX)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    assert_eq!(
        ack.properties.session_expiry_interval,
        Some(DAY),
        "the CONNACK tells the client the expiry it got"
    );
    let mut v311 = connect_packet(V311, "forever-311");
    v311.clean_start = false;
    let (v311, ack) = RawClient::connect_with(addr, v311).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    v5.disconnect().await;
    v311.disconnect().await;
    assert!(wait_until(WAIT, || b.connection_count() == 0).await);
    assert_eq!(b.persistent_session_count(), 2);

    clock.advance(Duration::from_secs(u64::from(DAY) - 60));
    assert!(b.has_session("forever-5") && b.has_session("forever-311"));
    clock.advance(Duration::from_secs(61));
    assert!(
        wait_until(WAIT, || !b.has_session("forever-5")
            && !b.has_session("forever-311"))
        .await,
        "both expired after a day"
    );
    assert_eq!(b.persistent_session_count(), 0);
}

#[tokio::test]
async fn new_persistent_sessions_over_the_cap_get_0x97_and_v311_return_code_3() {
    let cfg = BrokerConfig {
        max_persistent_sessions: 2,
        ..Default::default()
    };
    let (b, addr) = start_broker(cfg).await;
    let (a, _) = RawClient::connect_with(addr, persistent_connect("a", 60)).await;
    let (_b2, ack) = RawClient::connect_with(addr, persistent_connect("b", 60)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);

    let (mut c, ack) = RawClient::connect_with(addr, persistent_connect("c", 60)).await;
    assert_eq!(ack.reason_code, ReasonCode::QUOTA_EXCEEDED);
    c.expect_closed().await;
    let mut v311 = connect_packet(V311, "c311");
    v311.clean_start = false;
    let (mut c, ack) = RawClient::connect_with(addr, v311).await;
    assert_eq!(
        ack.reason_code,
        ReasonCode::SERVER_UNAVAILABLE,
        "3.1.1: return code 3, Server unavailable"
    );
    c.expect_closed().await;
    assert_eq!(
        b.metrics()
            .persistent_sessions_refused
            .load(Ordering::Relaxed),
        2
    );

    // Sessions that end with their connection are not persistent ones.
    let mut clean = RawClient::connect(addr, V5, "clean").await;
    clean.ping().await;
    // Resuming or replacing a persistent session is always allowed.
    drop(a);
    assert!(wait_until(WAIT, || b.connection_count() == 2).await);
    let (a, ack) = RawClient::connect_with(addr, persistent_connect("a", 60)).await;
    assert!(ack.session_present);
    let mut replace = persistent_connect("a", 60);
    replace.clean_start = true;
    let (mut a2, ack) = RawClient::connect_with(addr, replace).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    drop(a);
    // Ending one makes room for a new one.
    a2.send(&Packet::Disconnect(Disconnect {
        session_expiry_interval: Some(0),
        ..Default::default()
    }))
    .await;
    a2.expect_closed().await;
    assert!(wait_until(WAIT, || b.persistent_session_count() == 1).await);
    let (_c, ack) = RawClient::connect_with(addr, persistent_connect("c", 60)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
}

#[tokio::test]
async fn what_all_sessions_queue_together_is_bounded() {
    let cfg = BrokerConfig {
        max_total_queued_messages: 50,
        ..Default::default()
    };
    let (b, addr) = start_broker(cfg).await;
    for i in 0..4 {
        let (mut s, _) =
            RawClient::connect_with(addr, persistent_connect(&format!("off-{i}"), 600)).await;
        s.subscribe("#", opts(QoS::AtLeastOnce)).await;
        s.disconnect().await;
    }
    let mut publisher = RawClient::connect(addr, V5, "flood").await;
    for i in 0..40u32 {
        publisher
            .publish_simple("t", QoS::AtLeastOnce, &i.to_be_bytes())
            .await;
    }
    assert_eq!(b.queued_total().0, 50, "4 sessions x 40 messages, 50 kept");
    let m = b.metrics();
    assert_eq!(m.total_queue_full.load(Ordering::Relaxed), 4 * 40 - 50);
    assert_eq!(m.dropped.load(Ordering::Relaxed), 4 * 40 - 50);

    // A session that reads its queue gives its room back.
    let (mut s, ack) = RawClient::connect_with(addr, persistent_connect("off-0", 600)).await;
    assert!(ack.session_present);
    let mut got = 0;
    while let Event::Packet(Packet::Publish(p)) = s.next_event(QUIET).await {
        s.ack(&p).await;
        got += 1;
    }
    assert!(got > 0);
    assert!(wait_until(WAIT, || b.queued_total().0 == 50 - got).await);
    // And a session that ends gives back what it held.
    let mut end = persistent_connect("off-1", 0);
    end.clean_start = true;
    RawClient::connect_with(addr, end)
        .await
        .0
        .disconnect()
        .await;
    let (messages, bytes) = b.queued_total();
    assert!(
        messages < 50 - got,
        "{messages} messages, {bytes} bytes left"
    );
}
