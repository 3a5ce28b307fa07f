//! CONNECT handling: client identifiers, session present, keep alive, takeover,
//! DISCONNECT with a new session expiry, and refusals.

use std::time::{Duration, Instant};

use statehub_broker::codec::{ConnectProperties, Disconnect, Packet, QoS, ReasonCode};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

fn v5_persistent(id: &str, clean_start: bool, expiry: u32) -> statehub_broker::codec::Connect {
    let mut c = connect_packet(V5, id);
    c.clean_start = clean_start;
    c.properties = ConnectProperties {
        session_expiry_interval: Some(expiry),
        ..Default::default()
    };
    c
}

#[tokio::test]
async fn v5_empty_client_id_gets_an_assigned_identifier() {
    let (_b, addr) = start_default().await;
    let (mut c, ack) = RawClient::connect_with(addr, connect_packet(V5, "")).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    let id = ack
        .properties
        .assigned_client_identifier
        .expect("Assigned Client Identifier missing");
    assert!(!id.is_empty());
    // A second anonymous client gets a different one.
    let (_c2, ack2) = RawClient::connect_with(addr, connect_packet(V5, "")).await;
    assert_ne!(ack2.properties.assigned_client_identifier, Some(id));
    c.ping().await;
}

#[tokio::test]
async fn v5_empty_client_id_without_clean_start_is_accepted() {
    let (_b, addr) = start_default().await;
    let mut connect = connect_packet(V5, "");
    connect.clean_start = false;
    let (_c, ack) = RawClient::connect_with(addr, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    assert!(ack.properties.assigned_client_identifier.is_some());
}

#[tokio::test]
async fn v3_empty_client_id_without_clean_session_is_refused_with_return_code_2() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::open(addr, V311).await;
    // CONNECT 3.1.1, flags 0 (no clean session), keep alive 60, client id "".
    c.send_raw(&[
        0x10, 0x0C, 0, 4, b'M', b'Q', b'T', b'T', 4, 0x00, 0, 60, 0, 0,
    ])
    .await;
    match c.next_event(WAIT).await {
        Event::Packet(Packet::ConnAck(ack)) => {
            // The client codec maps 3.1.1 return code 2 to 0x85.
            assert_eq!(ack.reason_code, ReasonCode::CLIENT_IDENTIFIER_NOT_VALID, "{ack:?}");
        }
        other => panic!("[MQTT-3.1.3-8] expected CONNACK with return code 2 (identifier rejected), got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn v3_empty_client_id_with_clean_session_is_accepted() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V311, "").await;
    c.ping().await;
}

#[tokio::test]
async fn session_present_v5() {
    let (_b, addr) = start_default().await;
    let (c, ack) = RawClient::connect_with(addr, v5_persistent("sp5", false, 60)).await;
    assert!(!ack.session_present, "no session existed");
    c.disconnect().await;
    let (c, ack) = RawClient::connect_with(addr, v5_persistent("sp5", false, 60)).await;
    assert!(ack.session_present, "session should have been resumed");
    c.disconnect().await;
    let (_c, ack) = RawClient::connect_with(addr, v5_persistent("sp5", true, 60)).await;
    assert!(!ack.session_present, "clean start discards the session");
}

#[tokio::test]
async fn session_present_v311() {
    let (_b, addr) = start_default().await;
    let mut connect = connect_packet(V311, "sp3");
    connect.clean_start = false;
    let (c, ack) = RawClient::connect_with(addr, connect.clone()).await;
    assert!(!ack.session_present);
    c.disconnect().await;
    let (c, ack) = RawClient::connect_with(addr, connect.clone()).await;
    assert!(ack.session_present);
    c.disconnect().await;
    connect.clean_start = true;
    let (_c, ack) = RawClient::connect_with(addr, connect).await;
    assert!(!ack.session_present);
}

#[tokio::test]
async fn keep_alive_timeout_disconnects_with_0x8d() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut connect = connect_packet(V5, "ka");
    connect.keep_alive = 10;
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    // The server allows 1.5 x keep alive: 15 s.
    clock.advance(Duration::from_secs(14));
    c.expect_nothing(QUIET).await;
    clock.advance(Duration::from_secs(2));
    c.expect_disconnect(ReasonCode::KEEP_ALIVE_TIMEOUT).await;
}

#[tokio::test]
async fn keep_alive_timeout_v311_closes() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut connect = connect_packet(V311, "ka3");
    connect.keep_alive = 10;
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    clock.advance(Duration::from_secs(16));
    c.expect_closed().await;
}

#[tokio::test]
async fn pings_keep_the_connection_alive() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut connect = connect_packet(V5, "ka-ping");
    connect.keep_alive = 10;
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    // 50 s in all, never more than 10 s between packets.
    for _ in 0..5 {
        clock.advance(Duration::from_secs(10));
        c.ping().await;
    }
}

#[tokio::test]
async fn server_keep_alive_when_configured() {
    let cfg = BrokerConfig {
        max_keep_alive: 5,
        keep_alive_zero_allowed: false,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let (_c, ack) = RawClient::connect_with(addr, connect_packet(V5, "ska1")).await;
    assert_eq!(
        ack.properties.server_keep_alive,
        Some(5),
        "client asked 60 > max 5"
    );
    let mut small = connect_packet(V5, "ska2");
    small.keep_alive = 3;
    let (_c, ack) = RawClient::connect_with(addr, small).await;
    assert_eq!(
        ack.properties.server_keep_alive, None,
        "3 is within the maximum"
    );
    let mut zero = connect_packet(V5, "ska3");
    zero.keep_alive = 0;
    let (_c, ack) = RawClient::connect_with(addr, zero).await;
    assert_eq!(
        ack.properties.server_keep_alive,
        Some(5),
        "0 is not allowed here"
    );

    let (_b, addr) = start_default().await;
    let (_c, ack) = RawClient::connect_with(addr, connect_packet(V5, "ska4")).await;
    assert_eq!(
        ack.properties.server_keep_alive, None,
        "no maximum configured"
    );
}

#[tokio::test]
async fn server_keep_alive_is_enforced() {
    let cfg = BrokerConfig {
        max_keep_alive: 1,
        ..Default::default()
    };
    let (_b, addr, clock) = start_with_clock(cfg).await;
    let (mut c, ack) = RawClient::connect_with(addr, connect_packet(V5, "ska-enf")).await;
    assert_eq!(ack.properties.server_keep_alive, Some(1));
    clock.advance(Duration::from_secs(2));
    c.expect_disconnect(ReasonCode::KEEP_ALIVE_TIMEOUT).await;
}

#[tokio::test]
async fn session_takeover_disconnects_the_old_connection_with_0x8e() {
    let (_b, addr) = start_default().await;
    let mut old = RawClient::connect(addr, V5, "takeover").await;
    let mut new = RawClient::connect(addr, V5, "takeover").await;
    old.expect_disconnect(ReasonCode::SESSION_TAKEN_OVER).await;
    new.ping().await;
}

#[tokio::test]
async fn session_takeover_keeps_subscriptions_without_clean_start() {
    let (_b, addr) = start_default().await;
    let (mut old, _) = RawClient::connect_with(addr, v5_persistent("takeover2", true, 60)).await;
    old.subscribe("to/old", opts(QoS::AtLeastOnce)).await;
    let (mut new, ack) = RawClient::connect_with(addr, v5_persistent("takeover2", false, 60)).await;
    assert!(ack.session_present);
    old.expect_disconnect(ReasonCode::SESSION_TAKEN_OVER).await;
    let mut p = RawClient::connect(addr, V5, "takeover2-pub").await;
    p.publish_simple("to/old", QoS::AtLeastOnce, b"hi").await;
    let got = new.expect_publish_ack().await;
    assert_eq!(&got.payload[..], b"hi");
}

#[tokio::test]
async fn disconnect_can_shorten_session_expiry_to_zero() {
    let (b, addr) = start_default().await;
    let (mut c, _) = RawClient::connect_with(addr, v5_persistent("dse", true, 60)).await;
    c.subscribe("x", opts(QoS::AtLeastOnce)).await;
    let d = Disconnect {
        session_expiry_interval: Some(0),
        ..Default::default()
    };
    c.send(&Packet::Disconnect(d)).await;
    c.expect_closed().await;
    assert!(wait_until(WAIT, || !b.has_session("dse")).await);
    let (_c, ack) = RawClient::connect_with(addr, v5_persistent("dse", false, 60)).await;
    assert!(
        !ack.session_present,
        "DISCONNECT set the session expiry to 0: the session must be gone"
    );
}

#[tokio::test]
async fn disconnect_can_change_session_expiry() {
    let (b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let (c, _) = RawClient::connect_with(addr, v5_persistent("dse1", true, 60)).await;
    let mut c = c;
    let d = Disconnect {
        session_expiry_interval: Some(10),
        ..Default::default()
    };
    c.send(&Packet::Disconnect(d)).await;
    c.expect_closed().await;
    assert!(wait_until(WAIT, || b.connection_count() == 0).await);
    clock.advance(Duration::from_secs(11));
    assert!(wait_until(WAIT, || !b.has_session("dse1")).await);
    let (_c, ack) = RawClient::connect_with(addr, v5_persistent("dse1", false, 60)).await;
    assert!(
        !ack.session_present,
        "the session expiry from DISCONNECT (10 s) had passed"
    );
}

#[tokio::test]
async fn disconnect_setting_expiry_after_zero_is_a_protocol_error() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "dse0").await;
    let d = Disconnect {
        session_expiry_interval: Some(30),
        ..Default::default()
    };
    c.send(&Packet::Disconnect(d)).await;
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn second_connect_is_a_protocol_error() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "twice").await;
    c.send(&Packet::Connect(Box::new(connect_packet(V5, "twice"))))
        .await;
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn second_connect_v311_closes() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V311, "twice3").await;
    c.send(&Packet::Connect(Box::new(connect_packet(V311, "twice3"))))
        .await;
    c.expect_closed().await;
}

#[tokio::test]
async fn first_packet_not_connect_closes() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::open(addr, V5).await;
    c.send_raw(&[0xC0, 0x00]).await; // PINGREQ
    c.expect_closed().await;

    let mut c = RawClient::open(addr, V5).await;
    c.send(&Packet::Publish(publish("a/b", QoS::AtMostOnce, b"x")))
        .await;
    c.expect_closed().await;
}

#[tokio::test]
async fn unsupported_protocol_level_5_plus_gets_0x84() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::open(addr, V5).await;
    // "MQTT" level 6, clean start, keep alive 60, no properties, client id "a".
    c.send_raw(&[
        0x10, 0x0E, 0, 4, b'M', b'Q', b'T', b'T', 6, 0x02, 0, 60, 0, 0, 1, b'a',
    ])
    .await;
    match c.expect().await {
        Packet::ConnAck(ack) => {
            assert_eq!(ack.reason_code, ReasonCode::UNSUPPORTED_PROTOCOL_VERSION)
        }
        other => panic!("expected CONNACK 0x84, got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn unsupported_protocol_level_below_4_gets_return_code_1() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::open(addr, V311).await;
    // "MQTT" level 2, clean session, keep alive 60, client id "a".
    c.send_raw(&[
        0x10, 0x0D, 0, 4, b'M', b'Q', b'T', b'T', 2, 0x02, 0, 60, 0, 1, b'a',
    ])
    .await;
    let mut raw = [0u8; 8];
    let n = tokio::time::timeout(WAIT, tokio::io::AsyncReadExt::read(&mut c.stream, &mut raw))
        .await
        .expect("no answer")
        .expect("read");
    assert_eq!(
        &raw[..n],
        &[0x20, 0x02, 0x00, 0x01],
        "3.1.1 CONNACK with return code 1"
    );
    c.expect_closed().await;
}

#[tokio::test]
async fn no_connect_within_the_connect_timeout_closes() {
    let cfg = BrokerConfig {
        connect_timeout_secs: 1,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let mut c = RawClient::open(addr, V5).await;
    let start = Instant::now();
    c.expect_closed().await;
    assert!(start.elapsed() >= Duration::from_millis(800));
}

#[tokio::test]
async fn response_information_when_requested() {
    let (_b, addr) = start_default().await;
    let mut c = connect_packet(V5, "rri");
    c.properties.request_response_information = Some(true);
    let (_c, ack) = RawClient::connect_with(addr, c).await;
    assert!(ack
        .properties
        .response_information
        .is_some_and(|r| !r.is_empty()));
    let (_c, ack) = RawClient::connect_with(addr, connect_packet(V5, "no-rri")).await;
    assert_eq!(ack.properties.response_information, None);
}

#[tokio::test]
async fn server_disconnect_respects_the_client_maximum_packet_size() {
    // [MQTT-3.14.2-3]: no Reason String if it would make the DISCONNECT larger than
    // the client's Maximum Packet Size.
    let (_b, addr) = start_default().await;
    let mut connect = connect_packet(V5, "tiny");
    connect.keep_alive = 1;
    connect.properties.maximum_packet_size = Some(16);
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    let d = c
        .expect_disconnect_within(ReasonCode::KEEP_ALIVE_TIMEOUT, Duration::from_millis(2500))
        .await;
    let mut wire = bytes::BytesMut::new();
    c.codec
        .encode(&Packet::Disconnect(d.clone()), &mut wire)
        .unwrap();
    assert!(
        wire.len() <= 16,
        "DISCONNECT of {} bytes sent to a client with Maximum Packet Size 16: {d:?}",
        wire.len()
    );
}

#[tokio::test]
async fn connections_over_the_limit_get_connack_0x97() {
    let (_broker, addr) = start_broker(BrokerConfig {
        max_connections: 1,
        ..Default::default()
    })
    .await;
    let _first = RawClient::connect(addr, V5, "limit-1").await;
    let (mut second, ack) = RawClient::connect_with(addr, connect_packet(V5, "limit-2")).await;
    assert_eq!(ack.reason_code, ReasonCode::QUOTA_EXCEEDED);
    second.expect_closed().await;
    let (mut v3, ack) = RawClient::connect_with(addr, connect_packet(V311, "limit-3")).await;
    // 3.1.1 has no 0x97: return code 3, Server unavailable.
    assert_eq!(ack.reason_code, ReasonCode::SERVER_UNAVAILABLE);
    v3.expect_closed().await;
}

/// Shutdown is one token, fanned out: every attached connection, idle or busy, gets
/// DISCONNECT 0x8B; a connection that arrives after it is refused with 0x88.
#[tokio::test]
async fn shutdown_disconnects_every_connection_with_0x8b() {
    let (broker, addr) = start_default().await;
    let mut idle = RawClient::connect(addr, V5, "idle").await;
    let mut subscriber = RawClient::connect(addr, V5, "subscriber").await;
    subscriber.subscribe("load/#", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(addr, V5, "publisher").await;
    // Keep the subscriber's connection busy with deliveries while the token is cancelled.
    for i in 0..50u8 {
        publisher
            .send(&Packet::Publish(publish(
                &format!("load/{i}"),
                QoS::AtMostOnce,
                &[i],
            )))
            .await;
    }
    broker.shutdown_token().cancel();
    for c in [&mut idle, &mut publisher] {
        c.expect_disconnect(ReasonCode::SERVER_SHUTTING_DOWN).await;
    }
    // The subscriber may read some deliveries first; then the DISCONNECT.
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "no DISCONNECT 0x8B for the busy subscriber"
        );
        match subscriber.expect().await {
            Packet::Publish(_) => continue,
            Packet::Disconnect(d) => {
                assert_eq!(d.reason_code, ReasonCode::SERVER_SHUTTING_DOWN);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // The listener has stopped accepting, or refuses during its drain.
    if let Ok(stream) = tokio::net::TcpStream::connect(addr).await {
        let mut late = RawClient::from_stream(stream, V5);
        late.send(&Packet::Connect(Box::new(connect_packet(V5, "late"))))
            .await;
        match late.next_event(WAIT).await {
            Event::Packet(Packet::ConnAck(ack)) => {
                assert_eq!(ack.reason_code, ReasonCode::SERVER_UNAVAILABLE)
            }
            Event::Closed | Event::DecodeError(_) => {}
            other => panic!("a connection after shutdown got {other:?}"),
        }
    }
}
