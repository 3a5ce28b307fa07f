//! Retained messages changed while Redis was out of reach (docs/cluster.md, "Redis is
//! out of reach"; decision 0004): a QoS 0 retained change takes effect on its node at
//! once, and once Redis is back every node holds the same retained messages as Redis's
//! hash: each node writes the changes it could not (the latest per topic), and the
//! stream's order decides between two nodes' changes to one topic. A QoS 1 retained
//! PUBLISH refused meanwhile (0x80) is retained nowhere.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{node, publish_acked};
use common::lag::{head_and_position, until, PATIENCE};
use common::Server;
use statehub_broker::codec::{Packet, Publish, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};

/// How long a subscriber hears nothing more before its retained messages are all in.
const QUIET: Duration = Duration::from_secs(1);

/// Publishes a retained message at `qos`; its acknowledgement's reason code.
async fn retain(c: &mut RawClient, topic: &str, qos: QoS, payload: &str) -> ReasonCode {
    let p = Publish {
        retain: true,
        packet_id: (qos != QoS::AtMostOnce).then(|| c.next_packet_id()),
        ..publish(topic, qos, payload.as_bytes())
    };
    c.send(&Packet::Publish(p)).await;
    if qos == QoS::AtMostOnce {
        return ReasonCode::SUCCESS;
    }
    match c
        .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await
    {
        Packet::PubAck(a) => a.reason_code,
        _ => unreachable!(),
    }
}

/// The retained messages a new subscriber to `rt/#` on `node` gets, by topic.
async fn retained_on(node: &Server, id: &str) -> BTreeMap<String, String> {
    let mut c = RawClient::connect(node.mqtt, V5, id).await;
    c.subscribe("rt/#", opts(QoS::AtLeastOnce)).await;
    let mut got = BTreeMap::new();
    while let Ok(packet) = tokio::time::timeout(QUIET, c.expect_within(PATIENCE)).await {
        let Packet::Publish(p) = packet else {
            panic!("expected a retained message, got {packet:?}");
        };
        assert!(p.retain, "only retained messages: {p:?}");
        c.ack(&p).await;
        let payload = String::from_utf8_lossy(&p.payload).into_owned();
        got.insert(p.topic.to_string(), payload);
    }
    got
}

/// Publishes QoS 1 `probe`s on `c` until one is acknowledged (the node's writer
/// reaches Redis again).
async fn until_accepted(c: &mut RawClient) {
    for _ in 0..600 {
        if publish_acked(c, "probe", QoS::AtLeastOnce, b"probe").await == ReasonCode::SUCCESS {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("redis never accepted a PUBLISH again");
}

/// Waits until `node`'s writer has failed the batch holding what `client` sent so far:
/// the round trip says the node handed it to the writer, which tries every batch (and,
/// idle, a PING every 250 ms); two more failures then include it.
async fn failed_to_write(node: &Server, client: &mut RawClient) {
    client.ping().await;
    let http = node.http;
    let errors = common::metric(http, "statehub_cluster_mqtt_writer_errors");
    until("the writer failed twice more", || {
        common::metric(http, "statehub_cluster_mqtt_writer_errors") >= errors + 2.0
    })
    .await;
}

/// Waits until the readers of nodes a and b read the whole stream.
async fn until_read(redis: &RedisServer) {
    until("both readers read the whole stream", || {
        let (head, at_a) = head_and_position(redis, "a");
        let (_, at_b) = head_and_position(redis, "b");
        at_a == Some(head) && at_b == Some(head)
    })
    .await;
}

/// Two nodes; Redis killed; A changes `rt/t1` and sets `rt/t3`, B changes `rt/t1` and
/// sets `rt/t2` (QoS 0), A's QoS 1 retained `rt/refused` is refused; Redis back: new
/// subscribers on A and on B get the same retained messages, those of Redis's hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_changes_made_while_redis_was_down_converge_once_it_is_back() {
    let mut redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let mut on_a = RawClient::connect(a.mqtt, V5, "on-a").await;
    let mut on_b = RawClient::connect(b.mqtt, V5, "on-b").await;
    let code = retain(&mut on_a, "rt/t1", QoS::AtLeastOnce, "before").await;
    assert_eq!(code, ReasonCode::SUCCESS);
    until_read(&redis).await;

    redis.kill();
    // Once A's writer knows, a QoS 1 PUBLISH is refused before it is routed anywhere.
    for _ in 0..2 {
        let code = publish_acked(&mut on_a, "probe", QoS::AtLeastOnce, b"probe").await;
        assert_eq!(code, ReasonCode::UNSPECIFIED_ERROR);
    }
    let code = retain(&mut on_a, "rt/refused", QoS::AtLeastOnce, "refused").await;
    assert_eq!(code, ReasonCode::UNSPECIFIED_ERROR);
    retain(&mut on_a, "rt/t1", QoS::AtMostOnce, "a").await;
    retain(&mut on_a, "rt/t3", QoS::AtMostOnce, "a3").await;
    retain(&mut on_b, "rt/t1", QoS::AtMostOnce, "b").await;
    retain(&mut on_b, "rt/t2", QoS::AtMostOnce, "b2").await;
    failed_to_write(&a, &mut on_a).await;
    failed_to_write(&b, &mut on_b).await;
    // Meanwhile each node's own change shows there.
    assert_eq!(retained_on(&a, "look-a").await["rt/t1"], "a");
    assert_eq!(retained_on(&b, "look-b").await["rt/t1"], "b");

    redis.restart();
    until_accepted(&mut on_a).await;
    until_accepted(&mut on_b).await;
    until_read(&redis).await;

    let (on_a, on_b) = (
        retained_on(&a, "new-a").await,
        retained_on(&b, "new-b").await,
    );
    assert_eq!(on_a, on_b, "both nodes hold the same retained messages");
    let topics: Vec<&str> = on_a.keys().map(String::as_str).collect();
    assert_eq!(topics, ["rt/t1", "rt/t2", "rt/t3"]);
    assert!(["a", "b"].contains(&on_a["rt/t1"].as_str()), "{on_a:?}");
    let key = "{statehub}:mqtt:retained";
    assert_eq!(
        redis.command(&["HLEN", key]).trim(),
        ":3",
        "as Redis's hash"
    );
    let t1 = redis.command(&["HGET", key, "rt/t1"]);
    assert!(t1.ends_with(on_a["rt/t1"].as_str()), "rt/t1 as in Redis");
}
