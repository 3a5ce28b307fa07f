//! Flow control between the nodes' MQTT stream writers and the slowest reader
//! (`cluster.mqtt_reader_lag_limit`, decision 0004): while one node's reader is held
//! back, another node's publishers wait (their PUBACKs are held) rather than append
//! past the stream's trim, so the held node's subscriber gets every acknowledged
//! message once its reader reads again; a reader that makes no progress for the node
//! TTL is not waited for. The held node's Redis link is a proxy in these tests that
//! holds the MQTT stream reader's connection (the one that sends `XREAD` on the
//! message stream) and nothing else.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::Server;
use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Every wait of this test is for something that happens within a few Redis
/// timeouts; this bounds them on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);
const N: u16 = 200;
const TOPIC: &str = "lag/t";

fn contains(chunk: &[u8], what: &[u8]) -> bool {
    chunk.windows(what.len()).any(|w| w == what)
}

/// The proxy's relay between a node and redis-server: while `stall` is set, a
/// connection that sends an `XREAD` of the MQTT stream is held: nothing it sends
/// reaches Redis until `stall` is cleared.
async fn relay(client: TcpStream, upstream: TcpStream, mut stall: watch::Receiver<bool>) {
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
    while let Ok(n) = from_client.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let chunk = &buf[..n];
        if contains(chunk, b"XREAD") && contains(chunk, b"mqtt:feed") {
            while *stall.borrow_and_update() {
                if stall.changed().await.is_err() {
                    return;
                }
            }
        }
        if to_redis.write_all(chunk).await.is_err() {
            return;
        }
    }
}

/// Nodes `a` (on Redis directly) and `b` (through `proxy`) with a 50-entry stream and
/// `settings` besides.
fn nodes(redis: &RedisServer, proxy: &Proxy, settings: &str) -> (Server, Server) {
    let toml = format!("[cluster]\nmqtt_stream_len = 50\n{settings}\n");
    // b first: a finds it in the groups hash as it starts.
    let b = common::start_configured(&toml, &["--redis", &proxy.url(), "--node-id", "b"]);
    let a = common::start_configured(&toml, &["--redis", &redis.url(), "--node-id", "a"]);
    (a, b)
}

/// A subscriber on `b` that got a first message from `a` (both readers are reading).
async fn subscribed(a: &Server, b: &Server) -> (RawClient, RawClient) {
    let mut sub = RawClient::connect(b.mqtt, V5, "slow-sub").await;
    sub.subscribe(TOPIC, opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "publisher").await;
    let id = publisher.next_packet_id();
    let mut p = publish(TOPIC, QoS::AtLeastOnce, b"warm-up");
    p.packet_id = Some(id);
    publisher.send(&Packet::Publish(p)).await;
    publisher
        .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
    let got = sub.expect_within(PATIENCE).await;
    assert!(
        matches!(&got, Packet::Publish(p) if &p.payload[..] == b"warm-up"),
        "{got:?}"
    );
    if let Packet::Publish(p) = got {
        sub.ack(&p).await;
    }
    (publisher, sub)
}

/// Sends QoS 1 PUBLISHes 1..=N without waiting, then counts their PUBACKs (each
/// Success) in a task: the count, and the task.
async fn publish_all(mut publisher: RawClient) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    for i in 1..=N {
        let mut p = publish(TOPIC, QoS::AtLeastOnce, i.to_string().as_bytes());
        p.packet_id = Some(1000 + i);
        publisher.send(&Packet::Publish(p)).await;
    }
    let acked = Arc::new(AtomicUsize::new(0));
    let count = acked.clone();
    let task = tokio::spawn(async move {
        for _ in 0..N {
            match publisher.expect_within(PATIENCE).await {
                Packet::PubAck(a) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
                other => panic!("expected PUBACK, got {other:?}"),
            }
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    (acked, task)
}

/// Waits until `done` holds, polling.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// With b's reader held, a's publisher's 200 QoS 1 messages (4 times the stream's
/// length) wait at a's writer; once b reads again its subscriber gets all 200 in
/// order, and b counted no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_reader_holds_the_other_nodes_publishers_and_loses_nothing() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port(), relay).await;
    // The held reader stays live for the whole test.
    let (a, b) = nodes(
        &redis,
        &proxy,
        "mqtt_reader_lag_limit = 20\nmqtt_node_ttl_ms = 60000",
    );
    let (publisher, mut sub) = subscribed(&a, &b).await;

    proxy.stall.send_replace(true);
    let (acked, acks) = publish_all(publisher).await;
    until("a's writer holds, or every message is acknowledged", || {
        common::metric(a.http, "statehub_cluster_mqtt_writer_held") >= 1.0
            || acked.load(Ordering::Relaxed) == usize::from(N)
    })
    .await;
    assert!(
        acked.load(Ordering::Relaxed) < usize::from(N),
        "publishers wait while b's reader is held"
    );
    proxy.stall.send_replace(false);

    for i in 1..=N {
        let p = match sub.expect_within(PATIENCE).await {
            Packet::Publish(p) => p,
            other => panic!("expected message {i}, got {other:?}"),
        };
        assert_eq!(String::from_utf8_lossy(&p.payload), i.to_string());
        sub.ack(&p).await;
    }
    acks.await.unwrap();
    assert_eq!(
        common::metric(b.http, "statehub_cluster_mqtt_stream_gaps"),
        0.0
    );
}

/// With b's reader held for good, a's publishers wait at most until b's position lapses
/// (the node TTL): then all 200 messages are acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_stuck_past_the_node_ttl_is_not_waited_for() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port(), relay).await;
    let (a, b) = nodes(
        &redis,
        &proxy,
        "mqtt_reader_lag_limit = 20\nmqtt_node_ttl_ms = 1000",
    );
    let (publisher, _sub) = subscribed(&a, &b).await;

    proxy.stall.send_replace(true);
    let (acked, acks) = publish_all(publisher).await;
    acks.await.unwrap();
    assert_eq!(acked.load(Ordering::Relaxed), usize::from(N));
    drop(b);
}
