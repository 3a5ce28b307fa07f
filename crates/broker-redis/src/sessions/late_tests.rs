//! A message of the node a session left that reaches the stream only after another
//! node took the session (its append timed out on the old node and Redis executed it
//! later, or the old node died with it on its way): the new node's replay never sees
//! it, its reader delivers it. The reader gives the session none that its copy held
//! or saw acknowledged, and every other session each message once. Each step is
//! driven in order against a real redis-server, the new node being a whole fabric
//! (its reader and fetch as in production).

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Commands;
use statehub_broker::codec::QoS;
use statehub_broker::{Broker, BrokerConfig, Message, SessionChange, SessionStore};
use statehub_redis_common::test_server::RedisServer;

use super::fetch::{claim, install, Claim, Resume};
use super::origins::body_id;
use super::tests::{connect, message, queue, save_subscribed, store, PREFIX};
use super::RedisSessions;
use crate::{wire, Options, RedisFabric};

/// Appends a message entry of `node` with `origin`; its id.
pub(super) fn append(
    con: &mut redis::Connection,
    node: &str,
    msg: &Message,
    origin: &[u8],
) -> String {
    let data = wire::encode(msg, wire::Now::at(Instant::now())).unwrap();
    redis::cmd("XADD")
        .arg(format!("{PREFIX}feed"))
        .arg("*")
        .arg(&["n", node, "t", "p"])
        .arg("m")
        .arg(data)
        .arg("s")
        .arg("")
        .arg("o")
        .arg(origin)
        .query(con)
        .unwrap()
}

/// The payloads of the messages session `incarnation` holds in Redis, sorted.
pub(super) fn payloads(con: &mut redis::Connection, incarnation: u64) -> Vec<String> {
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:{incarnation}")).unwrap();
    let mut payloads = Vec::new();
    for field in fields.iter().filter(|f| f.starts_with("b:")) {
        let id: String = con.hget(format!("{PREFIX}s:{incarnation}"), field).unwrap();
        let data: Vec<u8> = con.hget(format!("{PREFIX}b:{id}"), "d").unwrap();
        let msg = wire::decode(&data, wire::Now::at(Instant::now()))
            .unwrap()
            .unwrap();
        payloads.push(String::from_utf8(msg.payload.to_vec()).unwrap());
    }
    payloads.sort();
    payloads
}

/// Node `node` of namespace `t` on `redis`.
fn options(redis: &RedisServer, node: &str) -> Options {
    Options {
        url: redis.url(),
        namespace: "t".into(),
        node: node.into(),
        timeout: Duration::from_secs(5),
        stream_len: 1000,
        reader_lag_limit: 500,
        queue: 64,
        wait_replicas: 0,
        wait_timeout: Duration::from_secs(1),
        node_ttl: Duration::from_secs(2),
        session_sweep: Duration::from_secs(10),
    }
}

/// How the old node let the session go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Left {
    /// Released without a bound (Redis did not answer its flush, or a takeover
    /// announcement rather than a request ended its copy).
    Unbounded,
    /// Died; its last position mark is all there is.
    Died,
    /// Released without a bound to node d, which acknowledged `held` and released
    /// it (without a bound) in turn.
    ViaD,
}

/// What the sessions hold once the new node's reader read the late entries.
struct Late {
    mover: Vec<String>,
    bystander: Vec<String>,
    b: RedisSessions,
}

/// The messages of a run, and the origins a's stream entries carry.
struct Published {
    held: Arc<Message>,
    acked: Arc<Message>,
    held_origin: Vec<u8>,
    acked_origin: Vec<u8>,
}

/// On node a, the session "mover" (subscribed to `t` at `qos`) gets two messages
/// published there, `held` (its copy still queued) and `acked` (acknowledged at
/// once); their appends do not reach Redis yet. The session leaves a (`left`); node
/// b takes it, and "bystander" (a dead node c's session, which never got either).
/// Only then are a's two entries appended, then `late` (published on a after the
/// session left) and `other` (from c), and b's reader reads them.
async fn late_after(qos: QoS, left: Left) -> Late {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    let c = store(&redis, "c#1");
    save_subscribed(&a, "mover", 7, qos);
    save_subscribed(&c, "bystander", 8, QoS::ExactlyOnce);
    let published = publish_on_a(&a, qos);
    // Where the next node replays from: its request, or the dead nodes' last marks.
    let from = ask(&mut con);
    c.inner.applied(&from);
    let held = std::slice::from_ref(&published.held);
    match left {
        Left::Unbounded | Left::ViaD => a.inner.released(7, &from, held, None),
        Left::Died => a.inner.applied(&from),
    }
    a.barrier().await.unwrap();
    c.barrier().await.unwrap();
    if left == Left::ViaD {
        via_d(&redis, &mut con, &from, &published).await;
    }

    let broker = Broker::new(BrokerConfig::default());
    let fabric = RedisFabric::start(&options(&redis, "b"), &broker).unwrap();
    let b = fabric.sessions();
    for client in ["mover", "bystander"] {
        let fetched = SessionStore::fetch(&b, &broker, client).await.unwrap();
        assert!(fetched, "b takes {client} ({qos:?}, {left:?})");
    }
    // Only now does Redis execute a's appends: b's replay did not see them.
    append(&mut con, "a", &published.held, &published.held_origin);
    append(&mut con, "a", &published.acked, &published.acked_origin);
    append(&mut con, "a", &message(b"late"), &body_id(rand::random()));
    let last = append(&mut con, "c", &message(b"other"), &body_id(rand::random()));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let read = b.inner.fetcher.cut.lock().last_id.clone();
        if read.is_some_and(|r| super::stream_id(&r) >= super::stream_id(&last)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "b's reader did not read the entries"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The reader's group (its copies and position) was closed before its cut let go.
    b.barrier().await.unwrap();
    let late = Late {
        mover: payloads(&mut con, 7),
        bystander: payloads(&mut con, 8),
        b,
    };
    broker.shutdown_token().cancel();
    late
}

/// Routes `held` and `acked` to session 7 on a: a QoS 2 PUBLISH's copies as one
/// group, QoS 1 copies held back (write-behind); then hands them to a's stream writer
/// (their origins noted there), and `acked` is acknowledged.
fn publish_on_a(a: &RedisSessions, qos: QoS) -> Published {
    let (held, acked) = (message(b"held"), message(b"acked"));
    let grouped = qos == QoS::ExactlyOnce;
    if grouped {
        a.begin_group();
    }
    queue(a, 7, 1, &held);
    queue(a, 7, 2, &acked);
    if grouped {
        a.end_group();
    }
    let held_origin = a.inner.origin(&held);
    let acked_origin = a.inner.origin(&acked);
    a.record(SessionChange::MessageDone {
        incarnation: 7,
        seq: 2,
        msg: &acked,
    });
    Published {
        held,
        acked,
        held_origin,
        acked_origin,
    }
}

/// A takeover request for session 7 on the stream; its id.
fn ask(con: &mut redis::Connection) -> String {
    redis::cmd("XADD")
        .arg(format!("{PREFIX}feed"))
        .arg("*")
        .arg(&["n", "x", "t", "h", "c", "mover", "i", "7"])
        .query(con)
        .unwrap()
}

/// Node d takes session 7 (released at `from`), its client acknowledges `held` there,
/// and d releases it without a bound in turn.
async fn via_d(redis: &RedisServer, con: &mut redis::Connection, from: &str, p: &Published) {
    let d = store(redis, "d#1");
    d.inner.fetcher.cut.lock().last_id = Some(from.to_owned());
    let broker = Broker::new(BrokerConfig::default());
    broker.set_session_store(Arc::new(d.clone()), Vec::new());
    let Ok(Claim::Taken {
        from,
        loaded,
        settled,
    }) = claim(con, &d.inner, "mover", 7, "", true)
    else {
        panic!("d takes the session");
    };
    let resume = Resume {
        from: &from,
        settled: settled.as_ref(),
    };
    let joined = tokio::task::block_in_place(|| {
        install(&d.inner, &broker, con, "mover", 7, resume, &loaded)
    });
    assert!(joined.unwrap(), "d holds the session");
    // d's copy of `held`, as its broker has it.
    let copy = {
        let state = d.inner.state.lock();
        let body = state.bodies.values().find(|b| b.id == p.held_origin);
        body.expect("d has held").msg.clone()
    };
    d.record(SessionChange::MessageDone {
        incarnation: 7,
        seq: 1,
        msg: &copy,
    });
    d.inner.released(7, &ask(con), &[], None);
    d.barrier().await.unwrap();
}

fn skipped(late: &Late) -> u64 {
    late.b
        .counters()
        .not_redelivered
        .load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_of_the_node_a_session_left_is_not_delivered_to_it_again() {
    let late = late_after(QoS::ExactlyOnce, Left::Unbounded).await;
    assert_eq!(late.mover, ["held", "late", "other"], "each once");
    assert_eq!(late.bystander, ["acked", "held", "late", "other"]);
    assert_eq!(skipped(&late), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_of_a_dead_node_is_not_delivered_to_its_session_again() {
    let late = late_after(QoS::ExactlyOnce, Left::Died).await;
    assert_eq!(late.mover, ["held", "late", "other"], "each once");
    assert_eq!(late.bystander, ["acked", "held", "late", "other"]);
    assert_eq!(skipped(&late), 2);
}

/// A QoS 1 copy acknowledged while it was still held back (never written) leaves
/// its tombstone when the session is handed over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_of_a_qos_1_message_acknowledged_unwritten_is_not_delivered_again() {
    let late = late_after(QoS::AtLeastOnce, Left::Unbounded).await;
    assert_eq!(late.mover, ["held", "late", "other"], "each once");
    assert_eq!(late.bystander, ["acked", "held", "late", "other"]);
    assert_eq!(skipped(&late), 2);
}

/// The session moved twice before a's entries came: what it saw acknowledged on a
/// and on d is known to b (tombstones kept while a node holds the session, and left
/// by d for a message d's own reader must not deliver either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_is_not_delivered_again_after_two_moves() {
    let late = late_after(QoS::ExactlyOnce, Left::ViaD).await;
    assert_eq!(late.mover, ["late", "other"], "each once");
    assert_eq!(late.bystander, ["acked", "held", "late", "other"]);
    assert_eq!(skipped(&late), 2);
}

/// A QoS 2 copy taken back because its publisher was refused leaves no trace in the
/// session (so a node it moves to gives the message, should its entry land late),
/// and this node's reader is told to give it when it reads the entry back; once it
/// read the entry back, nothing is taken back (the copy must go: nobody else would
/// give it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_copy_leaves_no_trace_and_is_left_to_the_reader_until_it_read_the_entry() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    save_subscribed(&a, "mover", 7, QoS::ExactlyOnce);
    let (refused, given, acked) = (message(b"refused"), message(b"given"), message(b"acked"));
    a.begin_group();
    queue(&a, 7, 1, &refused);
    queue(&a, 7, 2, &given);
    queue(&a, 7, 3, &acked);
    a.end_group();
    let origins = [&refused, &given, &acked].map(|m| a.inner.origin(m));
    let origin = |i: usize| super::origin_of(&origins[i]).unwrap();
    let clients: Vec<Arc<str>> = vec!["mover".into()];

    assert!(a.inner.withdraw(&refused, &clients), "not read back yet");
    a.record(SessionChange::MessageWithdrawn {
        incarnation: 7,
        seq: 1,
        msg: &refused,
    });
    // An acknowledged copy, for comparison, leaves its tombstone.
    a.record(SessionChange::MessageDone {
        incarnation: 7,
        seq: 3,
        msg: &acked,
    });
    a.barrier().await.unwrap();
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:7")).unwrap();
    let tombstones: Vec<&String> = fields.iter().filter(|f| f.starts_with("o:")).collect();
    let acked_tomb = format!("o:{}", String::from_utf8_lossy(&origins[2]));
    assert_eq!(tombstones, [&acked_tomb], "none for the withdrawn copy");
    assert_eq!(payloads(&mut con, 7), ["given"]);

    // The reader reads back the entries of `given` (before the refusal was handled)
    // and `refused`: it gives `refused` to the session it was taken from.
    let back = a.inner.read_back(&[origin(1), origin(0)]);
    assert_eq!(back, [(origin(0), clients.clone())]);
    assert!(!a.inner.withdraw(&given, &clients), "read back already");
}
