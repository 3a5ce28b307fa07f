//! Attacks any anonymous MQTT client can make, against the real binary: the server
//! must stay up and keep serving everyone else.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{start_configured, Server};
use statehub_broker::codec::{Packet, Publish, PublishProperties, QoS, ReasonCode, Subscribe};
use statehub_test_support::{
    bs, connect_packet, opts, persistent_connect, publish, Event, RawClient, V5,
};

/// The process is up and a new client is served (CONNACK, a PUBLISH round trip).
async fn assert_serving(server: &mut Server, what: &str) {
    assert!(
        matches!(server.child.try_wait(), Ok(None)),
        "statehub exited after {what}"
    );
    let mut c = RawClient::connect(server.mqtt, V5, "probe").await;
    c.subscribe("probe/t", opts(QoS::AtLeastOnce)).await;
    c.publish_simple("probe/t", QoS::AtLeastOnce, b"ok").await;
    assert_eq!(
        &c.expect_publish_ack().await.payload[..],
        b"ok",
        "after {what}"
    );
    c.disconnect().await;
}

/// A filter of 10,000 levels (`a/a/…/a/#`, 20 KB) and a topic of 10,000 levels: the
/// subscription and retained indexes used to recurse once per level and overflowed
/// the worker's stack, aborting the process, on the matching PUBLISH, on UNSUBSCRIBE
/// and when the session ended (disconnect, or expiry on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_level_filters_and_topics_are_served() {
    let mut server = start_configured("[mqtt]\nmax_topic_levels = 20000\n", &[]);
    let filter = format!("{}#", "a/".repeat(10_000));
    let topic = format!("{}a", "a/".repeat(9_999));
    let mut sub = RawClient::connect(server.mqtt, V5, "deep-sub").await;
    let ack = sub.subscribe(&filter, opts(QoS::AtLeastOnce)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_1]);
    assert_serving(&mut server, "SUBSCRIBE").await;

    let mut publisher = RawClient::connect(server.mqtt, V5, "deep-pub").await;
    let code = publisher
        .publish_simple(&topic, QoS::AtLeastOnce, b"deep")
        .await;
    assert_eq!(code, ReasonCode::SUCCESS);
    let got = sub.expect_publish_ack().await;
    assert_eq!(got.topic, topic);
    assert_serving(&mut server, "PUBLISH").await;

    assert_eq!(
        sub.unsubscribe(&[&filter]).await.reason_codes,
        [ReasonCode::SUCCESS]
    );
    assert_serving(&mut server, "UNSUBSCRIBE").await;

    // Retained on the deep topic: found by a wildcard filter, then cleared.
    let retained = Publish {
        retain: true,
        ..publish(&topic, QoS::AtLeastOnce, b"kept")
    };
    publisher.publish(retained).await;
    sub.subscribe("a/#", opts(QoS::AtLeastOnce)).await;
    assert_eq!(&sub.expect_publish_ack().await.payload[..], b"kept");
    let clear = Publish {
        retain: true,
        ..publish(&topic, QoS::AtLeastOnce, b"")
    };
    publisher.publish(clear).await;
    assert_serving(&mut server, "clearing a deep retained message").await;

    // The session ends with the deep subscription in it: by disconnect, then by
    // expiry.
    sub.subscribe(&filter, opts(QoS::AtLeastOnce)).await;
    // The deep message cleared above may still be on its way to `sub`: wait for the
    // close itself (`disconnect` returns at the first packet), so the session has ended
    // before the same client id connects again.
    sub.send(&Packet::Disconnect(Default::default())).await;
    while let Event::Packet(_) = sub.next_event(Duration::from_secs(3)).await {}
    drop(sub);
    let (again, ack) =
        RawClient::connect_with(server.mqtt, persistent_connect("deep-sub", 1)).await;
    assert!(!ack.session_present, "the session did not end");
    let mut again = again;
    again.subscribe(&filter, opts(QoS::AtLeastOnce)).await;
    again.disconnect().await;
    assert_serving(&mut server, "the session's end").await;
    // Expiry: each look resumes the session (and starts its second again), so look
    // less often than it expires.
    let mut expired = false;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let (c, ack) =
            RawClient::connect_with(server.mqtt, persistent_connect("deep-sub", 0)).await;
        c.disconnect().await;
        if !ack.session_present {
            expired = true;
            break;
        }
    }
    assert!(expired, "the session never expired");
    assert_serving(&mut server, "the session's expiry").await;
}

/// One SUBSCRIBE of many wildcard filters, each of which walks every retained topic
/// (`+/x{i}` over 10,000 retained topics `t{j}/y`), keeps its worker busy for a long
/// time; the other connections of that worker (there is one worker here) must be
/// served meanwhile: a new client gets its CONNACK before that SUBACK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_subscribe_does_not_hold_up_other_connections() {
    let mut server = start_configured(
        "mqtt_threads = 1\n[mqtt]\nmax_filters_per_subscribe = 5000\n\
         max_subscriptions_per_client = 5000\n",
        &[],
    );
    let mut publisher = RawClient::connect(server.mqtt, V5, "filler").await;
    for j in 0..10_000 {
        let p = Publish {
            retain: true,
            ..publish(&format!("t{j}/y"), QoS::AtMostOnce, b"r")
        };
        publisher.send(&Packet::Publish(p)).await;
    }
    publisher.ping().await;

    let mut heavy = RawClient::connect(server.mqtt, V5, "heavy").await;
    let filters = (0..1000)
        .map(|i| (bs(&format!("+/x{i}")), opts(QoS::AtMostOnce)))
        .collect();
    heavy
        .send(&Packet::Subscribe(Subscribe {
            packet_id: 1,
            filters,
            ..Default::default()
        }))
        .await;
    let subacked = Arc::new(AtomicBool::new(false));
    let done = subacked.clone();
    let waiter = tokio::spawn(async move {
        let ack = heavy.expect_within(Duration::from_secs(120)).await;
        done.store(true, Ordering::SeqCst);
        ack
    });
    // Time for the worker to start on the SUBSCRIBE.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = RawClient::connect(server.mqtt, V5, "meanwhile").await;
    assert!(
        !subacked.load(Ordering::SeqCst),
        "the SUBACK came first: the new client waited for the whole SUBSCRIBE"
    );
    other.disconnect().await;
    let ack = waiter.await.unwrap();
    assert!(matches!(ack, Packet::SubAck(a) if a.reason_codes.len() == 1000));
    assert_serving(&mut server, "the heavy SUBSCRIBE").await;
}

/// With `max_connections = 50`, 60 sockets that never send CONNECT used to take every
/// place, and a real client got CONNACK 0x97. They do not count until CONNECT now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_do_not_lock_out_real_clients() {
    let mut server = start_configured("[mqtt]\nmax_connections = 50\n", &[]);
    let mut silent = Vec::new();
    for _ in 0..60 {
        silent.push(tokio::net::TcpStream::connect(server.mqtt).await.unwrap());
    }
    let (c, ack) = RawClient::connect_with(server.mqtt, connect_packet(V5, "real")).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    c.disconnect().await;
    assert_serving(&mut server, "60 silent sockets").await;
    drop(silent);
}

/// A state store request with a reserved Response Topic gets DISCONNECT 0x82; it used
/// to log a line at INFO every time, which any client can repeat at will.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserved_response_topics_do_not_flood_the_log() {
    let server = start_configured("", &[]);
    for i in 0..3 {
        let mut c = RawClient::connect(server.mqtt, V5, &format!("reserved-{i}")).await;
        let request = Publish {
            properties: PublishProperties {
                response_topic: Some(bs(
                    "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x",
                )),
                correlation_data: Some(bytes::Bytes::from_static(b"1")),
                ..Default::default()
            },
            ..publish(
                "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke",
                QoS::AtLeastOnce,
                b"*1\r\n$4\r\nPING\r\n",
            )
        };
        c.send(&Packet::Publish(request)).await;
        // The PUBACK, then the DISCONNECT.
        assert!(matches!(c.expect().await, Packet::PubAck(_)));
        c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
    }
    // The log is read by a thread: take what it has until it goes quiet.
    let mut lines = Vec::new();
    while let Ok(line) = server.log.recv_timeout(Duration::from_millis(500)) {
        lines.push(line);
    }
    let logged = lines
        .iter()
        .filter(|l| l.contains("reserved Response Topic"))
        .count();
    assert!(
        logged <= 1,
        "logged {logged} times at INFO:\n{}",
        lines.join("\n")
    );
}
