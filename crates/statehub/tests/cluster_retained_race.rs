//! Two nodes changing one topic's retained message at about the same time, while Redis
//! answers (decision 0004, "Retained changes in stream order"): each change takes effect
//! on its own node at once, and once both are in the stream every node holds the one
//! the stream ordered last, which is what Redis's hash holds.

mod common;

use common::cluster::{publish_acked, Pair};
use common::lag::{head_and_position, until, PATIENCE};
use common::Server;
use statehub_broker::codec::{Packet, Publish, QoS, ReasonCode};
use statehub_test_support::{opts, publish, RawClient, V5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

fn contains(chunk: &[u8], what: &[u8]) -> bool {
    chunk.windows(what.len()).any(|w| w == what)
}

/// The relay of node a's Redis connections: while `stall` is set, what a connection
/// sends that writes the retained hash (a's writer appending a retained change) is
/// held, and everything after it on that connection.
async fn hold_retained(client: TcpStream, upstream: TcpStream, mut stall: watch::Receiver<bool>) {
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
        if contains(chunk, b"mqtt:retained") && !contains(chunk, b"HGETALL") {
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

/// The retained message a new subscriber to `topic` on `node` gets.
async fn retained_on(node: &Server, id: &str, topic: &str) -> String {
    let mut c = RawClient::connect(node.mqtt, V5, id).await;
    c.subscribe(topic, opts(QoS::AtLeastOnce)).await;
    let Packet::Publish(p) = c.expect_within(PATIENCE).await else {
        panic!("expected the retained message");
    };
    assert!(p.retain);
    c.ack(&p).await;
    String::from_utf8_lossy(&p.payload).into_owned()
}

/// A sets `rt/race` (its append held at the proxy), B sets it after and its append
/// lands first, A's reader reads B's entry; then A's append lands. The stream and the
/// hash end with A's: new subscribers on both nodes get A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retained_changes_end_in_stream_order_on_every_node() {
    // A held append must not time out: it would take the outage path.
    let pair = Pair::builder()
        .both("timeout_ms = 30000")
        .start(hold_retained)
        .await;
    let (a, b, redis) = (&pair.a, &pair.b, &pair.redis);
    let mut on_a = RawClient::connect(a.mqtt, V5, "on-a").await;
    let mut on_b = RawClient::connect(b.mqtt, V5, "on-b").await;
    // Both writers and readers work.
    for c in [&mut on_a, &mut on_b] {
        assert_eq!(
            publish_acked(c, "warm", QoS::AtLeastOnce, b"w").await,
            ReasonCode::SUCCESS
        );
    }

    // Connected before: a CONNECT waits for a's writer.
    let mut look_a = RawClient::connect(a.mqtt, V5, "look-a").await;
    look_a.subscribe("rt/race", opts(QoS::AtMostOnce)).await;
    pair.proxy.stall.send_replace(true);
    let p = Publish {
        retain: true,
        ..publish("rt/race", QoS::AtMostOnce, b"from-a")
    };
    on_a.send(&Packet::Publish(p)).await;
    // Routed on A at once (made the retained message first), its append held.
    let Packet::Publish(got) = look_a.expect_within(PATIENCE).await else {
        panic!("expected a's message");
    };
    assert_eq!(&got.payload[..], b"from-a");
    let p = Publish {
        retain: true,
        packet_id: Some(on_b.next_packet_id()),
        ..publish("rt/race", QoS::AtLeastOnce, b"from-b")
    };
    on_b.send(&Packet::Publish(p)).await;
    on_b.expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
    until("a's reader read b's change", || {
        let (head, at_a) = head_and_position(redis, "a");
        at_a == Some(head)
    })
    .await;

    pair.proxy.stall.send_replace(false);
    until(
        "a's change appended after b's, both readers read it",
        || {
            let (head, at_a) = head_and_position(redis, "a");
            let (_, at_b) = head_and_position(redis, "b");
            let hash = redis.command(&["HGET", "{statehub}:mqtt:retained", "rt/race"]);
            hash.contains("from-a") && at_a == Some(head) && at_b == Some(head)
        },
    )
    .await;

    assert_eq!(retained_on(a, "new-a", "rt/race").await, "from-a");
    assert_eq!(
        retained_on(b, "new-b", "rt/race").await,
        "from-a",
        "b holds the change the stream ordered last, as Redis's hash does"
    );
}
