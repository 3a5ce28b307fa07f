//! With `--redis`, a state store request waiting for Redis holds up no MQTT client: the
//! node's Redis calls for the state store are made on a thread of the store's own, so
//! plain pub/sub on the node goes on while Redis stalls the store's requests.

mod common;
mod store_client;

use std::time::Duration;

use statehub_broker::codec::{Packet, QoS};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};
use store_client::{Call, StoreClient, PATIENCE};

/// Waits until some client of `redis` is held by `CLIENT PAUSE` on a script call (a
/// state store request reached Redis and waits there).
async fn a_script_call_is_paused(redis: &RedisServer) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let list = redis.command(&["CLIENT", "LIST"]);
        let paused = list.lines().any(|l| {
            let flag = l.split(' ').find_map(|f| f.strip_prefix("flags="));
            l.contains(" cmd=evalsha ") && flag.is_some_and(|f| f.contains('b'))
        });
        if paused {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no state store request reached the paused Redis:\n{list}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_sub_on_the_node_goes_on_while_its_state_store_waits_for_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    // One MQTT worker thread, and a Redis call timeout far beyond the test: a request
    // that blocked that thread on Redis would hold up every client of the node.
    let node = common::start_configured(
        "[cluster]\ntimeout_ms = 600000\n",
        &["--redis", &url, "--node-id", "a", "--mqtt-threads", "1"],
    );
    let mut store = StoreClient::connect(node.mqtt, "store").await;
    assert_eq!(store.call(&[b"SET", b"k", b"v"]).await.payload, b"+OK\r\n");
    let mut sub = RawClient::connect(node.mqtt, V5, "sub").await;
    sub.subscribe("plain/t", opts(QoS::AtMostOnce)).await;
    let mut publisher = RawClient::connect(node.mqtt, V5, "pub").await;
    publisher
        .send(&Packet::Publish(publish(
            "plain/t",
            QoS::AtMostOnce,
            b"before",
        )))
        .await;
    assert_eq!(&sub.expect_publish().await.payload[..], b"before");

    // Writes (scripts included) wait; the MQTT fabric's local QoS 0 delivery needs none.
    assert_eq!(
        redis.command(&["CLIENT", "PAUSE", "600000", "WRITE"]),
        "+OK\r\n"
    );
    let stuck = store.send(Call::new(&[b"SET", b"k", b"during"])).await;
    a_script_call_is_paused(&redis).await;
    publisher
        .send(&Packet::Publish(publish(
            "plain/t",
            QoS::AtMostOnce,
            b"during",
        )))
        .await;
    let during = sub.expect_within(PATIENCE).await;
    let Packet::Publish(during) = during else {
        panic!("expected a PUBLISH, got {during:?}");
    };
    assert_eq!(&during.payload[..], b"during");

    // The stuck request is answered once Redis goes on, with its write done.
    assert_eq!(redis.command(&["CLIENT", "UNPAUSE"]), "+OK\r\n");
    let answers = store.answers(stuck, 1).await;
    assert_eq!(answers[0].payload, b"+OK\r\n");
    assert_eq!(
        store.call(&[b"GET", b"k"]).await.payload,
        b"$6\r\nduring\r\n"
    );
}
