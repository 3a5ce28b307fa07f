//! The replay into a session that moved here gives it no message its copy holds, or
//! held and saw acknowledged, whatever bound the old node left: each interleaving of
//! publishing on the old node, its hand-over (or death) and the new node's claim is
//! driven in order against a real redis-server.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use redis::Commands;
use statehub_broker::codec::QoS;
use statehub_broker::{Gate, SessionChange, SessionStore};
use statehub_redis_common::test_server::RedisServer;

use super::fetch::{claim, install, Claim, Resume};
use super::late_tests::{append, payloads};
use super::tests::{connect, message, queue, save_subscribed, store, store_with, PREFIX};
use super::{RedisSessions, Wait};

/// How the old node let the session go.
#[derive(Clone, Copy, Debug)]
enum Left {
    /// Released at the request entry without a bound (Redis did not answer its
    /// flush, or a takeover announcement rather than a request ended its copy).
    Unbounded,
    /// Died; its last position mark is before its last messages.
    Died,
}

/// On node a, the session "mover" (subscribed to `t`) gets two messages published
/// there: `held` (its copy still queued) and `acked` (acknowledged before a's reader
/// read its entry back); `late` is published on a after the session left it, and
/// `other` on node c. Every entry is appended after the point the next node replays
/// from. Node b claims the session: only `late` and `other` are replayed.
async fn replayed_after(left: Left) -> (RedisSessions, Vec<String>) {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    save_subscribed(&a, "mover", 7, QoS::ExactlyOnce);
    let (held, acked, late, other) = (
        message(b"held"),
        message(b"acked"),
        message(b"late"),
        message(b"other"),
    );
    // Routed on a (both copies stored as one QoS 2 PUBLISH's group would be), then
    // forwarded: their entries carry the origins a's sessions store them under.
    a.begin_group();
    queue(&a, 7, 1, &held);
    queue(&a, 7, 2, &acked);
    a.end_group();
    let held_origin = a.inner.origin(&held);
    let acked_origin = a.inner.origin(&acked);
    a.record(SessionChange::MessageDone {
        incarnation: 7,
        seq: 2,
        msg: &acked,
    });
    a.barrier().await.unwrap();
    // Where the next node replays from: b's request, or a's last position mark.
    let from: String = redis::cmd("XADD")
        .arg(format!("{PREFIX}feed"))
        .arg("*")
        .arg(&["n", "b#1", "t", "h", "c", "mover", "i", "7"])
        .query(&mut con)
        .unwrap();
    append(&mut con, "a#1", &held, &held_origin);
    append(&mut con, "a#1", &acked, &acked_origin);
    append(&mut con, "a#1", &late, &a.inner.origin(&late));
    let last = append(&mut con, "c#1", &other, &a.inner.origin(&other));
    let owner = match left {
        Left::Unbounded => {
            a.inner
                .released(7, &from, std::slice::from_ref(&held), None);
            ""
        }
        Left::Died => {
            a.inner.applied(&from);
            "a#1"
        }
    };
    a.barrier().await.unwrap();
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:7")).unwrap();
    assert!(
        fields.iter().any(|f| f.starts_with("o:")),
        "the acknowledged message left a tombstone: {fields:?}"
    );

    let b = store(&redis, "b#1");
    b.inner.fetcher.cut.lock().last_id = Some(last);
    let broker = statehub_broker::Broker::new(statehub_broker::BrokerConfig::default());
    broker.set_session_store(Arc::new(b.clone()), Vec::new());
    let Ok(Claim::Taken {
        from,
        loaded,
        settled,
    }) = claim(&mut con, &b.inner, "mover", 7, owner, true)
    else {
        panic!("b takes the session ({left:?})");
    };
    let resume = Resume {
        from: &from,
        settled: settled.as_ref(),
    };
    // As a fetch does, on a thread that may block (it waits for the stream writer).
    let joined = tokio::task::block_in_place(|| {
        install(&b.inner, &broker, &mut con, "mover", 7, resume, &loaded)
    });
    assert!(joined.unwrap(), "b holds the session ({left:?})");
    b.barrier().await.unwrap();
    let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:7")).unwrap();
    assert!(
        fields.iter().any(|f| f.starts_with("o:")),
        "the tombstones stay while b holds the session: {fields:?}"
    );
    // What the session holds now, by payload: its copy of `held`, and the replayed.
    let payloads = payloads(&mut con, 7);
    (b, payloads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_session_released_without_a_bound_is_replayed_only_what_it_did_not_have() {
    let (b, payloads) = replayed_after(Left::Unbounded).await;
    assert_eq!(b.counters().replayed.load(Ordering::Relaxed), 2);
    assert_eq!(payloads, ["held", "late", "other"], "each once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_dead_nodes_session_is_replayed_only_what_it_did_not_have() {
    let (b, payloads) = replayed_after(Left::Died).await;
    assert_eq!(b.counters().replayed.load(Ordering::Relaxed), 2);
    assert_eq!(payloads, ["held", "late", "other"], "each once");
}

/// A tombstone stays only until the node's reader reads the message's entry back (its
/// position mark then covers it); one left for a message read back already is none.
#[tokio::test(flavor = "current_thread")]
async fn a_tombstone_goes_once_its_entry_is_read_back() {
    let redis = RedisServer::start();
    let mut con = connect(&redis);
    let a = store(&redis, "a#1");
    save_subscribed(&a, "c", 3, QoS::ExactlyOnce);
    let (first, second) = (message(b"first"), message(b"second"));
    a.begin_group();
    queue(&a, 3, 1, &first);
    queue(&a, 3, 2, &second);
    a.end_group();
    let first_origin = a.inner.origin(&first);
    let second_origin = a.inner.origin(&second);
    // `second` is read back before its acknowledgement: no tombstone.
    let origin = |id: &[u8]| super::origin_of(id).unwrap();
    a.inner.read_back(&[origin(&second_origin)]);
    for (seq, msg) in [(1, &first), (2, &second)] {
        a.record(SessionChange::MessageDone {
            incarnation: 3,
            seq,
            msg,
        });
    }
    a.barrier().await.unwrap();
    let tombstones = |con: &mut redis::Connection| -> Vec<String> {
        let fields: Vec<String> = con.hkeys(format!("{PREFIX}s:3")).unwrap();
        fields.into_iter().filter(|f| f.starts_with("o:")).collect()
    };
    let first_hex = String::from_utf8(first_origin.clone()).unwrap();
    assert_eq!(tombstones(&mut con), [format!("o:{first_hex}")]);
    a.inner.read_back(&[origin(&first_origin)]);
    a.barrier().await.unwrap();
    assert!(tombstones(&mut con).is_empty());
}

/// Whether `gate` opens within 20 s.
async fn open_within(gate: &Arc<Gate>) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !gate.is_open() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    gate.is_open()
}

/// The QoS 2 copies the reader stores for messages from other nodes wait behind the
/// gate of its group until the group (with the position mark past them) is written:
/// not while Redis does not answer, at once for a group with nothing to write, and
/// for overlapping groups once the last one closes and is written.
#[tokio::test(flavor = "current_thread")]
async fn a_gated_group_opens_its_gate_once_it_is_written() {
    let mut redis = RedisServer::start();
    let a = store(&redis, "a#1");
    save_subscribed(&a, "c", 5, QoS::ExactlyOnce);
    a.barrier().await.unwrap();

    redis.kill();
    let gate = Arc::new(Gate::default());
    a.begin_group();
    queue(&a, 5, 1, &message(b"remote"));
    a.inner.end_group_gated(Some(gate.clone()));
    assert!(a.barrier().await.is_err(), "redis is down");
    assert!(!gate.is_open(), "not written: the copy waits");
    redis.restart();
    assert!(open_within(&gate).await, "written once redis is back");

    let empty = Arc::new(Gate::default());
    a.begin_group();
    a.inner.end_group_gated(Some(empty.clone()));
    assert!(empty.is_open(), "nothing to write");

    let overlapped = Arc::new(Gate::default());
    a.begin_group();
    a.begin_group();
    queue(&a, 5, 2, &message(b"later"));
    a.inner.end_group_gated(Some(overlapped.clone()));
    assert!(!overlapped.is_open(), "its changes wait in the open group");
    a.end_group();
    assert!(open_within(&overlapped).await);
}

/// A publisher's gate whose barrier failed is left to the store: it opens only once
/// every change recorded before is written (the copies behind it with their packet
/// ids), not while Redis does not answer; with the open group's changes if that holds
/// any; and after the writer's next turn if nothing waits.
#[tokio::test(flavor = "current_thread")]
async fn a_gate_left_to_the_store_opens_once_what_was_recorded_before_is_written() {
    let mut redis = RedisServer::start();
    let a = store(&redis, "a#1");
    save_subscribed(&a, "c", 5, QoS::ExactlyOnce);
    a.barrier().await.unwrap();

    redis.kill();
    let gate = Arc::new(Gate::default());
    a.begin_group();
    queue(&a, 5, 1, &message(b"unstored"));
    a.end_group();
    assert!(a.barrier().await.is_err(), "redis is down");
    a.open_when_stored(gate.clone());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!gate.is_open(), "not written: the copy waits");
    redis.restart();
    assert!(open_within(&gate).await, "written once redis is back");
    let fields: Vec<String> = connect(&redis).hkeys(format!("{PREFIX}s:5")).unwrap();
    assert!(fields.iter().any(|f| f == "m:1"), "{fields:?}");

    let grouped = Arc::new(Gate::default());
    a.begin_group();
    queue(&a, 5, 2, &message(b"grouped"));
    a.open_when_stored(grouped.clone());
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!grouped.is_open(), "its change waits in the open group");
    a.end_group();
    assert!(open_within(&grouped).await);

    let idle = Arc::new(Gate::default());
    a.open_when_stored(idle.clone());
    assert!(open_within(&idle).await, "nothing to wait for");
}

/// Under `--redis-wait-replicas` a gate left to the store opens only once enough
/// replicas have every change recorded before it, whether the writer's batch carried
/// changes or gates only: not while no replica is attached (`WAIT 1` never succeeds),
/// a failover could lose the copy's record; once a replica attaches, without any
/// further change recorded.
#[tokio::test(flavor = "current_thread")]
async fn under_wait_a_gate_left_to_the_store_opens_only_once_replicas_have_its_record() {
    let redis = RedisServer::start();
    let wait = Wait {
        replicas: 1,
        timeout: std::time::Duration::from_millis(20),
    };
    let a = store_with(&redis, "a#1", Some(wait));
    save_subscribed(&a, "c", 5, QoS::ExactlyOnce);
    assert!(a.barrier().await.is_err(), "no replica has it");

    let with_changes = Arc::new(Gate::default());
    a.begin_group();
    queue(&a, 5, 1, &message(b"copy"));
    a.open_when_stored(with_changes.clone());
    a.end_group();
    let gates_only = Arc::new(Gate::default());
    a.open_when_stored(gates_only.clone());
    let submitted = a.inner.state.lock().submitted;
    let mut progress = a.inner.progress.clone();
    progress.wait_for(|p| p.written >= submitted).await.unwrap();
    assert!(
        !with_changes.is_open(),
        "opened with its record on no replica"
    );
    assert!(
        !gates_only.is_open(),
        "opened with the record before on no replica"
    );

    let replica = RedisServer::start_replica_of(&redis);
    replica.wait_in_sync();
    assert!(
        open_within(&with_changes).await,
        "opens once a replica has it"
    );
    assert!(open_within(&gates_only).await);
    a.barrier().await.unwrap();
}
