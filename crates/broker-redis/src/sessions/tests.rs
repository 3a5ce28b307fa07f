//! The session store against a real redis-server: what it writes, bodies kept once
//! and counted, groups atomic, and changes to a session another node owns refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use redis::Commands;
use statehub_broker::codec::{ByteString, Publish, QoS};
use statehub_broker::{Gate, Message, QueuedRef, SessionChange, SessionStore, Subscription};
use statehub_redis_common::test_server::RedisServer;

use super::{Fetcher, Inner, RedisSessions, Wait};

pub(super) const PREFIX: &str = "{t}:mqtt:";

pub(super) fn store(redis: &RedisServer, owner: &str) -> RedisSessions {
    store_with(redis, owner, None)
}

/// [`store`], its batches followed by `WAIT` as `wait` asks.
pub(super) fn store_with(redis: &RedisServer, owner: &str, wait: Option<Wait>) -> RedisSessions {
    let client = redis::Client::open(redis.url()).unwrap();
    let fetcher = Fetcher {
        client: client.clone(),
        feed: format!("{PREFIX}feed"),
        seq: format!("{PREFIX}seq"),
        node: owner.into(),
        stream_len: 1000,
        timeout: Duration::from_secs(2),
        node_ttl: Duration::from_secs(1),
        cut: Arc::default(),
        pool: Default::default(),
        writer: flushed_writer(),
        hold: Arc::default(),
    };
    let inner = Inner::start(
        client,
        PREFIX.into(),
        owner.into(),
        fetcher,
        (Duration::from_secs(2), Duration::from_secs(1)),
        wait,
    )
    .unwrap();
    RedisSessions { inner }
}

/// A stream writer that has nothing to append: it answers every flush at once.
fn flushed_writer() -> std::sync::mpsc::SyncSender<crate::writer::Command> {
    let (tx, rx) = std::sync::mpsc::sync_channel(16);
    std::thread::spawn(move || {
        while let Ok(command) = rx.recv() {
            if let crate::writer::Command::Flush { reply, .. } = command {
                let _ = reply.send(Ok(()));
            }
        }
    });
    tx
}

/// A plain connection to `redis`, to look at what the store wrote.
pub(super) fn connect(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

pub(super) fn message(payload: &'static [u8]) -> Arc<Message> {
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

/// One run of the sweep script as node `owner` (at most 128 sessions), its counts.
fn sweep(con: &mut redis::Connection, owner: &str) -> (i64, i64, i64) {
    redis::Script::new(super::lua::SWEEP)
        .arg(PREFIX)
        .arg(owner)
        .arg(1000)
        .arg(128)
        .invoke(con)
        .unwrap()
}

pub(super) fn save(store: &RedisSessions, client_id: &str, incarnation: u64) {
    save_subscribed(store, client_id, incarnation, QoS::AtMostOnce);
}

/// Saves session `incarnation` of `client_id`, disconnected, subscribed to `t` at `qos`.
pub(super) fn save_subscribed(store: &RedisSessions, client_id: &str, incarnation: u64, qos: QoS) {
    let filter = ByteString::from("t");
    let options = statehub_broker::codec::SubscriptionOptions {
        qos,
        ..Default::default()
    };
    store.record(SessionChange::Saved {
        client_id,
        incarnation,
        expiry_interval: 300,
        disconnected: true,
        subscriptions: vec![(
            &filter,
            Subscription {
                options,
                identifier: None,
            },
        )],
    });
}

pub(super) fn queue(store: &RedisSessions, incarnation: u64, seq: u64, msg: &Arc<Message>) {
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
    let mut con = connect(&redis);
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
    let mut con = connect(&redis);
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

/// A node claims a session (its owner released it), and its reader applies another
/// node's request for that session before the fetch installs it: the session goes to
/// the other node, whole, and is not installed here as a copy Redis no longer lets
/// this node write.
#[tokio::test(flavor = "current_thread")]
async fn a_session_asked_for_while_it_is_claimed_here_goes_to_the_asker() {
    use super::fetch::{claim, install, Claim, Claiming, Resume};
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    save(&a, "mover", 7);
    queue(&a, 7, 1, &message(b"queued"));
    a.barrier().await.unwrap();
    // a released it (with nothing to replay).
    let () = con.hset(format!("{PREFIX}s:7"), "_o", "").unwrap();
    let b = store(&redis, "b#1");
    let broker = statehub_broker::Broker::new(statehub_broker::BrokerConfig::default());
    broker.set_session_store(Arc::new(b.clone()), Vec::new());

    let claiming = Claiming::start(&b.inner, 7);
    let Ok(Claim::Taken { from, loaded, .. }) = claim(&mut con, &b.inner, "mover", 7, "", true)
    else {
        panic!("b claims the released session");
    };
    // b's reader: c asked for it at stream entry 5-0; b does not hold it yet.
    b.inner.asked(7, "5-0");
    let resume = Resume {
        from: &from,
        settled: None,
    };
    let fetched = install(&b.inner, &broker, &mut con, "mover", 7, resume, &loaded);
    drop(claiming);
    assert!(
        fetched.unwrap(),
        "the CONNECT on b must not start a new session"
    );
    assert!(!broker.has_session("mover"), "b holds no copy");
    b.barrier().await.unwrap();

    let c = store(&redis, "c#1");
    let Ok(Claim::Taken { loaded, .. }) = claim(&mut con, &c.inner, "mover", 7, "b#1", false)
    else {
        panic!("c takes the session b released");
    };
    assert!(loaded.fields.contains_key(&b"m:1"[..]), "with its message");
}

/// A session released for a node that never claims it gets a deadline; once it is
/// past, the sweep of a live node forgets it and its body, and a node taken for dead
/// sweeps nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_released_session_nobody_claims_is_swept_with_its_bodies_at_its_deadline() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    save(&a, "gone", 9);
    queue(&a, 9, 1, &message(b"kept"));
    a.inner.released(9, "3-0", &[], None);
    a.barrier().await.unwrap();
    let dl = format!("{PREFIX}dl");
    let deadline: Option<f64> = con.zscore(&dl, "9").unwrap();
    assert!(deadline.is_some(), "released: its expiry clock runs");
    assert_eq!(bodies(&mut con).len(), 1);
    // Its deadline passes.
    let () = con.zadd(&dl, "9", 0).unwrap();
    assert_eq!(sweep(&mut con, "b#1"), (1, 0, 0), "b is not alive: fenced");
    let () = con.set(format!("{PREFIX}alive:b#1"), 1).unwrap();
    assert_eq!(sweep(&mut con, "b#1"), (0, 0, 1));
    let left: Vec<String> = con.keys(format!("{PREFIX}*")).unwrap();
    let left: Vec<&String> = left.iter().filter(|k| !k.contains("alive:")).collect();
    assert!(
        left.iter()
            .all(|k| k.ends_with("sweep") || k.contains("handoff:")),
        "{left:?}"
    );
}

/// Batches the writer wrote so far.
fn written(store: &RedisSessions) -> u64 {
    store
        .counters()
        .written
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// The message record fields of session `incarnation` in Redis.
fn records(con: &mut redis::Connection, incarnation: u64) -> Vec<String> {
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:{incarnation}")).unwrap();
    fields.into_iter().filter(|f| f.starts_with("m:")).collect()
}

/// A reply queued for a connected session and acknowledged at once costs Redis
/// nothing; one left unacknowledged is written once it is stale, and one a barrier
/// covers is written by then.
#[tokio::test(flavor = "current_thread")]
async fn queued_messages_are_written_behind_and_an_acknowledgement_cancels_the_write() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let store = store(&redis, "a#1");
    save(&store, "c", 1);
    store.barrier().await.unwrap();
    let before = written(&store);

    let acked = message(b"acked");
    queue(&store, 1, 1, &acked);
    store.record(SessionChange::MessageDone {
        incarnation: 1,
        seq: 1,
        msg: &acked,
    });
    // Long past STALE: the flusher had its chances.
    tokio::time::sleep(super::held::STALE * 6).await;
    store.barrier().await.unwrap();
    assert_eq!(
        written(&store),
        before,
        "an acknowledged message is never written"
    );
    assert!(bodies(&mut con).is_empty());

    queue(&store, 1, 2, &message(b"stale"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while records(&mut con, 1).is_empty() {
        assert!(Instant::now() < deadline, "a stale message is written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(records(&mut con, 1), ["m:2"]);

    queue(&store, 1, 3, &message(b"promised"));
    store.barrier().await.unwrap();
    let mut stored = records(&mut con, 1);
    stored.sort();
    assert_eq!(stored, ["m:2", "m:3"], "a barrier writes what is held");
    assert_eq!(bodies(&mut con).len(), 2);
}

/// A held message is written before its session's release (which fences later
/// writes), and one held when its session ends is dropped with no body left behind.
#[tokio::test(flavor = "current_thread")]
async fn held_messages_go_before_a_release_and_with_an_end() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let store = store(&redis, "a#1");
    save(&store, "moving", 1);
    save(&store, "ending", 2);
    queue(&store, 1, 1, &message(b"moves"));
    store.inner.released(1, "4-0", &[], None);
    store.barrier().await.unwrap();
    assert_eq!(records(&mut con, 1), ["m:1"], "in the released session");
    let owner: String = con.hget(format!("{PREFIX}s:1"), "_o").unwrap();
    assert_eq!(owner, "", "released");
    assert_eq!(
        store
            .counters()
            .fenced
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );

    let msg = message(b"ends");
    queue(&store, 2, 1, &msg);
    store.record(SessionChange::Ended {
        incarnation: 2,
        messages: vec![(1, &msg)],
        incoming_qos2: Vec::new(),
    });
    store.barrier().await.unwrap();
    let exists: bool = con.exists(format!("{PREFIX}s:2")).unwrap();
    assert!(!exists);
    assert_eq!(
        bodies(&mut con).len(),
        1,
        "only the released session's body"
    );
    assert_eq!(
        store
            .counters()
            .fenced
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

/// A body whose written records were all deleted is gone from Redis: a held record
/// of the same message written later brings its data again.
#[tokio::test(flavor = "current_thread")]
async fn a_held_record_written_after_its_body_left_redis_brings_the_body_again() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let store = store(&redis, "a#1");
    save(&store, "one", 1);
    save(&store, "two", 2);
    let msg = message(b"retained, say");
    queue(&store, 1, 1, &msg);
    store.barrier().await.unwrap();
    queue(&store, 2, 1, &msg);
    store.record(SessionChange::MessageDone {
        incarnation: 1,
        seq: 1,
        msg: &msg,
    });
    store.barrier().await.unwrap();
    let stored = bodies(&mut con);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let data: Option<Vec<u8>> = con.hget(&stored[0].0, "d").unwrap();
    assert!(
        data.is_some(),
        "the body of session two's record has its data"
    );
    assert_eq!(stored[0].1, 1);
}

/// A dead node's position (`pos:{owner}`) stays while a session it owned may still be
/// taken (the takeover replays from it), and goes once it owns none; that of a node
/// that died owning nothing goes at the next sweep; a live node's stays.
#[tokio::test(flavor = "current_thread")]
async fn a_dead_nodes_position_stays_while_it_owns_a_session_and_goes_after() {
    use super::fetch::{claim, Claim};
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let pos = |owner: &str| format!("{PREFIX}pos:{owner}");
    let a = store(&redis, "a#1");
    save(&a, "held", 5);
    a.inner.applied("7-0");
    a.barrier().await.unwrap();
    let c = store(&redis, "c#1");
    c.inner.applied("8-0");
    c.barrier().await.unwrap();
    let b = store(&redis, "b#1");
    b.inner.applied("9-0");
    b.barrier().await.unwrap();
    // a and c are dead (no liveness key); b is alive and sweeps.
    let () = con.set(format!("{PREFIX}alive:b#1"), 1).unwrap();
    assert_eq!(sweep(&mut con, "b#1"), (0, 0, 0));
    let exists = |con: &mut redis::Connection, key: String| -> bool { con.exists(key).unwrap() };
    assert!(exists(&mut con, pos("a#1")), "a still owns a session");
    assert!(!exists(&mut con, pos("c#1")), "c owned nothing");
    assert!(exists(&mut con, pos("b#1")), "b is alive");

    let Ok(Claim::Taken { from, .. }) = claim(&mut con, &b.inner, "held", 5, "a#1", true) else {
        panic!("b takes the dead node's session");
    };
    assert_eq!(from, "7-0", "replayed from the dead node's position");
    assert!(!exists(&mut con, pos("a#1")), "a owns nothing any more");
    assert!(exists(&mut con, pos("b#1")));
}

/// A message record refused because another node took its session writes nothing:
/// no body that no record refers to. A record of the same batch for a session this
/// node owns still gets the body the refused one carried; one of a later batch, which
/// carries no data (the body was handed over once) while Redis has none, is written
/// again with the body, before the gate of its batch opens: a copy given unstored
/// has a packet id a node its session moves to gives to another message.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_message_record_leaves_no_body_behind() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let store = store(&redis, "a#1");
    save(&store, "taken", 7);
    save(&store, "kept", 8);
    store.barrier().await.unwrap();
    let () = con.hset(format!("{PREFIX}s:7"), "_o", "b#2").unwrap();

    let alone = message(b"only for the taken one");
    store.begin_group();
    let barrier = store.barrier();
    queue(&store, 7, 1, &alone);
    store.end_group();
    assert!(barrier.await.is_err(), "refused");
    assert_eq!(bodies(&mut con), [], "no body left behind");

    let both = message(b"for both");
    store.begin_group();
    let barrier = store.barrier();
    queue(&store, 7, 2, &both);
    queue(&store, 8, 2, &both);
    store.end_group();
    assert!(barrier.await.is_err(), "the taken one's record is refused");
    let stored = bodies(&mut con);
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].1, 1, "the kept session's record refers to it");
    let data: Option<Vec<u8>> = con.hget(&stored[0].0, "d").unwrap();
    assert!(data.is_some(), "with the data the refused record carried");

    let gate = Arc::new(Gate::default());
    store.begin_group();
    let barrier = store.barrier();
    queue(&store, 8, 3, &alone);
    store.inner.end_group_gated(Some(gate.clone()));
    let written = barrier.await;
    assert!(gate.is_open());
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:8")).unwrap();
    assert!(
        fields.contains(&"m:3".to_owned()),
        "stored when its gate opened: {fields:?}"
    );
    assert!(written.is_ok(), "written again with its body");
    assert_eq!(bodies(&mut con).len(), 2, "both bodies, each referred to");
}

/// A hand-off request is numbered like every other entry (`lag.rs`), so the readers'
/// lag counts it.
#[test]
fn a_hand_off_request_is_numbered_like_every_entry() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let store = store(&redis, "b#1");
    let () = con.set(format!("{PREFIX}seq"), 41).unwrap();
    super::fetch::ask_release(&mut con, &store.inner, "mover", 7).unwrap();
    let seq: u64 = con.get(format!("{PREFIX}seq")).unwrap();
    assert_eq!(seq, 42, "the counter counts it");
    let last: redis::streams::StreamRangeReply = con
        .xrevrange_count(format!("{PREFIX}feed"), "+", "-", 1)
        .unwrap();
    let entry = &last.ids[0];
    let field = |name: &str| entry.get::<String>(name);
    assert_eq!(field("t").as_deref(), Some("h"));
    assert_eq!(field("c").as_deref(), Some("mover"));
    assert_eq!(field("i").as_deref(), Some("7"));
    assert_eq!(field("q").as_deref(), Some("42"), "it carries its number");
}
