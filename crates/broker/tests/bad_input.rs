//! Hostile and broken input over raw TCP: garbage, bad lengths, oversize packets,
//! invalid UTF-8, QoS 3. The broker must answer or close quickly, never hang, and
//! keep serving everyone else. Ends with a proptest throwing arbitrary bytes.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_broker::Broker;
use statehub_test_support::*;

/// A fresh client can still connect, subscribe and get its own message.
async fn assert_healthy(addr: std::net::SocketAddr, id: &str) {
    let mut c = RawClient::connect(addr, V5, id).await;
    c.subscribe("health/t", opts(QoS::AtLeastOnce)).await;
    assert_eq!(
        c.publish_simple("health/t", QoS::AtLeastOnce, b"ok").await,
        ReasonCode::SUCCESS
    );
    assert_eq!(&c.expect_publish_ack().await.payload[..], b"ok");
    c.disconnect().await;
}

/// After a close, the server's connection task must finish (no leak, no panic:
/// a panicking task never decrements the count).
async fn assert_connections_drain(broker: &Broker) {
    let ok = wait_until(Duration::from_secs(3), || broker.connection_count() == 0).await;
    assert!(
        ok,
        "connection tasks did not finish: {} open",
        broker.connection_count()
    );
}

#[tokio::test]
async fn garbage_instead_of_connect_is_closed() {
    let (broker, addr) = start_default().await;
    let inputs: [&[u8]; 5] = [
        &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0x10, 0x05, b'a', b'b', b'c', b'd', b'e'],
        &[0x10, 0x0C, 0, 4, b'X', b'Q', b'T', b'T', 4, 2, 0, 60, 0, 0],
        &[0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F],
    ];
    for input in inputs {
        let mut c = RawClient::open(addr, V5).await;
        c.try_send_raw(input).await;
        match c.next_event(WAIT).await {
            Event::Closed => {}
            // A CONNACK refusal before the close is fine too.
            Event::Packet(Packet::ConnAck(a)) if !a.reason_code.is_success() => {
                c.expect_closed().await
            }
            other => panic!("input {input:02X?}: expected close, got {other:?}"),
        }
    }
    assert_connections_drain(&broker).await;
    assert_healthy(addr, "after-garbage").await;
}

#[tokio::test]
async fn bad_remaining_length_is_malformed() {
    let (broker, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "badlen").await;
    // Five-byte Remaining Length: the varint may have at most four.
    c.send_raw(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]).await;
    c.expect_disconnect(ReasonCode::MALFORMED_PACKET).await;
    // A Remaining Length shorter than the fields it must hold.
    let mut c = RawClient::connect(addr, V5, "badlen2").await;
    c.send_raw(&[0x82, 0x02, 0x00, 0x01]).await; // SUBSCRIBE with no properties and no filter
    match c.next_event(WAIT).await {
        Event::Packet(Packet::Disconnect(d)) => assert!(d.reason_code.0 >= 0x80, "{d:?}"),
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    c.expect_closed().await;
    drop(c);
    assert_connections_drain(&broker).await;
}

#[tokio::test]
async fn oversize_packet_is_refused_with_0x95_without_waiting_for_the_body() {
    let (broker, addr) = start_default().await; // 1 MB limit
    let (mut c, ack) = RawClient::connect_with(addr, connect_packet(V5, "big")).await;
    assert_eq!(ack.properties.maximum_packet_size, Some(1024 * 1024));
    // PUBLISH announcing 10 MB, then only a few bytes.
    let mut header = vec![0x30];
    let mut n: u32 = 10 * 1024 * 1024;
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 0x80;
        }
        header.push(b);
        if n == 0 {
            break;
        }
    }
    header.extend_from_slice(&[0, 1, b'a', 0]);
    let start = Instant::now();
    c.send_raw(&header).await;
    c.expect_disconnect_within(ReasonCode::PACKET_TOO_LARGE, Duration::from_secs(1))
        .await;
    assert!(start.elapsed() < Duration::from_secs(2));
    drop(c);
    assert_connections_drain(&broker).await;
}

#[tokio::test]
async fn oversize_connect_is_closed() {
    let cfg = statehub_broker::BrokerConfig {
        max_packet_size: 1024,
        ..Default::default()
    };
    let (broker, addr) = start_broker(cfg).await;
    let mut connect = connect_packet(V5, "bigconnect");
    connect.properties.user_properties = vec![(bs("k"), bs(&"v".repeat(4000)))];
    let mut c = RawClient::open(addr, V5).await;
    c.send(&Packet::Connect(Box::new(connect))).await;
    match c.next_event(WAIT).await {
        Event::Closed => {}
        Event::Packet(Packet::ConnAck(a)) if a.reason_code == ReasonCode::PACKET_TOO_LARGE => {
            c.expect_closed().await
        }
        other => panic!("expected close (or CONNACK 0x95), got {other:?}"),
    }
    drop(c);
    assert_connections_drain(&broker).await;
}

#[tokio::test]
async fn invalid_utf8_topic_v5_is_malformed_0x81() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "utf8v5").await;
    c.send_raw(&[0x30, 7, 0, 3, b'a', 0xFF, b'b', 0, b'x'])
        .await;
    c.expect_disconnect(ReasonCode::MALFORMED_PACKET).await;
}

#[tokio::test]
async fn invalid_utf8_topic_v311_closes() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V311, "utf8v3").await;
    c.send_raw(&[0x30, 6, 0, 3, b'a', 0xFF, b'b', b'x']).await;
    c.expect_closed().await;
}

#[tokio::test]
async fn qos_3_publish_closes() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "qos3v5").await;
    c.send_raw(&[0x36, 6, 0, 1, b'a', 0, 1, 0]).await;
    c.expect_disconnect(ReasonCode::MALFORMED_PACKET).await;
    let mut c = RawClient::connect(addr, V311, "qos3v3").await;
    c.send_raw(&[0x36, 5, 0, 1, b'a', 0, 1]).await;
    c.expect_closed().await;
}

#[tokio::test]
async fn wildcard_in_topic_name_is_refused() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "wild").await;
    c.send_raw(&[0x30, 6, 0, 3, b'a', b'/', b'#', 0]).await;
    match c.next_event(WAIT).await {
        Event::Packet(Packet::Disconnect(d)) => {
            assert!(
                matches!(d.reason_code.0, 0x82 | 0x90),
                "expected 0x90 (or 0x82), got {d:?}"
            )
        }
        other => panic!("expected DISCONNECT, got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn server_to_client_packet_from_a_client_is_a_protocol_error() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "connack").await;
    c.send_raw(&[0x20, 3, 0, 0, 0]).await; // CONNACK
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn truncated_packet_then_close_does_not_leak() {
    let (broker, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "trunc").await;
    c.send_raw(&[0x30, 100, 0, 5, b'a']).await; // 95 bytes never come
    c.expect_nothing(QUIET).await;
    drop(c);
    assert_connections_drain(&broker).await;
    assert_healthy(addr, "after-trunc").await;
}

fn first_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        proptest::sample::select(vec![
            0x10u8, 0x20, 0x30, 0x32, 0x34, 0x3D, 0x40, 0x50, 0x62, 0x70, 0x82, 0xA2, 0xC0, 0xE0,
            0xF0
        ]),
    ]
}

#[test]
fn arbitrary_bytes_after_connect_never_take_the_broker_down() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (broker, addr) = rt.block_on(start_default());
    let strategy = (
        any::<bool>(),
        first_byte(),
        proptest::collection::vec(any::<u8>(), 0..300),
    );
    let mut runner = TestRunner::new(Config {
        cases: 48,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let started = Instant::now();
    runner
        .run(&strategy, |(v5, first, rest)| {
            rt.block_on(async {
                let version = if v5 { V5 } else { V311 };
                let mut c = RawClient::connect(addr, version, "fuzz").await;
                let mut bytes = vec![first];
                bytes.extend_from_slice(&rest);
                c.try_send_raw(&bytes).await;
                // Whatever the broker answers, it must not hang: read until it closes
                // or goes quiet, then hang up ourselves.
                let deadline = Instant::now() + Duration::from_millis(300);
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match c.next_event(left).await {
                        Event::Packet(_) => {}
                        Event::Closed | Event::Timeout | Event::DecodeError(_) => break,
                    }
                }
                drop(c);
                assert_connections_drain(&broker).await;
                assert_healthy(addr, "fuzz-health").await;
                assert_connections_drain(&broker).await;
            });
            Ok(())
        })
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(60));
}
