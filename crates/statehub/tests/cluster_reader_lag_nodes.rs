//! The reader-lag flow control (`cluster.mqtt_reader_lag_limit`, decision 0004) with
//! more than one writer holding: three nodes with one reader held (both other
//! writers hold, nothing is trimmed, and how far past the limit they went is
//! measured), a node killed while it is waited for, and two (or three, in a cycle)
//! nodes each past the limit for another's reader while each must hand a persistent
//! session to the next (they must not wait for each other). A held node's Redis link
//! is a proxy that holds only its MQTT stream reader's connection
//! (`common::lag::relay`).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::lag::{
    head_and_position, in_order, lag_nodes, publish_all, receive_within, until, warm_up, LagNode,
    Link, PATIENCE,
};
use common::Server;
use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, RawClient, V5};

const TOPIC: &str = "lag3/t";
const LIMIT: u64 = 20;

/// A clean-session subscriber to [`TOPIC`] on `node`.
async fn subscriber(node: &Server, id: &str) -> RawClient {
    let mut sub = RawClient::connect(node.mqtt, V5, id).await;
    sub.subscribe(TOPIC, opts(QoS::AtLeastOnce)).await;
    sub
}

/// `[cluster]` settings with the lag limit, a `stream_len` stream and a node TTL of
/// `ttl`.
fn settings(stream_len: u64, ttl: Duration) -> String {
    format!(
        "mqtt_reader_lag_limit = {LIMIT}\nmqtt_stream_len = {stream_len}\nmqtt_node_ttl_ms = {}",
        ttl.as_millis()
    )
}

/// Three nodes, a and b on Redis, c's reader can be held, and a subscriber on each.
struct Three {
    a: LagNode,
    b: LagNode,
    c: LagNode,
    subs: [RawClient; 3],
}

/// [`Three`], and publishers on a and b, after a first message from each publisher
/// reached every subscriber.
async fn three(redis: &RedisServer, ttl: Duration) -> (Three, [RawClient; 2]) {
    let nodes = [("a", Link::Direct), ("b", Link::Direct), ("c", Link::Held)];
    let [a, b, c] = lag_nodes(redis, &settings(100, ttl), nodes).await;
    let mut subs = [
        subscriber(&a, "sub-a").await,
        subscriber(&b, "sub-b").await,
        subscriber(&c, "sub-c").await,
    ];
    let mut pubs = [
        RawClient::connect(a.mqtt, V5, "pub-a").await,
        RawClient::connect(b.mqtt, V5, "pub-b").await,
    ];
    let [sa, sb, sc] = &mut subs;
    warm_up(&mut pubs, &mut [sa, sb, sc], TOPIC).await;
    (Three { a, b, c, subs }, pubs)
}

/// Both publishers send `n` messages while c's reader is held; returns once both
/// writers hold, with their acknowledgement counters.
async fn both_held(t: &Three, [pa, pb]: [RawClient; 2], n: u16) -> [common::lag::Acks; 2] {
    let acks = [
        publish_all(pa, TOPIC, "a-", n, PATIENCE * 2).await,
        publish_all(pb, TOPIC, "b-", n, PATIENCE * 2).await,
    ];
    let (a, b) = (t.a.http, t.b.http);
    until("both writers hold", || {
        common::metric(a, "statehub_cluster_mqtt_writer_held") >= 1.0
            && common::metric(b, "statehub_cluster_mqtt_writer_held") >= 1.0
    })
    .await;
    acks
}

/// With c's reader held, a's and b's publishers (100 messages each, 2x the stream)
/// both wait; nothing is trimmed past c's reader (measured: how far past the limit
/// the two writers went), and once c reads again every subscriber gets every message
/// once, each publisher's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_reader_held_both_other_writers_hold_and_nothing_is_trimmed() {
    const N: u16 = 100;
    let redis = RedisServer::start();
    let (mut t, pubs) = three(&redis, Duration::from_secs(60)).await;

    t.c.hold_reader(true);
    let acks = both_held(&t, pubs, N).await;
    let (head, position) = head_and_position(&redis, "c");
    let position = position.expect("c's reader is live");
    let behind = head - position;
    eprintln!(
        "c's reader {behind} entries behind the head with both writers held: {} past the limit of {LIMIT}",
        behind.saturating_sub(LIMIT)
    );
    assert!(behind >= LIMIT, "a writer holds only at the limit");
    // Each writer appends at most the room it saw; the other's round can come on top.
    assert!(behind <= 2 * LIMIT, "overshoot: {behind} behind");
    let acked = acks[0].count() + acks[1].count();
    assert!(acked < 2 * usize::from(N), "publishers wait: {acked} acked");
    t.c.hold_reader(false);

    for sub in &mut t.subs {
        let got = receive_within(sub, 2 * usize::from(N), PATIENCE).await;
        assert!(
            in_order(&got, "a-", N) && in_order(&got, "b-", N),
            "{got:?}"
        );
    }
    for acks in acks {
        acks.task.await.unwrap();
    }
    let gaps = common::metric(t.c.http, "statehub_cluster_mqtt_stream_gaps");
    assert_eq!(gaps, 0.0, "nothing trimmed before c read it");
}

/// With c's reader held, both writers wait; c is killed: they resume once its
/// position lapsed (the node TTL), and the subscribers on a and b get every message,
/// each publisher's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_while_waited_for_is_waited_for_until_its_position_lapses() {
    const N: u16 = 60;
    // Long enough for c's position to outlive the set-up below.
    const TTL: Duration = Duration::from_secs(15);
    let redis = RedisServer::start();
    let (t, pubs) = three(&redis, TTL).await;

    t.c.hold_reader(true);
    let acks = both_held(&t, pubs, N).await;
    let acked = acks[0].count() + acks[1].count();
    assert!(acked < 2 * usize::from(N), "publishers wait: {acked} acked");
    let Three { a, b, c, subs, .. } = t;
    let killed = Instant::now();
    c.server.kill();
    for acks in acks {
        acks.task.await.unwrap();
    }
    let resumed = killed.elapsed();
    let (_, position) = head_and_position(&redis, "c");
    assert_eq!(position, None, "they resumed once c's position lapsed");
    eprintln!("writers resumed {resumed:?} after the kill (node TTL {TTL:?})");
    // No hold lasts more than twice the node TTL plus `timeout_ms` (2 s).
    assert!(resumed < TTL * 2 + Duration::from_secs(2), "{resumed:?}");
    let [mut sub_a, mut sub_b, _] = subs;
    for sub in [&mut sub_a, &mut sub_b] {
        let got = receive_within(sub, 2 * usize::from(N), PATIENCE).await;
        assert!(
            in_order(&got, "a-", N) && in_order(&got, "b-", N),
            "{got:?}"
        );
    }
    drop((a, b));
}

/// A persistent session of `client_id` on `node`, subscribed to [`TOPIC`].
async fn persistent(node: &Server, client_id: &str) -> RawClient {
    let (mut c, ack) = RawClient::connect_with(node.mqtt, persistent_connect(client_id, 300)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    c.subscribe(TOPIC, opts(QoS::AtLeastOnce)).await;
    c
}

/// Resumes `client_id`'s session at `addr`; its CONNACK must say Session Present
/// within `within`.
async fn resume(addr: SocketAddr, client_id: &str, within: Duration) -> RawClient {
    let mut c = RawClient::open(addr, V5).await;
    c.send(&Packet::Connect(Box::new(persistent_connect(
        client_id, 300,
    ))))
    .await;
    match c.expect_within(within).await {
        Packet::ConnAck(ack) => {
            assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
            assert!(ack.session_present, "{client_id} resumed");
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    c
}

/// Nodes a and b, each past the limit for the other's reader (both readers held,
/// publishers on both), then each asked for a persistent session the other holds,
/// then both readers released: each reader reaches the other's hand-off request while
/// its own writer holds for the other's reader. They must not wait for each other
/// until a position lapses (the node TTL, 90 s here): every PUBACK and both resumed
/// sessions come well before, and each session gets every message once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_past_the_limit_for_each_other_do_not_wait_for_each_other() {
    sessions_handed_round_a_ring(["a", "b"], 60).await;
}

/// The same with three nodes in a cycle: a's writer waits for b's reader, b's for
/// c's, c's for a's (each writer waits for every reader past the limit, so for these
/// too), with sessions handed a to b, b to c and c to a at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_waiting_for_each_other_in_a_cycle_do_not_wait_for_ever() {
    sessions_handed_round_a_ring(["a", "b", "c"], 40).await;
}

/// Nodes `ids`, every reader held and a publisher on each sending `n` messages, each
/// node holding a persistent session (`s{id}`) that the next node in `ids` (the last's:
/// the first) is asked for while every writer holds; then the readers are released.
/// Every PUBACK and every session comes within half the node TTL (90 s), and each
/// session gets every publisher's messages once, in order.
async fn sessions_handed_round_a_ring<const K: usize>(ids: [&str; K], n: u16) {
    const TTL: Duration = Duration::from_secs(90);
    let bound = TTL / 2;
    let redis = RedisServer::start();
    let nodes = lag_nodes(&redis, &settings(200, TTL), ids.map(|id| (id, Link::Held))).await;
    let mut sessions = Vec::with_capacity(K);
    let mut pubs = Vec::with_capacity(K);
    for (node, id) in nodes.iter().zip(ids) {
        sessions.push(persistent(node, &format!("s{id}")).await);
        pubs.push(RawClient::connect(node.mqtt, V5, &format!("pub-{id}")).await);
    }
    warm_up(
        &mut pubs,
        &mut sessions.iter_mut().collect::<Vec<_>>(),
        TOPIC,
    )
    .await;

    nodes.iter().for_each(|node| node.hold_reader(true));
    let mut acks = Vec::with_capacity(K);
    for (p, id) in pubs.into_iter().zip(ids) {
        acks.push(publish_all(p, TOPIC, &format!("{id}-"), n, bound).await);
    }
    until("every writer holds", || {
        (nodes.iter())
            .all(|node| common::metric(node.http, "statehub_cluster_mqtt_writer_held") >= 1.0)
    })
    .await;
    let started = Instant::now();
    // Each CONNECT appends its hand-off request at once, then waits for the owner.
    let mut moved = Vec::with_capacity(K);
    for (i, id) in ids.iter().enumerate() {
        let next = nodes[(i + 1) % K].mqtt;
        let client = format!("s{id}");
        moved.push(tokio::spawn(
            async move { resume(next, &client, bound).await },
        ));
    }
    until("every CONNECT waits for its owner's hand-off", || {
        waiting_for_hand_offs(&redis) >= K
    })
    .await;
    nodes.iter().for_each(|node| node.hold_reader(false));

    for acks in acks {
        acks.task.await.unwrap();
    }
    let mut sessions = Vec::with_capacity(K);
    for session in moved {
        sessions.push(session.await.unwrap());
    }
    eprintln!(
        "all acknowledged and all {K} sessions moved {:?} after the requests",
        started.elapsed()
    );
    for session in &mut sessions {
        let got = receive_within(session, K * usize::from(n), bound).await;
        let each = ids.iter().all(|id| in_order(&got, &format!("{id}-"), n));
        assert!(each, "{got:?}");
    }
    drop((sessions, nodes));
}

/// How many session fetches wait for an owner's hand-off (`BLPOP`), each after
/// appending its request to the stream.
fn waiting_for_hand_offs(redis: &RedisServer) -> usize {
    redis
        .command(&["CLIENT", "LIST"])
        .matches("cmd=blpop")
        .count()
}
