//! The store against a real data directory: what the crate docs promise about tables,
//! batches, order, reopening, the lock, refusals and concurrent writers.

use std::sync::Arc;

use statehub_storage::{
    Batch, OpenError, Options, StorageError, Store, SyncPolicy, Table, MAX_KEY_LEN,
};

fn all(table: &Table) -> Vec<(Vec<u8>, Vec<u8>)> {
    table
        .iter()
        .map(|r| r.map(|r| (r.key().to_vec(), r.value().to_vec())))
        .collect::<Result<_, _>>()
        .unwrap()
}

fn kv(k: &str, v: &str) -> (Vec<u8>, Vec<u8>) {
    (k.as_bytes().to_vec(), v.as_bytes().to_vec())
}

#[test]
fn batches_apply_in_order_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let a = store.table("a").unwrap();
        let b = store.table("b").unwrap();
        let mut first = Batch::new();
        first.put(&a, b"k1", b"one").unwrap();
        first.put(&a, b"k2", b"two").unwrap();
        first.put(&b, b"k1", b"other table").unwrap();
        first.put(&a, b"k1", b"one again").unwrap();
        let mut second = Batch::new();
        second.delete(&a, b"k2").unwrap();
        second.put(&a, b"k3", b"").unwrap();
        second.delete(&a, b"never-written").unwrap();
        let t1 = store.submit(first).unwrap();
        let t2 = store.submit(second).unwrap();
        assert_eq!((t1.seq(), t2.seq()), (1, 2));
        t2.wait().unwrap();
        assert!(t1.is_durable() && store.durable_seq() == 2 && store.last_seq() == 2);
        assert_eq!(all(&a), vec![kv("k1", "one again"), kv("k3", "")]);
        store.close().unwrap();
    }
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let a = store.table("a").unwrap();
    assert_eq!(all(&a), vec![kv("k1", "one again"), kv("k3", "")]);
    assert_eq!(
        all(&store.table("b").unwrap()),
        vec![kv("k1", "other table")]
    );
    assert_eq!(a.get(b"k1").unwrap().as_deref(), Some(&b"one again"[..]));
    assert_eq!(a.get(b"k2").unwrap(), None);
    assert!(all(&store.table("c").unwrap()).is_empty());
    let prefixed: Vec<Vec<u8>> = a.prefix(b"k3").map(|r| r.unwrap().key().to_vec()).collect();
    assert_eq!(prefixed, vec![b"k3".to_vec()]);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    match Store::open(dir.path(), Options::default()) {
        Err(OpenError::Locked { dir: d, holder }) => {
            assert_eq!(d, dir.path());
            assert_eq!(holder, format!("pid {}", std::process::id()));
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    let message = Store::open(dir.path(), Options::default())
        .unwrap_err()
        .to_string();
    assert!(message.contains("in use by another statehub"), "{message}");
    drop(store);
    Store::open(dir.path(), Options::default()).unwrap();
}

#[test]
fn oversized_keys_are_refused_and_leave_the_batch_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let t = store.table("t").unwrap();
    let mut batch = Batch::new();
    batch.put(&t, &vec![b'k'; MAX_KEY_LEN], b"v").unwrap();
    let long = vec![b'k'; MAX_KEY_LEN + 1];
    assert!(matches!(
        batch.put(&t, &long, b"v"),
        Err(StorageError::KeyTooLong { .. })
    ));
    assert!(matches!(
        batch.delete(&t, &long),
        Err(StorageError::KeyTooLong { .. })
    ));
    assert_eq!(batch.len(), 1);
    store.submit(batch).unwrap().wait().unwrap();
    assert_eq!(all(&t).len(), 1);
    assert!(store.table("").is_err());
    assert!(store.table(&"x".repeat(256)).is_err());
}

#[test]
fn concurrent_writers_all_land() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let t = store.table("t").unwrap();
    let threads: Vec<_> = (0..16)
        .map(|w| {
            let (store, t) = (store.clone(), t.clone());
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut batch = Batch::new();
                    batch
                        .put(&t, format!("w{w:02}-{i:03}").as_bytes(), &[w as u8; 100])
                        .unwrap();
                    let ticket = store.submit(batch).unwrap();
                    ticket.wait().unwrap();
                    assert!(store.durable_seq() >= ticket.seq());
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    assert_eq!(store.durable_seq(), 800);
    drop((store, t));
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(all(&store.table("t").unwrap()).len(), 800);
}

#[tokio::test]
async fn async_tickets_and_interval_policy() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        sync: SyncPolicy::Interval(std::time::Duration::from_millis(20)),
        ..Options::default()
    };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let t = store.table("t").unwrap();
    let mut tickets = Vec::new();
    for i in 0..100u32 {
        store.admit().await;
        let mut batch = Batch::new();
        batch.put(&t, &i.to_be_bytes(), b"v").unwrap();
        tickets.push(store.submit(batch).unwrap());
    }
    for ticket in &tickets {
        ticket.durable().await.unwrap();
    }
    assert_eq!(
        store
            .ticket(100)
            .durable()
            .await
            .map(|()| store.durable_seq())
            .unwrap(),
        100
    );
    store.close().unwrap();
    assert!(matches!(
        store.submit(Batch::new()),
        Err(StorageError::Closed)
    ));
    drop((store, t));
    let store = Store::open(dir.path(), options).unwrap();
    assert_eq!(all(&store.table("t").unwrap()).len(), 100);
}

#[test]
fn empty_store_reports_no_recovery_and_holds_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(dir.path(), Options::default()).unwrap());
    assert!(store.recovery().truncated_journals.is_empty());
    let pid = std::fs::read_to_string(dir.path().join("LOCK")).unwrap();
    assert_eq!(pid.trim(), std::process::id().to_string());
    assert!(store.failure().is_none());
}

/// A store restarted often goes on writing its last segment: restarts leave no segment
/// of zeros behind each (a segment is a file of zeros written in advance).
#[test]
fn restarts_go_on_writing_the_last_segment() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..20u32 {
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let t = store.table("t").unwrap();
        let mut batch = Batch::new();
        batch.put(&t, &i.to_be_bytes(), b"v").unwrap();
        store.submit(batch).unwrap().wait().unwrap();
        store.close().unwrap();
    }
    let segments: Vec<_> = std::fs::read_dir(dir.path().join("journal"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    let store = Store::open(dir.path(), Options::default()).unwrap();
    assert_eq!(all(&store.table("t").unwrap()).len(), 20);
    assert_eq!(store.last_seq(), 20);
}
