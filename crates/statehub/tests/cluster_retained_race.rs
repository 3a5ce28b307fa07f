//! Two nodes changing one topic's retained message at about the same time, while Redis
//! answers (decision 0004, "Retained changes in stream order"): each change takes effect
//! on its own node at once, and once both are in the stream every node holds the one
//! the stream ordered last, which is what Redis's hash holds.

mod common;

use std::time::Duration;

use common::cluster::{publish_acked, Pair};
use common::lag::{head_and_position, until, PATIENCE};
use common::proxy::{contains, hold_while};
use common::Server;
use statehub_broker::codec::{Packet, Publish, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// How long a subscriber hears nothing before it has no retained message.
const QUIET: Duration = Duration::from_secs(1);

/// The relay of node a's Redis connections: while `stall` is set, what a connection
/// sends that writes the retained hash (a's writer appending a retained change) is
/// held, and everything after it on that connection.
async fn hold_retained(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    hold_while(client, upstream, stall, |chunk| {
        contains(chunk, b"mqtt:retained") && !contains(chunk, b"HGETALL")
    })
    .await;
}

/// The retained message a new subscriber to `rt/race` on `node` gets, if any (none
/// within a second).
async fn retained_on(node: &Server, id: &str) -> Option<String> {
    let mut c = RawClient::connect(node.mqtt, V5, id).await;
    c.subscribe("rt/race", opts(QoS::AtLeastOnce)).await;
    let got = tokio::time::timeout(QUIET, c.expect_within(PATIENCE)).await;
    let Packet::Publish(p) = got.ok()? else {
        panic!("expected the retained message");
    };
    assert!(p.retain);
    c.ack(&p).await;
    Some(String::from_utf8_lossy(&p.payload).into_owned())
}

/// Redis's retained message of `rt/race`, if any.
fn in_hash(redis: &RedisServer) -> Option<String> {
    let value = redis.command(&["HGET", "{statehub}:mqtt:retained", "rt/race"]);
    ["from-a", "from-b"]
        .into_iter()
        .find(|p| value.contains(p))
        .map(str::to_owned)
}

/// A changes `rt/race` to `a_payload` (QoS 0; empty: clears it), its append held at
/// the proxy; B sets it to `from-b` after, its append lands first and A's reader
/// reads it; then A's append lands and both readers read it.
async fn race(a_payload: &[u8]) -> Pair {
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
        ..publish("rt/race", QoS::AtMostOnce, a_payload)
    };
    on_a.send(&Packet::Publish(p)).await;
    // Routed on A at once (its retained change made first), its append held.
    let Packet::Publish(got) = look_a.expect_within(PATIENCE).await else {
        panic!("expected a's message");
    };
    assert_eq!(&got.payload[..], a_payload);
    let p = Publish {
        retain: true,
        packet_id: Some(on_b.next_packet_id()),
        ..publish("rt/race", QoS::AtLeastOnce, b"from-b")
    };
    on_b.send(&Packet::Publish(p)).await;
    on_b.expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
    let (before, _) = head_and_position(redis, "a");
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
            head > before && at_a == Some(head) && at_b == Some(head)
        },
    )
    .await;
    pair
}

/// A sets `rt/race`, B sets it after, B's append lands first: the stream and the hash
/// end with A's, and new subscribers on both nodes get A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retained_changes_end_in_stream_order_on_every_node() {
    let pair = race(b"from-a").await;
    assert_eq!(in_hash(&pair.redis).as_deref(), Some("from-a"));
    let on_a = retained_on(&pair.a, "new-a").await;
    assert_eq!(
        on_a.as_deref(),
        Some("from-a"),
        "a keeps its own, later change"
    );
    let on_b = retained_on(&pair.b, "new-b").await;
    assert_eq!(
        on_b.as_deref(),
        Some("from-a"),
        "b holds the change the stream ordered last, as Redis's hash does"
    );
}

/// A clears `rt/race`, B sets it after, B's append lands first: the clear is the
/// stream's last change, so neither node nor the hash holds a retained message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_ordered_last_clears_the_topic_on_every_node() {
    let pair = race(b"").await;
    assert_eq!(in_hash(&pair.redis), None);
    assert_eq!(
        retained_on(&pair.a, "new-a").await,
        None,
        "a keeps its clear"
    );
    assert_eq!(retained_on(&pair.b, "new-b").await, None);
}

/// B sets `rt/race` with a message expiry while A's reader is held, and it expires
/// before A reads it: A's older retained message goes, as the hash's expired value
/// reads as none (a node started later has none either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_change_that_expired_before_it_was_read_still_replaces_the_old_one() {
    let pair = Pair::builder().start(common::lag::relay).await;
    let (a, b, redis) = (&pair.a, &pair.b, &pair.redis);
    let mut on_b = RawClient::connect(b.mqtt, V5, "on-b").await;
    let old = Publish {
        retain: true,
        packet_id: Some(on_b.next_packet_id()),
        ..publish("rt/race", QoS::AtLeastOnce, b"from-b-old")
    };
    on_b.send(&Packet::Publish(old)).await;
    on_b.expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
    until("a's reader read the old one", || {
        let (head, at_a) = head_and_position(redis, "a");
        at_a == Some(head)
    })
    .await;
    assert_eq!(
        retained_on(a, "look-a").await.as_deref(),
        Some("from-b-old")
    );

    pair.proxy.stall.send_replace(true);
    let mut new = Publish {
        retain: true,
        packet_id: Some(on_b.next_packet_id()),
        ..publish("rt/race", QoS::AtLeastOnce, b"from-b")
    };
    new.properties.message_expiry_interval = Some(1);
    on_b.send(&Packet::Publish(new)).await;
    on_b.expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
    // Its expiry is the time that must pass.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    pair.proxy.stall.send_replace(false);
    until("a's reader read the new one", || {
        let (head, at_a) = head_and_position(redis, "a");
        at_a == Some(head)
    })
    .await;

    assert_eq!(retained_on(b, "new-b").await, None, "expired on b");
    assert_eq!(
        retained_on(a, "new-a").await,
        None,
        "a keeps no older retained message than the stream's last"
    );
}
