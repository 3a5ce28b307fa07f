//! Two statehub nodes on one redis-server (`--redis`): one state store. A SET through
//! node A is read and notified through node B, NX contention across nodes has one
//! winner, a writer observing its own key is notified before it is answered, and a
//! killed redis-server makes state store requests fail with 503 until it is back, with
//! every acknowledged write kept.

mod common;
mod store_client;

use std::time::Duration;

use common::Server;
use statehub_redis_common::test_server::RedisServer;
use store_client::{StoreClient, LOCAL, PATIENCE};

fn node(redis: &RedisServer, id: &str, namespace: &str) -> Server {
    let config = store_client::config_file(
        &format!("cluster-{namespace}-{id}.toml"),
        &format!("[cluster]\nnamespace = \"{namespace}\"\n"),
    );
    let url = redis.url();
    let config = config.display().to_string();
    let mut args = LOCAL.to_vec();
    args.extend(["--redis", &url, "--node-id", id, "--config", &config]);
    common::start(&args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_through_one_node_is_read_and_notified_through_another() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a", "rw"), node(&redis, "b", "rw"));
    let mut writer = StoreClient::connect(a.mqtt, "writer").await;
    let mut observer = StoreClient::connect(b.mqtt, "observer").await;
    assert_eq!(
        observer.call(&[b"KEYNOTIFY", b"k"]).await.payload,
        b"+OK\r\n"
    );
    let set = writer.call(&[b"SET", b"k", b"from-a"]).await;
    assert_eq!(set.payload, b"+OK\r\n");
    let get = observer.call(&[b"GET", b"k"]).await;
    assert_eq!(get.payload, b"$6\r\nfrom-a\r\n");
    assert_eq!(get.version, set.version, "one version, wherever it is read");
    let deleted = writer.call(&[b"DEL", b"k"]).await;
    let mut notified = Vec::new();
    for _ in 0..2 {
        let n = observer
            .notification(PATIENCE)
            .await
            .expect("a notification through node b");
        let version = n.properties.as_ref().and_then(|p| {
            p.user_properties
                .iter()
                .find(|(k, _)| k == "__ts")
                .map(|(_, v)| v.clone())
        });
        notified.push((n.payload.to_vec(), version));
    }
    assert_eq!(
        notified,
        [
            (
                b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$6\r\nfrom-a\r\n".to_vec(),
                set.version
            ),
            (
                b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n".to_vec(),
                deleted.version
            ),
        ]
    );
    assert!(
        observer
            .notification(Duration::from_millis(500))
            .await
            .is_none(),
        "each change notified once"
    );
}

/// The SDK's `state_store_complicated_recv_key_notifications` stops observing as soon as
/// a write is answered: the node must have notified it by then, although it learns of
/// its own writes through the feed that every node reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_observing_its_key_is_notified_before_it_is_answered() {
    let redis = RedisServer::start();
    let a = node(&redis, "a", "order");
    let mut client = StoreClient::connect(a.mqtt, "order").await;
    assert_eq!(client.call(&[b"KEYNOTIFY", b"k"]).await.payload, b"+OK\r\n");
    for i in 0..200 {
        let value = format!("v{i}");
        let (write, answered): (&[&[u8]], &[u8]) = if i % 4 == 3 {
            (&[b"DEL", b"k"], b":1\r\n")
        } else {
            (&[b"SET", b"k", value.as_bytes()], b"+OK\r\n")
        };
        assert_eq!(client.call(write).await.payload, answered, "write {i}");
        assert_eq!(
            client.notifications.len(),
            1,
            "write {i}: its notification came before its reply"
        );
        client.notifications.clear();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nx_contention_across_nodes_has_one_winner_per_key() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a", "nx"), node(&redis, "b", "nx"));
    let contend = |addr, id: &'static str| async move {
        let mut client = StoreClient::connect(addr, id).await;
        let calls = (0..30)
            .map(|i| {
                let key = format!("lock{i}");
                store_client::Call::new(&[b"SET", key.as_bytes(), id.as_bytes(), b"NX"])
            })
            .collect();
        client.call_many(calls).await
    };
    let (from_a, from_b) = tokio::join!(contend(a.mqtt, "ca"), contend(b.mqtt, "cb"));
    for (i, (x, y)) in from_a.iter().zip(&from_b).enumerate() {
        let wins = [x, y].iter().filter(|r| r.payload == b"+OK\r\n").count();
        assert_eq!(wins, 1, "key {i}: {:?} / {:?}", x.payload, y.payload);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_answers_503_then_the_store_resumes_with_every_acknowledged_write() {
    let mut redis = RedisServer::start();
    let (a, b) = (node(&redis, "a", "down"), node(&redis, "b", "down"));
    let mut client_a = StoreClient::connect(a.mqtt, "down-a").await;
    let mut client_b = StoreClient::connect(b.mqtt, "down-b").await;
    assert_eq!(
        client_a.call(&[b"SET", b"k", b"kept"]).await.payload,
        b"+OK\r\n"
    );
    redis.kill();
    let (stat, payload) = client_b.call_status(&[b"GET", b"k"]).await;
    assert_eq!(stat.as_deref(), Some("503"), "{payload:?}");
    let (stat, _) = client_a.call_status(&[b"SET", b"k", b"lost?"]).await;
    assert_eq!(stat.as_deref(), Some("503"));
    redis.restart();
    let get = loop {
        match client_b.call_status(&[b"GET", b"k"]).await {
            (Some(stat), _) if stat == "503" => tokio::time::sleep(Duration::from_millis(50)).await,
            (stat, payload) => break (stat, payload),
        }
    };
    assert_eq!(get, (Some("200".to_owned()), b"$4\r\nkept\r\n".to_vec()));
    assert_eq!(
        client_a.call(&[b"SET", b"k", b"again"]).await.payload,
        b"+OK\r\n"
    );
    assert_eq!(
        client_b.call(&[b"GET", b"k"]).await.payload,
        b"$5\r\nagain\r\n"
    );
}
