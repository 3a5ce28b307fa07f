//! The state store over a data directory (`--data-dir`), end to end over MQTT: replies
//! leave only once their write is on disk, everything acknowledged survives a restart,
//! keys that expired while the server was down are gone, notifications keep version
//! order through group commits, a failed store answers 503, and a full disk refuses
//! writes, answers reads and recovers by itself.
//!
//! A restart is a fresh tokio runtime on the same directory: dropping the previous
//! runtime drops every task, hence the service and its store (releasing the lock).

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{now_ts, resp, start_durable, user1, Client, Seen};
use statehub_state_store_durable::ENTRIES_TABLE;
use statehub_state_store_service::Settings;
use statehub_storage::{Options, Store};

/// Runs one server lifetime on `dir`: starts it, runs `f`, then drops everything.
fn lifetime<T, F: Future<Output = T>>(dir: &Path, f: impl FnOnce(SocketAddr, Store) -> F) -> T {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let out = runtime.block_on(async {
        let store = Store::open(dir, Options::default()).unwrap();
        let (_broker, addr) = start_durable(Settings::default(), &store).await;
        f(addr, store).await
    });
    drop(runtime);
    out
}

#[test]
fn a_reply_leaves_only_once_its_write_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    lifetime(dir.path(), |addr, store| async move {
        let mut c = Client::connect(addr, "durable-commit").await;
        let table = store.table(ENTRIES_TABLE).unwrap();
        for i in 0..20u8 {
            let key = [b'k', i];
            let set = c
                .call(&resp(&[b"SET", &key, b"v"]), i, Some(now_ts()))
                .await;
            assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
            assert!(
                table.get(&key).unwrap().is_some(),
                "SET {i} answered before it was committed"
            );
        }
        assert_eq!(store.durable_seq(), store.last_seq());
    });
}

#[test]
fn acknowledged_writes_survive_a_restart_and_keys_expired_meanwhile_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let before = lifetime(dir.path(), |addr, _store| async move {
        let mut c = Client::connect(addr, "durable-restart").await;
        let mut versions = Vec::new();
        for (i, args) in [
            &[&b"SET"[..], b"plain", b"one"][..],
            &[b"SET", b"plain", b"two"],
            &[b"SET", b"later", b"v", b"PX", b"600000"],
            &[b"SET", b"brief", b"v", b"PX", b"200"],
            &[b"SET", b"deleted", b"v"],
            &[b"DEL", b"deleted"],
        ]
        .into_iter()
        .enumerate()
        {
            let r = c.call(&resp(args), i as u8, Some(now_ts())).await;
            assert_eq!(user1(&r, "__stat").as_deref(), Some("200"));
            versions.push(user1(&r, "__ts").unwrap());
        }
        versions
    });
    std::thread::sleep(Duration::from_millis(300));
    lifetime(dir.path(), |addr, _store| async move {
        let mut c = Client::connect(addr, "durable-restart").await;
        let get = c.call(&resp(&[b"GET", b"plain"]), 1, None).await;
        assert_eq!(get.payload, Bytes::from_static(b"$3\r\ntwo\r\n"));
        assert_eq!(
            user1(&get, "__ts").as_ref(),
            Some(&before[1]),
            "the version changed across the restart"
        );
        let get = c.call(&resp(&[b"GET", b"later"]), 2, None).await;
        assert_eq!(user1(&get, "__ts").as_ref(), Some(&before[2]));
        for (i, key) in [&b"brief"[..], b"deleted"].into_iter().enumerate() {
            let get = c.call(&resp(&[b"GET", key]), 3 + i as u8, None).await;
            assert_eq!(
                get.payload,
                Bytes::from_static(b"$-1\r\n"),
                "{}",
                key.escape_ascii()
            );
        }
        let set = c
            .call(&resp(&[b"SET", b"new", b"v"]), 9, Some(now_ts()))
            .await;
        let version = user1(&set, "__ts").unwrap();
        assert!(
            before.iter().all(|v| *v < version),
            "{version} is not above {before:?}"
        );
    });
}

#[test]
fn notifications_keep_version_order_through_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    lifetime(dir.path(), |addr, _store| async move {
        let mut observer = Client::connect(addr, "durable-observer").await;
        observer.call(&resp(&[b"KEYNOTIFY", b"hot"]), 1, None).await;
        let writers: Vec<_> = (0..4)
            .map(|w| {
                tokio::spawn(async move {
                    let mut c = Client::connect(addr, &format!("durable-writer-{w}")).await;
                    for i in 0..30u8 {
                        let r = c
                            .call(&resp(&[b"SET", b"hot", &[w, i]]), i, Some(now_ts()))
                            .await;
                        assert_eq!(r.payload, Bytes::from_static(b"+OK\r\n"));
                    }
                })
            })
            .collect();
        let mut last = String::new();
        for n in 0..120 {
            let note = observer.next_publish().await;
            let version = user1(&note, "__ts").unwrap();
            assert!(version > last, "notification {n}: {version} after {last}");
            last = version;
        }
        for w in writers {
            w.await.unwrap();
        }
        observer.expect_quiet().await;
    });
}

#[test]
fn a_failed_store_answers_503() {
    let dir = tempfile::tempdir().unwrap();
    lifetime(dir.path(), |addr, store| async move {
        let mut c = Client::connect(addr, "durable-failed").await;
        let ok = c
            .call(&resp(&[b"SET", b"k", b"v"]), 1, Some(now_ts()))
            .await;
        assert_eq!(user1(&ok, "__stat").as_deref(), Some("200"));
        store.close().unwrap();
        for (i, request) in [resp(&[b"SET", b"k", b"w"]), resp(&[b"GET", b"k"])]
            .iter()
            .enumerate()
        {
            let r = c.call(request, 2 + i as u8, Some(now_ts())).await;
            assert_eq!(user1(&r, "__stat").as_deref(), Some("503"));
            assert!(r.payload.is_empty());
        }
        // A duplicate of the acknowledged request is not answered from the cache either.
        let again = c
            .call(&resp(&[b"SET", b"k", b"v"]), 1, Some(now_ts()))
            .await;
        assert_eq!(user1(&again, "__stat").as_deref(), Some("503"));
    });
}

/// A full disk (injected: every commit fails as a write to a full disk does). The SET
/// written as it filled waits for its write, and so does a read of it, until there is
/// room again; its client's later requests are taken meanwhile (its connection reads
/// on; their acknowledgements wait behind the SET's). A write made during the stall is
/// refused at once with the reason, a read of durable data answered at once. Once there
/// is room, the waiting replies arrive, in order, and writes are taken again, without a
/// restart.
#[test]
fn a_full_disk_refuses_writes_answers_reads_and_recovers_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    lifetime(dir.path(), |addr, store| async move {
        let mut a = Client::connect(addr, "durable-full-a").await;
        let mut b = Client::connect(addr, "durable-full-b").await;
        let ok = a
            .call(&resp(&[b"SET", b"before", b"v"]), 1, Some(now_ts()))
            .await;
        assert_eq!(ok.payload, Bytes::from_static(b"+OK\r\n"));
        store.set_disk_full(true);
        a.send(
            &resp(&[b"SET", b"during", b"w"]),
            a.props(2, Some(now_ts())),
        )
        .await;
        tokio::time::timeout(Duration::from_secs(10), async {
            while store.stall_error().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("no stall reported");
        let refused = b
            .call(&resp(&[b"SET", b"refused", b"x"]), 3, Some(now_ts()))
            .await;
        assert_eq!(user1(&refused, "__stat").as_deref(), Some("503"));
        assert!(
            user1(&refused, "__stMsg").is_some_and(|m| m.contains("disk is full")),
            "{refused:?}"
        );
        let read = b.call(&resp(&[b"GET", b"before"]), 4, None).await;
        assert_eq!(read.payload, Bytes::from_static(b"$1\r\nv\r\n"));
        b.send(&resp(&[b"GET", b"during"]), b.props(5, None)).await;
        b.expect_quiet().await;
        // A's next request is served while its SET waits.
        a.send(&resp(&[b"GET", b"before"]), a.props(6, None)).await;
        match a.next(Duration::from_secs(20)).await {
            Some(Seen::Publish(p)) => {
                assert_eq!(p.payload, Bytes::from_static(b"$1\r\nv\r\n"))
            }
            other => panic!("A's later request was not served: {other:?}"),
        }
        store.set_disk_full(false);
        let get = b.next_publish().await;
        assert_eq!(get.payload, Bytes::from_static(b"$1\r\nw\r\n"));
        let set = a.next_publish().await;
        assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
        let again = b
            .call(&resp(&[b"SET", b"refused", b"x"]), 7, Some(now_ts()))
            .await;
        assert_eq!(again.payload, Bytes::from_static(b"+OK\r\n"));
        let during = a.call(&resp(&[b"GET", b"during"]), 8, None).await;
        assert_eq!(during.payload, Bytes::from_static(b"$1\r\nw\r\n"));
    });
}
