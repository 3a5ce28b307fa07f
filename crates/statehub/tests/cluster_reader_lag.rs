//! Flow control between the nodes' MQTT stream writers and the slowest reader
//! (`cluster.mqtt_reader_lag_limit`, decision 0004): while one node's reader is held
//! back, another node's publishers wait (their PUBACKs are held) rather than append
//! past the stream's trim, so the held node's subscriber gets every acknowledged
//! message once its reader reads again; a reader that makes no progress for the node
//! TTL is not waited for. The held node's Redis link is a proxy in these tests that
//! holds the MQTT stream reader's connection (the one that sends `XREAD` on the
//! message stream) and nothing else. Three nodes, and two nodes each holding for the
//! other: `cluster_reader_lag_nodes.rs`.

mod common;

use common::lag::{
    head_and_position, in_order, lag_nodes, publish_all, receive_within, until, LagNode, Link,
    PATIENCE,
};
use common::Server;
use statehub_broker::codec::{Packet, Publish, QoS};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};

const N: u16 = 200;
const TOPIC: &str = "lag/t";

/// Nodes `a` (on Redis directly) and `b` (whose reader can be held) with a 50-entry
/// stream, a lag limit of 20, and a node TTL of `ttl_ms`.
async fn nodes(redis: &RedisServer, ttl_ms: u64) -> [LagNode; 2] {
    let settings =
        format!("mqtt_stream_len = 50\nmqtt_reader_lag_limit = 20\nmqtt_node_ttl_ms = {ttl_ms}");
    lag_nodes(redis, &settings, [("a", Link::Direct), ("b", Link::Held)]).await
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

/// With b's reader held, a's publisher's 200 QoS 1 messages (4 times the stream's
/// length) wait at a's writer; once b reads again its subscriber gets all 200 in
/// order, and b counted no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_reader_holds_the_other_nodes_publishers_and_loses_nothing() {
    let redis = RedisServer::start();
    // The held reader stays live for the whole test.
    let [a, b] = nodes(&redis, 60_000).await;
    let (publisher, mut sub) = subscribed(&a, &b).await;

    b.hold_reader(true);
    let acks = publish_all(publisher, TOPIC, "", N, PATIENCE).await;
    until("a's writer holds, or every message is acknowledged", || {
        common::metric(a.http, "statehub_cluster_mqtt_writer_held") >= 1.0
            || acks.count() == usize::from(N)
    })
    .await;
    assert!(
        acks.count() < usize::from(N),
        "publishers wait while b's reader is held"
    );
    b.hold_reader(false);

    for i in 1..=N {
        let p = match sub.expect_within(PATIENCE).await {
            Packet::Publish(p) => p,
            other => panic!("expected message {i}, got {other:?}"),
        };
        assert_eq!(String::from_utf8_lossy(&p.payload), i.to_string());
        sub.ack(&p).await;
    }
    acks.task.await.unwrap();
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
    let [a, b] = nodes(&redis, 1000).await;
    let (publisher, _sub) = subscribed(&a, &b).await;

    b.hold_reader(true);
    let acks = publish_all(publisher, TOPIC, "", N, PATIENCE).await;
    // The task ends after N PUBACKs, each Success.
    acks.task.await.unwrap();
    drop(b);
}

/// With b's reader held and a's writer holding for it, b's own publishers wait too:
/// b's reader skips b's entries, but 100 of them (twice the stream) would push a's
/// that it has not read out of the stream. Once b reads again its subscriber gets
/// both publishers' messages, each once and in order, and b counted no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_reader_holds_its_own_nodes_publishers_too() {
    const M: u16 = 100;
    let redis = RedisServer::start();
    let [a, b] = nodes(&redis, 60_000).await;
    let (publisher, mut sub) = subscribed(&a, &b).await;
    let local = RawClient::connect(b.mqtt, V5, "local-publisher").await;

    b.hold_reader(true);
    let from_a = publish_all(publisher, TOPIC, "a-", M, PATIENCE).await;
    until("a's writer holds", || {
        common::metric(a.http, "statehub_cluster_mqtt_writer_held") >= 1.0
    })
    .await;
    let from_b = publish_all(local, TOPIC, "b-", M, PATIENCE).await;
    until(
        "b's writer holds, or b's messages are all acknowledged",
        || {
            common::metric(b.http, "statehub_cluster_mqtt_writer_held") >= 1.0
                || from_b.count() == usize::from(M)
        },
    )
    .await;
    assert!(
        from_b.count() < usize::from(M),
        "b's publisher waits for b's own reader"
    );
    b.hold_reader(false);

    let got = receive_within(&mut sub, 2 * usize::from(M), PATIENCE).await;
    assert!(
        in_order(&got, "a-", M) && in_order(&got, "b-", M),
        "{got:?}"
    );
    from_a.task.await.unwrap();
    from_b.task.await.unwrap();
    assert_eq!(
        common::metric(b.http, "statehub_cluster_mqtt_stream_gaps"),
        0.0
    );
}

/// Sends `payload` retained on `topic` at QoS 1 and waits for its PUBACK.
async fn retained(publisher: &mut RawClient, topic: &str, payload: &[u8]) {
    let p = Publish {
        retain: true,
        packet_id: Some(publisher.next_packet_id()),
        ..publish(topic, QoS::AtLeastOnce, payload)
    };
    publisher.send(&Packet::Publish(p)).await;
    publisher
        .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
}

/// With b's reader held, `publisher` (on a) sends a retained `payload` on `topic`,
/// then enough messages, all acknowledged once b's position lapsed, to trim it from
/// the stream; b then reads on past the gap.
async fn trimmed_before_b_read(
    redis: &RedisServer,
    b: &LagNode,
    mut publisher: RawClient,
    (topic, payload): (&str, &[u8]),
) {
    b.hold_reader(true);
    retained(&mut publisher, topic, payload).await;
    let acks = publish_all(publisher, TOPIC, "", N, PATIENCE).await;
    acks.task.await.unwrap();
    b.hold_reader(false);
    until("b read on past the gap", || {
        let (head, at) = head_and_position(redis, "b");
        common::metric(b.http, "statehub_cluster_mqtt_stream_gaps") >= 1.0 && at == Some(head)
    })
    .await;
}

/// With b's reader stuck past the node TTL, a's retained change and then enough
/// messages to trim it from the stream before b read it: once b reads again it counts
/// the gap and reloads the retained hash, so a new subscriber on b gets the retained
/// message whose entry it never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_past_a_gap_reloads_the_retained_messages() {
    const RETAINED: &str = "lag/retained";
    let redis = RedisServer::start();
    let [a, b] = nodes(&redis, 1000).await;
    let (publisher, _sub) = subscribed(&a, &b).await;
    trimmed_before_b_read(&redis, &b, publisher, (RETAINED, b"kept")).await;

    let mut late = RawClient::connect(b.mqtt, V5, "late").await;
    late.subscribe(RETAINED, opts(QoS::AtLeastOnce)).await;
    let got = late.expect_publish_ack().await;
    assert!(got.retain, "{got:?}");
    assert_eq!(&got.payload[..], b"kept");
}

/// A retained message b has, cleared on a while b's reader is stuck past the node TTL
/// and then trimmed from the stream before b read the clear: once b reads again it
/// reloads the retained hash, which no longer holds it, and clears it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_past_a_gap_drops_a_retained_message_cleared_in_the_trimmed_entries() {
    const CLEARED: &str = "lag/cleared";
    let redis = RedisServer::start();
    let [a, b] = nodes(&redis, 1000).await;
    let (mut publisher, _sub) = subscribed(&a, &b).await;
    retained(&mut publisher, CLEARED, b"old").await;
    let mut early = RawClient::connect(b.mqtt, V5, "early").await;
    early.subscribe(CLEARED, opts(QoS::AtLeastOnce)).await;
    assert_eq!(&early.expect_publish_ack().await.payload[..], b"old");
    trimmed_before_b_read(&redis, &b, publisher, (CLEARED, b"")).await;

    let mut late = RawClient::connect(b.mqtt, V5, "late").await;
    late.subscribe(CLEARED, opts(QoS::AtLeastOnce)).await;
    late.expect_nothing(std::time::Duration::from_millis(500))
        .await;
}
