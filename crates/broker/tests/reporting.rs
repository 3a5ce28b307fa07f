//! What the broker tells and what it counts: no problem information for a client that
//! asked for none, every outbound packet it cannot encode and every message dropped
//! for its expiry counted (and logged), a packet left half-sent closed in time.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use statehub_broker::codec::{
    ConnectProperties, Packet, Publish, PublishProperties, QoS, ReasonCode,
};
use statehub_broker::{BrokerConfig, Message};
use statehub_test_support::*;

#[tokio::test]
async fn request_problem_information_0_gets_no_reason_string() {
    let (_broker, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let connect = |id: &str, problem_info: Option<bool>| {
        let mut c = connect_packet(V5, id);
        c.keep_alive = 1;
        c.properties = ConnectProperties {
            request_problem_information: problem_info,
            ..Default::default()
        };
        c
    };
    let (mut quiet, _) = RawClient::connect_with(addr, connect("quiet", Some(false))).await;
    let (mut told, _) = RawClient::connect_with(addr, connect("told", None)).await;
    // Past the keep alive (1.5 x 1 s): the server closes both.
    clock.advance(Duration::from_secs(2));
    let d = quiet
        .expect_disconnect(ReasonCode::KEEP_ALIVE_TIMEOUT)
        .await;
    assert_eq!(d.reason_string, None);
    let d = told.expect_disconnect(ReasonCode::KEEP_ALIVE_TIMEOUT).await;
    assert!(d.reason_string.is_some());
}

#[tokio::test]
async fn an_outbound_publish_that_cannot_be_encoded_is_counted() {
    let (broker, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "all").await;
    c.subscribe("#", opts(QoS::AtMostOnce)).await;
    // A topic longer than a PUBLISH can carry (a service could build one).
    let publish = Publish {
        topic: "t".repeat(70_000).into(),
        payload: bytes::Bytes::from_static(b"x"),
        ..Default::default()
    };
    broker.publish(Message::from_publish(publish, None, Instant::now()));
    let failures = || broker.metrics().encode_failures.load(Ordering::Relaxed);
    assert!(wait_until(WAIT, || failures() == 1).await);
    // The subscriber is fine and gets what can be sent.
    broker.publish(Message::from_publish(
        publish_simple_message("ok"),
        None,
        Instant::now(),
    ));
    assert_eq!(c.expect_publish().await.topic, "ok");
}

fn publish_simple_message(topic: &str) -> Publish {
    publish(topic, QoS::AtMostOnce, b"x")
}

#[tokio::test]
async fn messages_dropped_for_their_expiry_are_counted() {
    let (broker, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut sub = connect_packet(V5, "one-at-a-time");
    sub.properties.receive_maximum = Some(1);
    let (mut sub, _) = RawClient::connect_with(addr, sub).await;
    sub.subscribe("exp/t", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(addr, V5, "exp-pub").await;
    publisher
        .publish_simple("exp/t", QoS::AtLeastOnce, b"first")
        .await;
    let first = sub.expect_publish().await;
    // Queued behind the unacknowledged first one, and expired by the time it could go.
    let second = Publish {
        properties: PublishProperties {
            message_expiry_interval: Some(1),
            ..Default::default()
        },
        ..publish("exp/t", QoS::AtLeastOnce, b"second")
    };
    publisher.publish(second).await;
    clock.advance(Duration::from_secs(2));
    sub.ack(&first).await;
    sub.expect_nothing(QUIET).await;
    assert_eq!(broker.metrics().expired_dropped.load(Ordering::Relaxed), 1);
}

/// With keep alive 0, a PUBLISH stopped half-way used to hold its connection and its
/// buffer for ever; one trickled a byte at a time kept a keep alive from firing.
#[tokio::test]
async fn a_packet_not_completed_in_time_closes_the_connection() {
    let (broker, addr, clock) = start_with_clock(BrokerConfig {
        packet_read_timeout_secs: 10,
        ..Default::default()
    })
    .await;
    let mut c = connect_packet(V5, "half");
    c.keep_alive = 0;
    let (mut half, _) = RawClient::connect_with(addr, c).await;
    // PUBLISH QoS 0, remaining length 1000: the header and a few bytes.
    half.send_raw(&[0x30, 0xE8, 0x07, 0x00, 0x01, b't', 0x00, b'x'])
        .await;
    // The deadline runs from when the server read the bytes: move time until it
    // passes.
    let mut moved = 0;
    let d = loop {
        clock.advance(Duration::from_secs(11));
        moved += 1;
        match half.next_event(QUIET).await {
            Event::Timeout if moved < 20 => {}
            Event::Packet(Packet::Disconnect(d)) => break d,
            other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
        }
    };
    assert_eq!(d.reason_code, ReasonCode::KEEP_ALIVE_TIMEOUT);

    let mut c = connect_packet(V5, "trickle");
    c.keep_alive = 60;
    let (mut trickle, _) = RawClient::connect_with(addr, c).await;
    trickle.send_raw(&[0x30, 0xE8, 0x07]).await;
    let mut sent = 0;
    let d = loop {
        trickle.send_raw(&[0x00]).await;
        clock.advance(Duration::from_secs(2));
        sent += 1;
        match trickle.next_event(Duration::from_millis(100)).await {
            Event::Timeout if sent < 100 => {}
            Event::Packet(Packet::Disconnect(d)) => break d,
            other => panic!("expected DISCONNECT 0x8D, got {other:?}"),
        }
    };
    assert_eq!(d.reason_code, ReasonCode::KEEP_ALIVE_TIMEOUT);
    let timeouts = broker
        .metrics()
        .packet_read_timeouts
        .load(Ordering::Relaxed);
    assert_eq!(timeouts, 2);

    // Whole packets, however far apart, are fine.
    let mut steady = RawClient::connect(addr, V5, "steady").await;
    for _ in 0..3 {
        clock.advance(Duration::from_secs(11));
        steady.ping().await;
    }
}
