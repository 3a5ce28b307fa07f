//! The committer against a backend that records what it is asked, can be held inside
//! a commit, and fails on cue: group commit, order, the sync policies, failure, close and
//! back-pressure, without depending on disk timing.

use std::sync::mpsc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use super::*;
use crate::error::StorageError;
use crate::table::Table;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Commit {
        ops: usize,
        sync: bool,
    },
    /// A commit attempt that found no room, and its operations.
    NoSpace {
        ops: usize,
    },
    Sync,
}

#[derive(Default)]
struct Script {
    /// Commit number (0-based) that fails.
    fail_commit: Option<usize>,
    fail_sync: bool,
    /// While set, every commit fails as a write to a full disk does.
    full: Arc<std::sync::atomic::AtomicBool>,
    /// When set, each commit announces itself and waits for a permit.
    gate: Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>,
}

struct Fake {
    log: Arc<Mutex<Vec<Event>>>,
    script: Script,
    commits: usize,
}

impl Backend for Fake {
    fn commit(&mut self, batches: &[Batch], sync: bool) -> Result<(), BackendError> {
        if let Some((started, permits)) = &self.script.gate {
            let _ = started.send(());
            let _ = permits.recv();
        }
        let ops = batches.iter().map(Batch::len).sum();
        if self.script.full.load(std::sync::atomic::Ordering::Acquire) {
            self.log.lock().push(Event::NoSpace { ops });
            let enospc = std::io::Error::from(std::io::ErrorKind::StorageFull);
            return Err(BackendError::write(enospc));
        }
        let n = self.commits;
        self.commits += 1;
        if self.script.fail_commit == Some(n) {
            return Err("injected commit failure".into());
        }
        self.log.lock().push(Event::Commit { ops, sync });
        Ok(())
    }

    fn sync(&mut self) -> Result<(), BackendError> {
        if self.script.fail_sync {
            return Err("injected sync failure".into());
        }
        self.log.lock().push(Event::Sync);
        Ok(())
    }
}

struct Harness {
    shared: Arc<Shared>,
    log: Arc<Mutex<Vec<Event>>>,
    thread: Option<JoinHandle<()>>,
    table: Table,
}

impl Harness {
    fn start(policy: SyncPolicy, script: Script, max_pending_bytes: usize) -> Self {
        let shared = Arc::new(Shared::new(max_pending_bytes, 0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let backend = Fake {
            log: log.clone(),
            script,
            commits: 0,
        };
        let thread = std::thread::spawn({
            let shared = shared.clone();
            move || run(shared, backend, policy)
        });
        Self {
            shared,
            log,
            thread: Some(thread),
            table: Table::for_test("t", 0),
        }
    }

    fn batch(&self, n: usize) -> Batch {
        let mut batch = Batch::new();
        for i in 0..n {
            batch
                .put(&self.table, format!("k{i}").as_bytes(), b"0123456789")
                .unwrap();
        }
        batch
    }

    fn events(&self) -> Vec<Event> {
        self.log.lock().clone()
    }

    fn close(&mut self) {
        self.shared.request_close();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

fn gated() -> (Script, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (started_tx, started_rx) = mpsc::channel();
    let (permit_tx, permit_rx) = mpsc::channel();
    (
        Script {
            gate: Some((started_tx, permit_rx)),
            ..Script::default()
        },
        started_rx,
        permit_tx,
    )
}

#[test]
fn batches_that_wait_share_one_commit_and_complete_in_order() {
    let (script, started, permits) = gated();
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let first = h.shared.submit(h.batch(1)).unwrap();
    started.recv().unwrap();
    // The committer is inside the first commit: everything submitted now waits for it.
    let rest: Vec<u64> = (0..50)
        .map(|_| h.shared.submit(h.batch(2)).unwrap())
        .collect();
    assert_eq!(first, 1);
    assert_eq!(rest, (2..=51).collect::<Vec<_>>());
    assert_eq!(h.shared.durable_seq(), 0);
    permits.send(()).unwrap();
    h.shared.wait_blocking(first).unwrap();
    started.recv().unwrap();
    assert_eq!(
        h.shared.durable_seq(),
        1,
        "the second group is not durable before its commit"
    );
    permits.send(()).unwrap();
    h.shared.wait_blocking(51).unwrap();
    assert_eq!(
        h.events(),
        vec![
            Event::Commit { ops: 1, sync: true },
            Event::Commit {
                ops: 100,
                sync: true
            }
        ]
    );
    drop(permits);
    h.close();
}

#[test]
fn a_failed_commit_fails_its_group_and_everything_after() {
    let script = Script {
        fail_commit: Some(1),
        ..Script::default()
    };
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let ok = h.shared.submit(h.batch(1)).unwrap();
    h.shared.wait_blocking(ok).unwrap();
    let doomed = h.shared.submit(h.batch(1)).unwrap();
    let err = h.shared.wait_blocking(doomed).unwrap_err();
    assert!(matches!(err, StorageError::Failed(_)), "{err:?}");
    assert!(err.to_string().contains("injected commit failure"));
    assert!(matches!(
        h.shared.submit(h.batch(1)),
        Err(StorageError::Failed(_))
    ));
    assert!(h.shared.failure().is_some());
    // What completed before stays completed.
    h.shared.wait_blocking(ok).unwrap();
    h.close();
}

#[test]
fn interval_completes_before_the_sync_and_syncs_within_the_interval() {
    let mut h = Harness::start(
        SyncPolicy::Interval(Duration::from_millis(50)),
        Script::default(),
        usize::MAX,
    );
    let t = h.shared.submit(h.batch(3)).unwrap();
    h.shared.wait_blocking(t).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !h.events().contains(&Event::Sync) {
        assert!(
            Instant::now() < deadline,
            "no sync within 5 s of an interval=50 commit"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        h.events()[0],
        Event::Commit {
            ops: 3,
            sync: false
        }
    );
    h.close();
}

#[test]
fn interval_sync_failure_is_fatal() {
    let script = Script {
        fail_sync: true,
        ..Script::default()
    };
    let mut h = Harness::start(
        SyncPolicy::Interval(Duration::from_millis(10)),
        script,
        usize::MAX,
    );
    let t = h.shared.submit(h.batch(1)).unwrap();
    h.shared.wait_blocking(t).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.shared.failure().is_none() {
        assert!(Instant::now() < deadline, "sync failure not reported");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(
        h.shared.submit(h.batch(1)),
        Err(StorageError::Failed(_))
    ));
    h.close();
}

#[test]
fn close_commits_and_syncs_what_is_queued_then_refuses() {
    let mut h = Harness::start(
        SyncPolicy::Interval(Duration::from_secs(3600)),
        Script::default(),
        usize::MAX,
    );
    let t = h.shared.submit(h.batch(2)).unwrap();
    h.close();
    assert_eq!(h.shared.durable_seq(), t);
    assert_eq!(
        h.events().last(),
        Some(&Event::Sync),
        "close syncs an interval store"
    );
    assert!(matches!(
        h.shared.submit(h.batch(1)),
        Err(StorageError::Closed)
    ));
    assert!(matches!(
        h.shared.wait_blocking(t + 1),
        Err(StorageError::Closed)
    ));
}

#[tokio::test]
async fn admit_waits_while_the_queue_is_over_its_bound() {
    let (script, started, permits) = gated();
    let mut h = Harness::start(SyncPolicy::Always, script, 100);
    h.shared.submit(h.batch(1)).unwrap();
    started.recv().unwrap();
    // 12 bytes in the commit, 120 queued behind it: over the 100-byte bound.
    for _ in 0..10 {
        h.shared.submit(h.batch(1)).unwrap();
    }
    let shared = h.shared.clone();
    let admitted = tokio::spawn(async move { shared.admit().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !admitted.is_finished(),
        "admitted while 132 bytes were pending"
    );
    permits.send(()).unwrap();
    started.recv().unwrap();
    permits.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), admitted)
        .await
        .unwrap()
        .unwrap();
    drop(permits);
    h.close();
}

#[tokio::test]
async fn async_waiters_see_progress_and_failure() {
    let script = Script {
        fail_commit: Some(1),
        ..Script::default()
    };
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let a = h.shared.submit(h.batch(1)).unwrap();
    tokio::time::timeout(Duration::from_secs(5), h.shared.wait(a))
        .await
        .unwrap()
        .unwrap();
    let b = h.shared.submit(h.batch(1)).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(5), h.shared.wait(b))
        .await
        .unwrap();
    assert!(matches!(err, Err(StorageError::Failed(_))));
    h.close();
}

/// Waiters on two runtime threads, many per commit group, all complete; each thread
/// reaches the committer through one relay (see `relay.rs`), and the relay forwards the
/// store's closing to the waiters left.
#[test]
fn waiters_on_several_threads_complete_through_their_relays() {
    let (script, started, permits) = gated();
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let first = h.shared.submit(h.batch(1)).unwrap();
    started.recv().unwrap();
    // The first commit is held open: every ticket below waits on the relays.
    let tickets: Vec<u64> = (0..200)
        .map(|_| h.shared.submit(h.batch(1)).unwrap())
        .collect();
    let threads: Vec<_> = tickets
        .chunks(100)
        .map(|chunk| {
            let shared = h.shared.clone();
            let chunk = chunk.to_vec();
            std::thread::spawn(move || {
                on_own_runtime(async move {
                    let relay = crate::relay::local(&shared).unwrap();
                    assert!(Arc::ptr_eq(&relay, &crate::relay::local(&shared).unwrap()));
                    let waits: Vec<_> = chunk
                        .into_iter()
                        .map(|seq| {
                            let shared = shared.clone();
                            tokio::spawn(async move { shared.wait(seq).await })
                        })
                        .collect();
                    for wait in waits {
                        tokio::time::timeout(Duration::from_secs(5), wait)
                            .await
                            .unwrap()
                            .unwrap()
                            .unwrap();
                    }
                });
            })
        })
        .collect();
    permits.send(()).unwrap(); // the first commit
    started.recv().unwrap();
    permits.send(()).unwrap(); // the 200 queued behind it, as one group
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(h.shared.durable_seq() >= first + 200);
    drop(permits);
    // A waiter for a ticket that will never come sees the close through its relay.
    let shared = h.shared.clone();
    let late = std::thread::spawn(move || {
        on_own_runtime(async move {
            tokio::time::timeout(Duration::from_secs(5), shared.wait(u64::MAX)).await
        })
    });
    std::thread::sleep(Duration::from_millis(50));
    h.close();
    assert!(matches!(
        late.join().unwrap(),
        Ok(Err(StorageError::Closed))
    ));
}

/// Runs `task` to completion on a new single-threaded runtime of the calling thread (so
/// its waiters get that thread's relay).
fn on_own_runtime<T>(task: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(task)
}

/// A write to a full disk: the store says it is stalled (and why), keeps accepting and
/// queueing batches, admission no longer waits, and nothing completes; once there is
/// room the same batches are written, everything completes in order and the stall ends.
#[tokio::test]
async fn a_full_disk_stalls_writes_until_there_is_room_again() {
    let full = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let script = Script {
        full: full.clone(),
        ..Script::default()
    };
    let mut h = Harness::start(SyncPolicy::Always, script, 100);
    let first = h.shared.submit(h.batch(3)).unwrap();
    let stalled = h.shared.clone();
    tokio::time::timeout(Duration::from_secs(5), async move {
        while stalled.stall_error().is_none() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("no stall reported");
    let err = h.shared.stall_error().unwrap();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err}");
    // Over the 100-byte bound, yet admission does not wait: callers refuse writes now.
    let later: Vec<u64> = (0..20)
        .map(|_| h.shared.submit(h.batch(1)).unwrap())
        .collect();
    tokio::time::timeout(Duration::from_secs(5), h.shared.admit())
        .await
        .expect("admission waited during a stall");
    assert_eq!(h.shared.durable_seq(), 0);
    let waiter = {
        let shared = h.shared.clone();
        let last = *later.last().unwrap();
        tokio::spawn(async move { shared.wait(last).await })
    };
    full.store(false, std::sync::atomic::Ordering::Release);
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("writes did not go on once there was room")
        .unwrap()
        .unwrap();
    assert!(h.shared.stall_error().is_none());
    tokio::time::timeout(Duration::from_secs(5), h.shared.unstalled())
        .await
        .unwrap();
    let events = h.events();
    let attempts: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::NoSpace { .. }))
        .collect();
    assert!(!attempts.is_empty());
    assert!(
        attempts.iter().all(|e| **e == Event::NoSpace { ops: 3 }),
        "the same batch is tried again: {events:?}"
    );
    let commits: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::Commit { .. }))
        .collect();
    assert_eq!(commits[0], &Event::Commit { ops: 3, sync: true });
    assert_eq!(first, 1);
    h.close();
}

/// Closing while the disk is full gives up after one more attempt: the store fails
/// with the cause (nothing it held was acknowledged) instead of hanging.
#[test]
fn closing_during_a_stall_fails_the_store_instead_of_hanging() {
    let full = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let script = Script {
        full,
        ..Script::default()
    };
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let t = h.shared.submit(h.batch(1)).unwrap();
    while h.shared.stall_error().is_none() {
        std::thread::yield_now();
    }
    h.close();
    let err = h.shared.wait_blocking(t).unwrap_err();
    assert!(matches!(err, StorageError::Failed(_)), "{err}");
}

/// Any other failure is not retried: one attempt, then the store is failed.
#[test]
fn other_failures_are_not_retried() {
    let script = Script {
        fail_commit: Some(0),
        ..Script::default()
    };
    let mut h = Harness::start(SyncPolicy::Always, script, usize::MAX);
    let t = h.shared.submit(h.batch(1)).unwrap();
    assert!(h.shared.wait_blocking(t).is_err());
    assert!(h.shared.stall_error().is_none());
    assert!(h.events().is_empty(), "{:?}", h.events());
    h.close();
}
