//! The session store against a real redis-server: what it writes, bodies kept once
//! and counted, groups atomic, and changes to a session another node owns refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::Commands;
use statehub_broker::codec::{ByteString, Publish, QoS};
use statehub_broker::{Message, QueuedRef, SessionChange, SessionStore, Subscription};
use statehub_state_store_redis::test_server::RedisServer;

use super::{Fetcher, Inner, RedisSessions};

const PREFIX: &str = "{t}:mqtt:";

fn store(redis: &RedisServer, owner: &str) -> RedisSessions {
    let client = redis::Client::open(redis.url()).unwrap();
    let fetcher = Fetcher {
        client: client.clone(),
        feed: format!("{PREFIX}feed"),
        node: owner.into(),
        stream_len: 1000,
        timeout: Duration::from_secs(2),
        node_ttl: Duration::from_secs(1),
        cut: Arc::default(),
        pool: Default::default(),
        // These tests fetch nothing: no writer to flush.
        writer: std::sync::mpsc::sync_channel(1).0,
    };
    let inner = Inner::start(
        client,
        PREFIX.into(),
        owner.into(),
        fetcher,
        Duration::from_secs(2),
        None,
    )
    .unwrap();
    RedisSessions {
        inner: Arc::new(inner),
    }
}

fn message(payload: &'static [u8]) -> Arc<Message> {
    let publish = Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "t".into(),
        packet_id: Some(1),
        payload: Bytes::from_static(payload),
        properties: Default::default(),
    };
    Arc::new(Message::from_publish(publish, None, Instant::now()))
}

fn save(store: &RedisSessions, client_id: &str, incarnation: u64) {
    let filter = ByteString::from("t");
    store.record(SessionChange::Saved {
        client_id,
        incarnation,
        expiry_interval: 300,
        disconnected: true,
        subscriptions: vec![(
            &filter,
            Subscription {
                options: Default::default(),
                identifier: None,
            },
        )],
    });
}

fn queue(store: &RedisSessions, incarnation: u64, seq: u64, msg: &Arc<Message>) {
    store.record(SessionChange::Message {
        incarnation,
        seq,
        message: QueuedRef {
            msg,
            qos: QoS::AtLeastOnce,
            retain: false,
            subscription_ids: &[],
            shared: None,
        },
        released: false,
        now: Instant::now(),
    });
}

/// The body ids in Redis and their reference counts.
fn bodies(con: &mut redis::Connection) -> Vec<(String, i64)> {
    let keys: Vec<String> = con.keys(format!("{PREFIX}b:*")).unwrap();
    keys.into_iter()
        .map(|k| {
            let r: i64 = con.hget(&k, "r").unwrap_or(0);
            (k, r)
        })
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_body_is_stored_once_for_every_session_and_goes_with_its_last_record() {
    let redis = RedisServer::start();
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let store = store(&redis, "a#1");
    let msg = message(b"shared");
    save(&store, "one", 1);
    save(&store, "two", 2);
    store.begin_group();
    queue(&store, 1, 1, &msg);
    queue(&store, 2, 1, &msg);
    store.end_group();
    store.barrier().await.unwrap();
    let stored = bodies(&mut con);
    assert_eq!(stored.len(), 1, "one body for both sessions: {stored:?}");
    assert_eq!(stored[0].1, 2);
    let owners: Vec<(String, u64)> = con.hgetall(format!("{PREFIX}owners")).unwrap();
    assert_eq!(owners.len(), 2);

    store.record(SessionChange::MessageDone {
        incarnation: 1,
        seq: 1,
        msg: &msg,
    });
    store.barrier().await.unwrap();
    assert_eq!(bodies(&mut con)[0].1, 1);
    store.record(SessionChange::Ended {
        incarnation: 2,
        messages: vec![(1, &msg)],
        incoming_qos2: Vec::new(),
    });
    store.barrier().await.unwrap();
    assert!(bodies(&mut con).is_empty(), "gone with the last record");
    let exists: bool = con.exists(format!("{PREFIX}s:2")).unwrap();
    assert!(!exists);
    let owner: Option<u64> = con.hget(format!("{PREFIX}owners"), "two").unwrap();
    assert_eq!(owner, None);
    let one: Vec<String> = con.hkeys(format!("{PREFIX}s:1")).unwrap();
    assert!(!one.iter().any(|f| f.starts_with("m:")), "{one:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_change_to_a_session_another_node_owns_is_refused_and_its_barrier_fails() {
    let redis = RedisServer::start();
    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let store = store(&redis, "a#1");
    save(&store, "moved", 7);
    store.barrier().await.unwrap();
    // Another node took it.
    let () = con.hset(format!("{PREFIX}s:7"), "_o", "b#2").unwrap();
    // The barrier is taken before the change reaches the writer (while its group is
    // open), as a publisher's is before its PUBACK.
    store.begin_group();
    let barrier = store.barrier();
    queue(&store, 7, 1, &message(b"late"));
    store.end_group();
    assert!(barrier.await.is_err(), "the late change is not stored");
    assert_eq!(
        store
            .counters()
            .fenced
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:7")).unwrap();
    assert!(!fields.iter().any(|f| f.starts_with("m:")), "{fields:?}");
    // Nor does its end delete what the other node holds.
    store.begin_group();
    let barrier = store.barrier();
    store.record(SessionChange::Ended {
        incarnation: 7,
        messages: Vec::new(),
        incoming_qos2: Vec::new(),
    });
    store.end_group();
    assert!(barrier.await.is_err());
    let exists: bool = con.exists(format!("{PREFIX}s:7")).unwrap();
    assert!(exists);
}
