//! With `--redis`, a client whose socket is lost, without DISCONNECT, while its state
//! store requests wait for Redis (a proxy holds its store thread's connection):
//! nothing stalls (other clients are served, and the
//! client reconnects with the same id at once), the requests still take effect once
//! Redis goes on, and nothing is left behind: the lost connection's observation is
//! dropped after its requests and before the new connection's, whose observation
//! then works; the gauges count only what is live.

mod common;
mod store_client;

use std::time::Duration;

use statehub_broker::codec::{Packet, QoS};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};
use store_client::held::{held_node, until_held};
use store_client::raw::{acks_and_answers, request};
use store_client::{StoreClient, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_lost_while_its_requests_wait_in_redis_stalls_nothing_and_leaves_nothing() {
    let redis = RedisServer::start();
    let (proxy, node, id, mut lost) = held_node(&redis).await;
    let response = format!("clients/{id}/response");
    lost.send(&request(&id, 1, &[b"KEYNOTIFY", b"k"])).await;
    assert_eq!(acks_and_answers(&mut lost, 1).await.1[&1], b"+OK\r\n");

    proxy.hold(true);
    for (n, key) in [(2u16, "k1"), (3, "k2"), (4, "k3"), (5, "k4")] {
        lost.send(&request(&id, n, &[b"SET", key.as_bytes(), b"v"]))
            .await;
    }
    assert!(until_held(&proxy, 1).await >= 1, "the SETs wait for Redis");
    // The socket goes, without DISCONNECT, while the SETs wait.
    drop(lost);

    // Other clients are served meanwhile, and the client is back at once.
    let mut sub = RawClient::connect(node.mqtt, V5, "sub").await;
    sub.subscribe("plain/t", opts(QoS::AtMostOnce)).await;
    let mut publisher = RawClient::connect(node.mqtt, V5, "pub").await;
    let during = publish("plain/t", QoS::AtMostOnce, b"during");
    publisher.send(&Packet::Publish(during)).await;
    assert_eq!(&sub.expect_publish().await.payload[..], b"during");
    let mut back = RawClient::connect(node.mqtt, V5, &id).await;
    back.subscribe(&response, opts(QoS::AtLeastOnce)).await;
    back.ping().await;
    // Behind the lost connection's requests and its observation's end (another
    // Correlation Data: the same would be a resend, answered from the cache).
    back.send(&request(&id, 101, &[b"KEYNOTIFY", b"k"])).await;
    back.expect_nothing(Duration::from_millis(200)).await;

    proxy.hold(false);
    proxy.release();
    // The lost connection's answers are published to the client id's response topic
    // first: the new connection, subscribed to it, gets them as any PUBLISH there.
    let mut answers = std::collections::BTreeMap::new();
    let mut acked = Vec::new();
    while acked.is_empty() || !answers.contains_key(&101) {
        let (mut a, more) = acks_and_answers_within(&mut back).await;
        acked.append(&mut a);
        answers.extend(more);
    }
    assert_eq!(acked, [101]);
    assert_eq!(answers[&101], b"+OK\r\n");
    assert!(answers.iter().all(|(_, a)| a == b"+OK\r\n"), "{answers:?}");
    let mut writer = StoreClient::connect(node.mqtt, "writer").await;
    for key in ["k1", "k2", "k3", "k4"] {
        let got = writer.call(&[b"GET", key.as_bytes()]).await.payload;
        assert_eq!(got, b"$1\r\nv\r\n", "the lost connection's SET of {key}");
    }
    assert_eq!(
        writer.call(&[b"SET", b"k", b"new"]).await.payload,
        b"+OK\r\n"
    );
    let notified = back.expect_within(PATIENCE).await;
    let Packet::Publish(notified) = notified else {
        panic!("expected the notification, got {notified:?}");
    };
    assert!(notified.payload.ends_with(b"$3\r\nnew\r\n"), "{notified:?}");
    back.expect_nothing(Duration::from_millis(200)).await;

    // Only the new connection's observation is left, in the node and in Redis.
    let http = node.http;
    let gauges = tokio::task::spawn_blocking(move || {
        let metric = |name| common::metric(http, name);
        (
            metric("statehub_state_store_observations"),
            metric("statehub_mqtt_connections"),
        )
    })
    .await
    .unwrap();
    assert_eq!(gauges, (1.0, 4.0), "(observations, connections)");
    assert_eq!(redis.command(&["SCARD", "{statehub}:o:k"]), ":1\r\n");
    drop(proxy);
}

/// One packet: a PUBACK's id, or an answer (acknowledged) by its Correlation Data.
async fn acks_and_answers_within(
    c: &mut RawClient,
) -> (Vec<u16>, std::collections::BTreeMap<u16, Vec<u8>>) {
    let mut answers = std::collections::BTreeMap::new();
    match c.expect_within(PATIENCE).await {
        Packet::PubAck(a) => return (vec![a.packet_id], answers),
        Packet::Publish(p) => {
            let id = p.properties.correlation_data.as_deref().unwrap();
            answers.insert(
                u16::from_be_bytes(id.try_into().unwrap()),
                p.payload.to_vec(),
            );
            let ack = statehub_broker::codec::PubResponse::ok(p.packet_id.unwrap());
            c.send(&Packet::PubAck(ack)).await;
        }
        other => panic!("expected a PUBACK or an answer, got {other:?}"),
    }
    (Vec::new(), answers)
}
