//! One publisher's QoS 1/2 PUBLISHes on a node with `--redis` share the writer's Redis
//! round trips: the node reads and routes the next ones while earlier ones' stream
//! appends are in flight, and acknowledges each, in the order received, only once
//! Redis has it. Subscribers on every node get each publisher's messages in order.

mod common;

use std::time::Duration;

use common::cluster::{node, node_with_settings, publish_acked};
use common::Server;
use statehub_broker::codec::{Packet, PubResponse, QoS, ReasonCode, Subscribe};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{
    bs, opts, persistent_connect, publish, v4c, v5c, v5pub, RawClient, QUIET, V5,
};

/// Unpauses Redis's writes when dropped, so a failing test leaves no paused server.
struct Paused<'a>(&'a RedisServer);

impl<'a> Paused<'a> {
    fn writes(redis: &'a RedisServer) -> Self {
        assert_eq!(
            redis.command(&["CLIENT", "PAUSE", "60000", "WRITE"]),
            "+OK\r\n"
        );
        Paused(redis)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.command(&["CLIENT", "UNPAUSE"]);
    }
}

/// The next packet is `id`'s PUBACK (QoS 1) or PUBREC (QoS 2), with Success; a PUBREC
/// is answered with PUBREL (its PUBCOMP may come any time after).
async fn expect_ack(c: &mut RawClient, qos: QoS, id: u16) {
    loop {
        match (qos, c.expect().await) {
            (_, Packet::PubComp(_)) => continue,
            (QoS::AtLeastOnce, Packet::PubAck(a)) | (QoS::ExactlyOnce, Packet::PubRec(a)) => {
                assert_eq!((a.packet_id, a.reason_code), (id, ReasonCode::SUCCESS));
                if qos == QoS::ExactlyOnce {
                    c.send(&Packet::PubRel(PubResponse::ok(id))).await;
                }
                return;
            }
            (_, other) => panic!("expected the acknowledgement of {id} ({qos:?}), got {other:?}"),
        }
    }
}

/// Sends PUBLISHes 1..=n on `topic` (QoS 1 and 2 alternating), payload its number,
/// without waiting for any acknowledgement.
async fn publish_burst(c: &mut RawClient, topic: &str, n: u16) -> Vec<QoS> {
    let mut qos = Vec::new();
    for id in 1..=n {
        let q = [QoS::AtLeastOnce, QoS::ExactlyOnce][usize::from(id % 2)];
        let mut p = publish(topic, q, id.to_string().as_bytes());
        p.packet_id = Some(id);
        c.send(&Packet::Publish(p)).await;
        qos.push(q);
    }
    qos
}

/// The payloads of the next `n` PUBLISHes, each acknowledged.
async fn received(c: &mut RawClient, n: u16) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        let p = c.expect_publish_ack().await;
        got.push(String::from_utf8_lossy(&p.payload).into_owned());
    }
    got
}

fn numbers(n: u16) -> Vec<String> {
    (1..=n).map(|i| i.to_string()).collect()
}

/// With Redis refusing to write (`CLIENT PAUSE WRITE`), a publisher's K PUBLISHes are
/// all read (a PINGREQ behind them is answered), none is acknowledged, and none
/// reaches its node's subscriber before its append's outcome is known (decision
/// 0005, "A refused copy"); once Redis writes again, the K acknowledgements come in
/// order and both nodes' subscribers get the K messages in order. (One at a time,
/// the second PUBLISH was not read before the first one's append came back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishers_messages_are_routed_while_redis_writes_wait_and_acked_in_order() {
    const K: u16 = 8;
    let redis = RedisServer::start();
    // A writer that waits out the pause rather than giving up on Redis.
    let slow = "timeout_ms = 60000";
    let (a, b) = (
        node_with_settings(&redis, "a", slow),
        node_with_settings(&redis, "b", slow),
    );
    let mut near = RawClient::connect(a.mqtt, V5, "near").await;
    near.subscribe("pipe/t", opts(QoS::ExactlyOnce)).await;
    let mut far = RawClient::connect(b.mqtt, V5, "far").await;
    far.subscribe("pipe/t", opts(QoS::ExactlyOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "publisher").await;

    let paused = Paused::writes(&redis);
    let qos = publish_burst(&mut publisher, "pipe/t", K).await;
    publisher.send(&Packet::PingReq).await;
    assert!(
        matches!(publisher.expect().await, Packet::PingResp),
        "read on while every append waits"
    );
    near.expect_nothing(QUIET).await;
    far.expect_nothing(QUIET).await;
    drop(paused);

    for (i, q) in qos.iter().enumerate() {
        expect_ack(&mut publisher, *q, u16::try_from(i + 1).unwrap()).await;
    }
    assert_eq!(
        received(&mut near, K).await,
        numbers(K),
        "this node, in order"
    );
    assert_eq!(
        received(&mut far, K).await,
        numbers(K),
        "the other node, in order"
    );
}

/// Bursts from publishers on two nodes, QoS 1 and 2 mixed, reach subscribers on three
/// nodes each in its publisher's order, and every acknowledgement comes in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_from_two_nodes_reach_three_nodes_in_each_publishers_order() {
    const N: u16 = 60;
    let redis = RedisServer::start();
    let nodes = [node(&redis, "a"), node(&redis, "b"), node(&redis, "c")];
    let mut subs = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        let mut s = RawClient::connect(n.mqtt, V5, &format!("sub{i}")).await;
        s.subscribe("burst/#", opts(QoS::ExactlyOnce)).await;
        subs.push(s);
    }
    let mut pa = RawClient::connect(nodes[0].mqtt, V5, "pa").await;
    let mut pb = RawClient::connect(nodes[1].mqtt, V5, "pb").await;
    let qa = publish_burst(&mut pa, "burst/a", N).await;
    let qb = publish_burst(&mut pb, "burst/b", N).await;
    for (i, (qa, qb)) in qa.iter().zip(&qb).enumerate() {
        let id = u16::try_from(i + 1).unwrap();
        expect_ack(&mut pa, *qa, id).await;
        expect_ack(&mut pb, *qb, id).await;
    }
    for (i, s) in subs.iter_mut().enumerate() {
        let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
        for _ in 0..2 * N {
            let p = s.expect_publish_ack().await;
            let payload = String::from_utf8_lossy(&p.payload).into_owned();
            match &*p.topic {
                "burst/a" => from_a.push(payload),
                _ => from_b.push(payload),
            }
        }
        assert_eq!(from_a, numbers(N), "node {i}: a's messages in order");
        assert_eq!(from_b, numbers(N), "node {i}: b's messages in order");
        s.expect_nothing(QUIET).await;
    }
}

/// rumqttc publishing QoS 1 with 50 in flight on one node: rumqttc subscribers (MQTT 5
/// and 3.1.1) on the other two get every message once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_with_many_in_flight_across_nodes_in_order() {
    const N: usize = 300;
    let redis = RedisServer::start();
    let nodes: [Server; 3] = [node(&redis, "a"), node(&redis, "b"), node(&redis, "c")];
    let (v5, mut v5_rx) = v5c::connect(v5c::options(nodes[1].mqtt, "rq-v5")).await;
    v5.subscribe("rq/t", v5c::QoS::AtLeastOnce).await.unwrap();
    v5c::next_suback(&mut v5_rx).await;
    let (v4, mut v4_rx) = v4c::connect(v4c::options(nodes[2].mqtt, "rq-v4")).await;
    v4.subscribe("rq/t", v4c::QoS::AtLeastOnce).await.unwrap();
    v4c::next_suback(&mut v4_rx).await;

    let mut o = v5c::options(nodes[0].mqtt, "rq-pub");
    o.set_outgoing_inflight_upper_limit(50);
    let (publisher, mut pub_rx) = v5c::connect(o).await;
    let payloads: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
    let sending = {
        let (publisher, payloads) = (publisher.clone(), payloads.clone());
        tokio::spawn(async move {
            for p in payloads {
                let q = v5c::QoS::AtLeastOnce;
                publisher.publish("rq/t", q, false, p).await.unwrap();
            }
        })
    };
    let mut acks = 0;
    while acks < N {
        let wait = tokio::time::timeout(Duration::from_secs(10), pub_rx.recv()).await;
        let got = wait.expect("PUBACKs keep coming");
        if let v5c::In::PubAck(a) = got.expect("publisher's event loop") {
            assert_eq!(a.reason, v5pub::PubAckReason::Success);
            acks += 1;
        }
    }
    sending.await.unwrap();
    for want in &payloads {
        let p = v5c::next_publish(&mut v5_rx).await;
        assert_eq!(
            &p.payload[..],
            want.as_bytes(),
            "MQTT 5 subscriber, in order"
        );
        let p = v4c::next_publish(&mut v4_rx).await;
        assert_eq!(
            &p.payload[..],
            want.as_bytes(),
            "MQTT 3.1.1 subscriber, in order"
        );
    }
}

/// A persistent subscriber's PUBREL and SUBACK wait for the session writer's Redis
/// write, and its connection is read meanwhile: with Redis refusing to write, its
/// PUBREC and a SUBSCRIBE are taken and a PINGREQ behind them is answered; once Redis
/// writes again the PUBREL, then the SUBACK, come. (Awaited in the read loop, the
/// PINGREQ was not read before Redis wrote.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_subscribers_pubrel_and_suback_wait_for_redis_while_it_is_read() {
    let redis = RedisServer::start();
    let a = node_with_settings(&redis, "a", "timeout_ms = 60000");
    let (mut sub, _) = RawClient::connect_with(a.mqtt, persistent_connect("rsub", 300)).await;
    sub.subscribe("rel/t", opts(QoS::ExactlyOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "rpub").await;
    let code = publish_acked(&mut publisher, "rel/t", QoS::ExactlyOnce, b"m").await;
    assert_eq!(code, ReasonCode::SUCCESS);
    let id = sub.expect_publish().await.packet_id.unwrap();

    let paused = Paused::writes(&redis);
    sub.send(&Packet::PubRec(PubResponse::ok(id))).await;
    sub.send(&Packet::Subscribe(Subscribe {
        packet_id: 77,
        filters: vec![(bs("rel/other"), opts(QoS::AtLeastOnce))],
        ..Default::default()
    }))
    .await;
    sub.ping().await;
    sub.expect_nothing(QUIET).await;
    drop(paused);

    match sub.expect().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, id),
        other => panic!("expected the PUBREL of {id}, got {other:?}"),
    }
    match sub.expect().await {
        Packet::SubAck(s) => assert_eq!(s.packet_id, 77),
        other => panic!("expected the SUBACK, got {other:?}"),
    }
    sub.send(&Packet::PubComp(PubResponse::ok(id))).await;
}
