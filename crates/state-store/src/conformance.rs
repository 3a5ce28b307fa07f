//! The conformance suite every [`Engine`] must pass (feature `conformance`).
//!
//! Each function takes a factory returning a fresh, empty engine and panics on the first
//! breach of the contract written in [`crate::engine`]. Run them all with [`run_all`]:
//!
//! ```ignore
//! #[test]
//! fn my_engine_conforms() {
//!     statehub_state_store::conformance::run_all(|| MyEngine::open_temp());
//! }
//! ```

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::engine::{Engine, Entry, Stats};
use crate::hlc::Hlc;

/// Runs every check of the suite.
pub fn run_all<E: Engine>(factory: impl Fn() -> E) {
    empty_engine(&factory());
    put_get_round_trip(&mut factory());
    put_replaces(&mut factory());
    remove_forgets(&mut factory());
    stats_are_exact(&mut factory());
    binary_keys_and_empty_values(&mut factory());
    expiry_index(&mut factory());
    expiry_follows_rewrites(&mut factory());
    scan_visits_every_key(&mut factory());
    scan_tolerates_any_cursor(&mut factory());
    scan_during_writes(&mut factory());
    max_version(&mut factory());
}

fn entry(value: &'static [u8], wall_ms: u64, expires_at_ms: Option<u64>) -> Entry {
    Entry {
        value: Bytes::from_static(value),
        version: Hlc::new(wall_ms, 0, "state-store"),
        fencing_token: None,
        expires_at_ms,
    }
}

fn put<E: Engine>(engine: &mut E, key: &'static [u8], entry: Entry) -> Option<Entry> {
    engine
        .put(Bytes::from_static(key), entry)
        .expect("put failed")
}

fn scan_all<E: Engine>(engine: &E, count: usize) -> Vec<Bytes> {
    let mut keys = Vec::new();
    let mut cursor: Option<Bytes> = None;
    loop {
        let batch = engine.scan(cursor.as_deref(), count).expect("scan failed");
        assert!(
            batch.keys.len() <= count,
            "a batch holds at most `count` keys"
        );
        keys.extend(batch.keys);
        match batch.cursor {
            Some(next) => cursor = Some(next),
            None => return keys,
        }
    }
}

/// A fresh engine holds nothing.
pub fn empty_engine<E: Engine>(engine: &E) {
    assert_eq!(engine.get(b"k").expect("get failed"), None);
    assert_eq!(engine.stats(), Stats::default());
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), None);
    assert!(engine
        .expired(u64::MAX, 10)
        .expect("expired failed")
        .is_empty());
    let batch = engine.scan(None, 10).expect("scan failed");
    assert!(batch.keys.is_empty() && batch.cursor.is_none());
    assert_eq!(engine.max_version().expect("max_version failed"), None);
}

/// Every field of an entry comes back as written.
pub fn put_get_round_trip<E: Engine>(engine: &mut E) {
    let mut written = entry(b"value", 10, Some(99));
    written.fencing_token = Some(Hlc::new(5, 3, "client"));
    assert_eq!(put(engine, b"key", written.clone()), None);
    assert_eq!(engine.get(b"key").expect("get failed"), Some(written));
    assert_eq!(engine.get(b"ke").expect("get failed"), None);
    assert_eq!(engine.get(b"key2").expect("get failed"), None);
}

/// A second put replaces the entry and returns the first.
pub fn put_replaces<E: Engine>(engine: &mut E) {
    let first = entry(b"one", 1, None);
    let second = entry(b"two", 2, None);
    put(engine, b"key", first.clone());
    assert_eq!(put(engine, b"key", second.clone()), Some(first));
    assert_eq!(engine.get(b"key").expect("get failed"), Some(second));
}

/// Remove returns the entry once, then the key is gone.
pub fn remove_forgets<E: Engine>(engine: &mut E) {
    let written = entry(b"v", 1, Some(50));
    put(engine, b"key", written.clone());
    assert_eq!(engine.remove(b"key").expect("remove failed"), Some(written));
    assert_eq!(engine.remove(b"key").expect("remove failed"), None);
    assert_eq!(engine.get(b"key").expect("get failed"), None);
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), None);
    assert_eq!(engine.stats(), Stats::default());
}

/// Stats count keys and `key + value` bytes through puts, replacements and removals.
pub fn stats_are_exact<E: Engine>(engine: &mut E) {
    put(engine, b"a", entry(b"12345", 1, None));
    put(engine, b"bb", entry(b"1", 1, None));
    assert_eq!(
        engine.stats(),
        Stats {
            keys: 2,
            bytes: 6 + 3
        }
    );
    put(engine, b"a", entry(b"1234567890", 2, None));
    assert_eq!(
        engine.stats(),
        Stats {
            keys: 2,
            bytes: 11 + 3
        }
    );
    put(engine, b"a", entry(b"", 3, None));
    assert_eq!(
        engine.stats(),
        Stats {
            keys: 2,
            bytes: 1 + 3
        }
    );
    engine.remove(b"bb").expect("remove failed");
    assert_eq!(engine.stats(), Stats { keys: 1, bytes: 1 });
    engine.remove(b"missing").expect("remove failed");
    assert_eq!(engine.stats(), Stats { keys: 1, bytes: 1 });
}

/// Keys and values are arbitrary bytes; an empty value is a value.
pub fn binary_keys_and_empty_values<E: Engine>(engine: &mut E) {
    put(engine, b"\x00\xff\r\n", entry(b"", 1, None));
    put(engine, b"\x00", entry(b"\r\n$-1\r\n", 1, None));
    let got = engine
        .get(b"\x00\xff\r\n")
        .expect("get failed")
        .expect("present");
    assert!(got.value.is_empty());
    let got = engine.get(b"\x00").expect("get failed").expect("present");
    assert_eq!(&got.value[..], b"\r\n$-1\r\n");
    let keys: BTreeSet<Bytes> = scan_all(engine, 1).into_iter().collect();
    assert_eq!(keys.len(), 2);
}

/// `next_expiry` and `expired` follow the index, earliest first, ties by key, limited.
pub fn expiry_index<E: Engine>(engine: &mut E) {
    put(engine, b"late", entry(b"v", 1, Some(300)));
    put(engine, b"b", entry(b"v", 1, Some(100)));
    put(engine, b"a", entry(b"v", 1, Some(100)));
    put(engine, b"never", entry(b"v", 1, None));
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), Some(100));
    assert!(engine.expired(99, 10).expect("expired failed").is_empty());
    assert_eq!(
        engine.expired(100, 10).expect("expired failed"),
        vec![&b"a"[..], b"b"]
    );
    assert_eq!(
        engine.expired(100, 1).expect("expired failed"),
        vec![&b"a"[..]]
    );
    assert_eq!(
        engine.expired(u64::MAX, 10).expect("expired failed"),
        vec![&b"a"[..], b"b", b"late"]
    );
    // Listing does not remove: the machine does.
    assert!(engine.get(b"a").expect("get failed").is_some());
}

/// Replacing or removing a key moves or drops its expiry.
pub fn expiry_follows_rewrites<E: Engine>(engine: &mut E) {
    put(engine, b"k", entry(b"v", 1, Some(100)));
    put(engine, b"k", entry(b"v", 2, Some(500)));
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), Some(500));
    assert!(engine.expired(499, 10).expect("expired failed").is_empty());
    put(engine, b"k", entry(b"v", 3, None));
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), None);
    put(engine, b"k", entry(b"v", 4, Some(100)));
    put(engine, b"k", entry(b"v", 5, Some(100)));
    assert_eq!(
        engine.expired(100, 10).expect("expired failed"),
        vec![&b"k"[..]]
    );
    engine.remove(b"k").expect("remove failed");
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), None);
}

/// Paging with any batch size visits every key exactly once when nothing changes.
pub fn scan_visits_every_key<E: Engine>(engine: &mut E) {
    let all: BTreeSet<Bytes> = (0..25u8).map(|i| Bytes::from(vec![b'k', i])).collect();
    for key in &all {
        engine
            .put(key.clone(), entry(b"v", 1, None))
            .expect("put failed");
    }
    for count in [1, 2, 7, 25, 26, 1000] {
        let seen = scan_all(engine, count);
        let unique: BTreeSet<Bytes> = seen.iter().cloned().collect();
        assert_eq!(unique, all, "batch size {count}");
        assert!(seen.len() >= all.len());
    }
}

/// A cursor the engine never issued is a position, not a crash.
pub fn scan_tolerates_any_cursor<E: Engine>(engine: &mut E) {
    put(engine, b"a", entry(b"v", 1, None));
    for cursor in [&b""[..], b"\xff\xff\xff", b"garbage", b"\x00", b"1;1;"] {
        engine.scan(Some(cursor), 5).expect("scan failed");
    }
}

/// Keys present for a whole scan are returned even when others come and go meanwhile.
pub fn scan_during_writes<E: Engine>(engine: &mut E) {
    let stable: Vec<Bytes> = (0..10u8).map(|i| Bytes::from(vec![b's', i])).collect();
    for key in &stable {
        engine
            .put(key.clone(), entry(b"v", 1, None))
            .expect("put failed");
    }
    let mut seen = BTreeSet::new();
    let mut cursor: Option<Bytes> = None;
    let mut round = 0u8;
    loop {
        let batch = engine.scan(cursor.as_deref(), 3).expect("scan failed");
        seen.extend(batch.keys);
        engine
            .put(Bytes::from(vec![b'a', round]), entry(b"v", 2, None))
            .expect("put failed");
        engine
            .put(Bytes::from(vec![b'z', round]), entry(b"v", 2, None))
            .expect("put failed");
        round += 1;
        match batch.cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(round < 100, "scan does not terminate");
    }
    for key in &stable {
        assert!(seen.contains(key), "stable key {key:?} missed");
    }
}

/// `max_version` is the greatest version stored.
pub fn max_version<E: Engine>(engine: &mut E) {
    put(engine, b"a", entry(b"v", 5, None));
    put(engine, b"b", entry(b"v", 9, None));
    put(engine, b"c", entry(b"v", 7, None));
    assert_eq!(
        engine.max_version().expect("max_version failed"),
        Some(Hlc::new(9, 0, "state-store"))
    );
}

/// For in-memory engines: `get` returns the stored `Bytes` itself, not a copy.
pub fn get_does_not_copy<E: Engine>(engine: &mut E) {
    let value = Bytes::from(vec![7u8; 1024]);
    let written = Entry {
        value: value.clone(),
        ..entry(b"", 1, None)
    };
    engine
        .put(Bytes::from_static(b"k"), written)
        .expect("put failed");
    let got = engine.get(b"k").expect("get failed").expect("present");
    assert_eq!(got.value.as_ptr(), value.as_ptr());
}
