//! A QoS 1/2 PUBLISH the cluster refused (its append to the message stream timed
//! out: PUBACK/PUBREC 0x80) reaches no subscriber on its own node either, persistent
//! session or not, whatever the copy's QoS: the other nodes never got it, and the
//! publisher's resend is then each subscriber's one copy (docs/decisions/0005, "A
//! refused copy"). Real binary, real redis-server; a proxy drops node a's stream
//! writer's pipelines while the test says, so those appends never land.

mod common;

use std::time::Duration;

use common::cluster::{node, publish_acked};
use common::proxy::Proxy;
use statehub_broker::codec::{Packet, Publish, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, publish, Event, RawClient, V5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Every wait of this test is for something that happens within a few Redis
/// timeouts; this bounds them on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The first command of every pipeline of the MQTT stream writer, which no other
/// Redis client of statehub sends.
const PING: &[u8] = b"$4\r\nPING\r\n";

/// Relays a connection; one that sends a stream writer's pipeline while `stall` is
/// set is cut off from Redis for good: nothing it sends from then on is sent on, so
/// its appends never run and time out.
async fn relay(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_redis, mut to_redis) = upstream.into_split();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        while let Ok(n) = from_redis.read(&mut buf).await {
            if n == 0 || to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 16 << 10];
    let mut cut = false;
    while let Ok(n) = from_client.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        cut = cut || (*stall.borrow() && chunk.windows(PING.len()).any(|w| w == PING));
        if !cut && to_redis.write_all(chunk).await.is_err() {
            break;
        }
    }
}

/// Sends a QoS 1/2 PUBLISH of `payload` on `w/1` without waiting; its packet id.
async fn send(c: &mut RawClient, qos: QoS, payload: &[u8]) -> u16 {
    let id = c.next_packet_id();
    let p = Publish {
        packet_id: Some(id),
        ..publish("w/1", qos, payload)
    };
    c.send(&Packet::Publish(p)).await;
    id
}

/// The reason code of the next PUBACK or PUBREC, waited for as long as the node
/// takes to answer (a held append is refused after the node's timeout).
async fn answer(c: &mut RawClient) -> ReasonCode {
    match c.next_event(PATIENCE).await {
        Event::Packet(Packet::PubAck(a)) => a.reason_code,
        Event::Packet(Packet::PubRec(r)) => r.reason_code,
        other => panic!("expected PUBACK or PUBREC, got {other:?}"),
    }
}

/// Publishes until the cluster accepts it (a refused message reaches nobody).
async fn resend(c: &mut RawClient, qos: QoS, payload: &[u8]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while publish_acked(c, "w/1", qos, payload).await != ReasonCode::SUCCESS {
        assert!(tokio::time::Instant::now() < deadline, "never accepted");
        // The writer reconnects after its timeout; refused until then.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The payloads `c` gets (each acknowledged) up to and including `last`.
async fn until(c: &mut RawClient, last: &str) -> Vec<String> {
    let mut got = Vec::new();
    while got.last().map(String::as_str) != Some(last) {
        let p = c.expect_publish_ack().await;
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_reaches_no_local_subscriber_and_its_resend_arrives_once_everywhere() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port(), relay).await;
    let a = common::start_configured(
        "[cluster]\ntimeout_ms = 2000\n",
        &["--redis", &proxy.url(), "--node-id", "a"],
    );
    let b = node(&redis, "b");
    let (mut kept, _) = RawClient::connect_with(a.mqtt, persistent_connect("kept", 300)).await;
    kept.subscribe("w/#", opts(QoS::AtLeastOnce)).await;
    let mut clean = RawClient::connect(a.mqtt, V5, "clean").await;
    clean.subscribe("w/#", opts(QoS::AtLeastOnce)).await;
    let mut exact = RawClient::connect(a.mqtt, V5, "exact").await;
    exact.subscribe("w/#", opts(QoS::ExactlyOnce)).await;
    let mut remote = RawClient::connect(b.mqtt, V5, "remote").await;
    remote.subscribe("w/#", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(a.mqtt, V5, "publ").await;
    let ok = ReasonCode::SUCCESS;
    assert_eq!(
        publish_acked(&mut publ, "w/1", QoS::AtLeastOnce, b"first").await,
        ok
    );
    for sub in [&mut kept, &mut clean, &mut exact, &mut remote] {
        assert_eq!(until(sub, "first").await, ["first"]);
    }

    proxy.stall.send_replace(true);
    // Both routed on a while their appends are held, then refused.
    send(&mut publ, QoS::AtLeastOnce, b"m1").await;
    send(&mut publ, QoS::ExactlyOnce, b"m2").await;
    assert_ne!(answer(&mut publ).await, ok, "m1's append is held");
    assert_ne!(answer(&mut publ).await, ok, "m2's append is held");
    // A QoS 0 marker goes on locally: a copy of a refused message given would
    // come before it.
    publ.send(&Packet::Publish(publish("w/1", QoS::AtMostOnce, b"marker")))
        .await;
    for (name, sub) in [
        ("kept", &mut kept),
        ("clean", &mut clean),
        ("exact", &mut exact),
    ] {
        assert_eq!(until(sub, "marker").await, ["marker"], "{name}");
    }
    proxy.stall.send_replace(false);

    resend(&mut publ, QoS::AtLeastOnce, b"m1").await;
    resend(&mut publ, QoS::ExactlyOnce, b"m2").await;
    assert_eq!(
        publish_acked(&mut publ, "w/1", QoS::AtLeastOnce, b"after").await,
        ok
    );
    for (name, sub) in [
        ("kept", &mut kept),
        ("clean", &mut clean),
        ("exact", &mut exact),
    ] {
        assert_eq!(until(sub, "after").await, ["m1", "m2", "after"], "{name}");
        sub.expect_nothing(Duration::from_millis(300)).await;
    }
    // b never had the refused ones; the marker is not forwarded while a's writer
    // is cut off, or reaches b late.
    let mut on_b = until(&mut remote, "after").await;
    on_b.retain(|p| p != "marker");
    assert_eq!(on_b, ["m1", "m2", "after"], "remote");
}
