//! With `--redis`, a state store request waiting for Redis holds up no MQTT client: the
//! node's Redis calls for the state store are made on a thread of the store's own, so
//! plain pub/sub on the node goes on while Redis stalls the store's requests; several
//! clients' requests are in Redis at once, each on a connection of its own; and one
//! client's pipelined requests are all taken while its first waits in Redis, and
//! answered and acknowledged in its order.

mod common;
mod store_client;

use std::time::Duration;

use statehub_broker::codec::{Packet, QoS};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, publish, RawClient, V5};
use store_client::raw::{acks_and_answers, request, script_calls_paused};
use store_client::{Call, StoreClient, PATIENCE};

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
    script_calls_paused(&redis, 1).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clients_requests_wait_in_redis_at_once() {
    let redis = RedisServer::start();
    let url = redis.url();
    let node = common::start_configured(
        "[cluster]\ntimeout_ms = 600000\n",
        &["--redis", &url, "--node-id", "a"],
    );
    let mut clients = Vec::new();
    for i in 0..8 {
        let mut client = StoreClient::connect(node.mqtt, &format!("client-{i}")).await;
        let key = format!("k{i}");
        let set = client.call(&[b"SET", key.as_bytes(), b"v"]).await;
        assert_eq!(set.payload, b"+OK\r\n");
        clients.push(client);
    }

    // With every script held in Redis, the clients' SETs are sent: more than one of
    // them reaches Redis and waits there at the same time.
    assert_eq!(
        redis.command(&["CLIENT", "PAUSE", "600000", "WRITE"]),
        "+OK\r\n"
    );
    let mut stuck = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let key = format!("k{i}");
        stuck.push(
            client
                .send(Call::new(&[b"SET", key.as_bytes(), b"w"]))
                .await,
        );
    }
    script_calls_paused(&redis, 2).await;
    // The metrics endpoint reads the store without waiting for its round trips.
    let http = node.http;
    let scrape = tokio::task::spawn_blocking(move || common::scrape(http))
        .await
        .unwrap();
    assert!(
        scrape.contains("statehub_state_store_requests_total{command=\"set\",result=\"ok\"} 8"),
        "{scrape}"
    );

    assert_eq!(redis.command(&["CLIENT", "UNPAUSE"]), "+OK\r\n");
    for (client, id) in clients.iter_mut().zip(stuck) {
        assert_eq!(client.answers(id, 1).await[0].payload, b"+OK\r\n");
    }
    for (i, client) in clients.iter_mut().enumerate() {
        let key = format!("k{i}");
        assert_eq!(
            client.call(&[b"GET", key.as_bytes()]).await.payload,
            b"$1\r\nw\r\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_pipelined_requests_are_taken_while_its_first_waits_in_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let node = common::start_configured(
        "[cluster]\ntimeout_ms = 600000\n",
        &["--redis", &url, "--node-id", "a"],
    );
    let mut c = RawClient::connect(node.mqtt, V5, "piper").await;
    c.subscribe("clients/piper/response", opts(QoS::AtLeastOnce))
        .await;
    // SET k1, GET k1, SET k2, GET k2, ...: each GET must see its SET.
    let keys: Vec<String> = (1..=4).map(|i| format!("k{i}")).collect();
    let mut calls: Vec<Vec<&[u8]>> = Vec::new();
    for key in &keys {
        calls.push(vec![b"SET", key.as_bytes(), key.as_bytes()]);
        calls.push(vec![b"GET", key.as_bytes()]);
    }

    assert_eq!(
        redis.command(&["CLIENT", "PAUSE", "600000", "WRITE"]),
        "+OK\r\n"
    );
    for (i, args) in calls.iter().enumerate() {
        let id = u16::try_from(i + 1).unwrap();
        c.send(&request("piper", id, args)).await;
    }
    script_calls_paused(&redis, 1).await;
    // The connection read them all (and this PINGREQ behind them) while the first
    // waits in Redis; nothing is acknowledged before its answer.
    c.ping().await;
    c.expect_nothing(Duration::from_millis(300)).await;

    assert_eq!(redis.command(&["CLIENT", "UNPAUSE"]), "+OK\r\n");
    let (acked, answers) = acks_and_answers(&mut c, calls.len()).await;
    let ids: Vec<u16> = (1..=u16::try_from(calls.len()).unwrap()).collect();
    assert_eq!(acked, ids, "PUBACKs in the order of the requests");
    for (i, key) in keys.iter().enumerate() {
        let set = u16::try_from(2 * i + 1).unwrap();
        assert_eq!(answers[&set], b"+OK\r\n");
        let got = format!("${}\r\n{key}\r\n", key.len());
        assert_eq!(answers[&(set + 1)], got.as_bytes(), "the GET saw its SET");
    }
}
