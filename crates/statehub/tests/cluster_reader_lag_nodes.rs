//! The reader-lag flow control (`cluster.mqtt_reader_lag_limit`, decision 0004) with
//! more than one writer holding: three nodes with one reader held (both other
//! writers hold, nothing is trimmed, and how far past the limit they went is
//! measured), a node killed while it is waited for, and two nodes each past the limit
//! for the other's reader while each must hand a persistent session to the other
//! (they must not wait for each other). A held node's Redis link is a proxy that
//! holds only its MQTT stream reader's connection (`common::lag::relay`).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::lag::{
    head_and_position, in_order, publish_all, receive_within, relay, until, PATIENCE,
};
use common::proxy::Proxy;
use common::Server;
use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, publish, RawClient, V5};

const TOPIC: &str = "lag3/t";
const LIMIT: u64 = 20;

fn node(url: &str, id: &str, settings: &str) -> Server {
    let toml = format!("[cluster]\nmqtt_reader_lag_limit = {LIMIT}\n{settings}\n");
    common::start_configured(&toml, &["--redis", url, "--node-id", id])
}

/// A clean-session subscriber to [`TOPIC`] on `node`.
async fn subscriber(node: &Server, id: &str) -> RawClient {
    let mut sub = RawClient::connect(node.mqtt, V5, id).await;
    sub.subscribe(TOPIC, opts(QoS::AtLeastOnce)).await;
    sub
}

/// Publishes `payload` at QoS 1 from `publisher` and waits for its PUBACK.
async fn publish_one(publisher: &mut RawClient, payload: &str) {
    let mut p = publish(TOPIC, QoS::AtLeastOnce, payload.as_bytes());
    p.packet_id = Some(publisher.next_packet_id());
    publisher.send(&Packet::Publish(p)).await;
    publisher
        .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
}

/// Every subscriber got `payload` (so every reader read up to it).
async fn everyone_got(subs: &mut [&mut RawClient], payload: &str) {
    for sub in subs.iter_mut() {
        let got = receive_within(sub, 1, PATIENCE).await;
        assert_eq!(got, [payload]);
    }
}

/// Three nodes, a and b on Redis, c through `proxy`, and a subscriber on each.
struct Three {
    a: Server,
    b: Server,
    c: Server,
    subs: [RawClient; 3],
}

/// [`Three`], and publishers on a and b, after a first message from each publisher
/// reached every subscriber.
async fn three(redis: &RedisServer, proxy: &Proxy, settings: &str) -> (Three, [RawClient; 2]) {
    let c = node(&proxy.url(), "c", settings);
    let b = node(&redis.url(), "b", settings);
    let a = node(&redis.url(), "a", settings);
    let mut subs = [
        subscriber(&a, "sub-a").await,
        subscriber(&b, "sub-b").await,
        subscriber(&c, "sub-c").await,
    ];
    let mut pubs = [
        RawClient::connect(a.mqtt, V5, "pub-a").await,
        RawClient::connect(b.mqtt, V5, "pub-b").await,
    ];
    for (i, p) in pubs.iter_mut().enumerate() {
        let warm = format!("warm-{i}");
        publish_one(p, &warm).await;
        let [sa, sb, sc] = &mut subs;
        everyone_got(&mut [sa, sb, sc], &warm).await;
    }
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
    let proxy = Proxy::start(redis.port(), relay).await;
    let settings = "mqtt_stream_len = 100\nmqtt_node_ttl_ms = 60000";
    let (mut t, pubs) = three(&redis, &proxy, settings).await;

    proxy.stall.send_replace(true);
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
    proxy.stall.send_replace(false);

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
    let proxy = Proxy::start(redis.port(), relay).await;
    let settings = format!(
        "mqtt_stream_len = 100\nmqtt_node_ttl_ms = {}",
        TTL.as_millis()
    );
    let (t, pubs) = three(&redis, &proxy, &settings).await;

    proxy.stall.send_replace(true);
    let acks = both_held(&t, pubs, N).await;
    let acked = acks[0].count() + acks[1].count();
    assert!(acked < 2 * usize::from(N), "publishers wait: {acked} acked");
    let Three { a, b, c, subs, .. } = t;
    let killed = Instant::now();
    c.kill();
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
    const N: u16 = 60;
    const TTL: Duration = Duration::from_secs(90);
    let bound = TTL / 2;
    let redis = RedisServer::start();
    let (pa, pb) = (
        Proxy::start(redis.port(), relay).await,
        Proxy::start(redis.port(), relay).await,
    );
    let settings = format!(
        "mqtt_stream_len = 200\nmqtt_node_ttl_ms = {}",
        TTL.as_millis()
    );
    let b = node(&pb.url(), "b", &settings);
    let a = node(&pa.url(), "a", &settings);
    let (mut sa, mut sb) = (persistent(&a, "sa").await, persistent(&b, "sb").await);
    let mut pubs = [
        RawClient::connect(a.mqtt, V5, "pub-a").await,
        RawClient::connect(b.mqtt, V5, "pub-b").await,
    ];
    for (i, p) in pubs.iter_mut().enumerate() {
        let warm = format!("warm-{i}");
        publish_one(p, &warm).await;
        everyone_got(&mut [&mut sa, &mut sb], &warm).await;
    }

    pa.stall.send_replace(true);
    pb.stall.send_replace(true);
    let [p1, p2] = pubs;
    let acks = [
        publish_all(p1, TOPIC, "a-", N, bound).await,
        publish_all(p2, TOPIC, "b-", N, bound).await,
    ];
    until("both writers hold", || {
        common::metric(a.http, "statehub_cluster_mqtt_writer_held") >= 1.0
            && common::metric(b.http, "statehub_cluster_mqtt_writer_held") >= 1.0
    })
    .await;
    let started = Instant::now();
    // Each CONNECT appends its hand-off request at once, then waits for the owner.
    let (a_mqtt, b_mqtt) = (a.mqtt, b.mqtt);
    let moved_sa = tokio::spawn(async move { resume(b_mqtt, "sa", bound).await });
    let moved_sb = tokio::spawn(async move { resume(a_mqtt, "sb", bound).await });
    until("both CONNECTs wait for the owners' hand-offs", || {
        waiting_for_hand_offs(&redis) >= 2
    })
    .await;
    pa.stall.send_replace(false);
    pb.stall.send_replace(false);

    for acks in acks {
        acks.task.await.unwrap();
    }
    let (mut sa, mut sb) = (moved_sa.await.unwrap(), moved_sb.await.unwrap());
    eprintln!(
        "all acknowledged and both sessions moved {:?} after the requests",
        started.elapsed()
    );
    for sub in [&mut sa, &mut sb] {
        let got = receive_within(sub, 2 * usize::from(N), bound).await;
        assert!(
            in_order(&got, "a-", N) && in_order(&got, "b-", N),
            "{got:?}"
        );
    }
    drop((sa, sb, a, b));
}

/// How many session fetches wait for an owner's hand-off (`BLPOP`), each after
/// appending its request to the stream.
fn waiting_for_hand_offs(redis: &RedisServer) -> usize {
    redis
        .command(&["CLIENT", "LIST"])
        .matches("cmd=blpop")
        .count()
}
