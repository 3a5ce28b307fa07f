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
//!
//! Persistent engines also run [`run_persistent`], which closes and reopens them on the
//! same storage (see [`Reopen`]).

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::engine::{Engine, Entry, Stats};
use crate::hlc::{Hlc, HlcClock};
use crate::value::Value;

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
    longest_key(&mut factory());
    seal_never_goes_backwards(&mut factory());
    keys_from_slices(&mut factory());
}

fn entry(value: &'static [u8], wall_ms: u64, expires_at_ms: Option<u64>) -> Entry {
    Entry {
        value: Value::new(value),
        version: Hlc::new(wall_ms, 0, "state-store"),
        fencing_token: None,
        expires_at_ms,
    }
}

fn put<E: Engine>(engine: &mut E, key: &'static [u8], entry: Entry) -> Option<Entry> {
    engine.put(key, entry).expect("put failed")
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
    written.fencing_token = Some(Box::new(Hlc::new(5, 3, "client")));
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
        engine.put(key, entry(b"v", 1, None)).expect("put failed");
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
        engine.put(key, entry(b"v", 1, None)).expect("put failed");
    }
    let mut seen = BTreeSet::new();
    let mut cursor: Option<Bytes> = None;
    let mut round = 0u8;
    loop {
        let batch = engine.scan(cursor.as_deref(), 3).expect("scan failed");
        seen.extend(batch.keys);
        engine
            .put(&[b'a', round], entry(b"v", 2, None))
            .expect("put failed");
        engine
            .put(&[b'z', round], entry(b"v", 2, None))
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

/// For in-memory engines: `get` and `peek` return the stored value itself, not a copy.
pub fn get_does_not_copy<E: Engine>(engine: &mut E) {
    let value = Value::new(&[7u8; 1024]);
    let written = Entry {
        value: value.clone(),
        ..entry(b"", 1, None)
    };
    engine.put(b"k", written).expect("put failed");
    let got = engine.get(b"k").expect("get failed").expect("present");
    assert_eq!(got.value.as_ptr(), value.as_ptr());
    let peeked = engine.peek(b"k").expect("peek failed").expect("present");
    assert_eq!(peeked.value.bulk().as_ptr(), value.bulk().as_ptr());
}

/// `put` takes its key as a slice of the caller's buffer (the request's), which the
/// caller then drops: the keys, and the expiry index, hold on.
pub fn keys_from_slices<E: Engine>(engine: &mut E) {
    let request = Bytes::from(b"SET plain PX timed".to_vec());
    put(engine, b"other", entry(b"v", 1, None));
    engine
        .put(&request[4..9], entry(b"v", 2, None))
        .expect("put failed");
    engine
        .put(&request[13..], entry(b"v", 3, Some(50)))
        .expect("put failed");
    // Overwrites too: the key stays stored once, and the expiry index follows.
    engine
        .put(&request[13..], entry(b"v", 4, Some(60)))
        .expect("put failed");
    drop(request);
    assert_eq!(scan_all(engine, 10), [&b"other"[..], b"plain", b"timed"]);
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), Some(60));
    assert_eq!(
        engine.expired(60, 10).expect("expired failed"),
        [&b"timed"[..]]
    );
    assert_eq!(
        engine.stats(),
        Stats {
            keys: 3,
            bytes: 3 * (5 + 1)
        }
    );
}

/// A key of exactly [`Engine::max_key_len`] bytes is stored (when that is testable).
pub fn longest_key<E: Engine>(engine: &mut E) {
    let len = engine.max_key_len();
    assert!(len >= 1024, "an engine must take keys of at least 1 KiB");
    if len > 1 << 20 {
        return;
    }
    let key = Bytes::from(vec![b'k'; len]);
    engine.put(&key, entry(b"v", 1, None)).expect("put failed");
    assert!(engine.get(&key).expect("get failed").is_some());
}

/// Sealed write sequence numbers never decrease.
pub fn seal_never_goes_backwards<E: Engine>(engine: &mut E) {
    let mut clock = HlcClock::new("state-store");
    let mut last = 0;
    for i in 0..20u8 {
        clock.tick(u64::from(i) + 1);
        if i % 3 != 0 {
            engine
                .put(&[b'k', i], entry(b"v", u64::from(i) + 1, None))
                .expect("put failed");
        }
        if let Some(seq) = engine.seal(&clock).expect("seal failed") {
            assert!(seq >= last, "seal went from {last} back to {seq}");
            last = seq;
        }
    }
}

/// One persistent engine's storage, opened and closed again by [`run_persistent`].
pub trait Reopen {
    /// The engine.
    type Engine: Engine;
    /// Opens the engine on this storage (empty the first time).
    fn open(&self) -> Self::Engine;
    /// Closes the engine and its storage; returns once every sealed write is durable.
    fn close(&self, engine: Self::Engine);
}

/// Runs every reopen check, each on fresh storage from `fresh`.
pub fn run_persistent<R: Reopen>(fresh: impl Fn() -> R) {
    reopen_keeps_every_field(&fresh());
    reopen_forgets_removed_keys(&fresh());
    reopen_keeps_expired_entries(&fresh());
    reopen_keeps_the_clock_high_water(&fresh());
    reopen_twice(&fresh());
}

/// Everything observable about an engine, for before/after comparisons.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    entries: Vec<(Bytes, Entry)>,
    stats: Stats,
    next_expiry: Option<u64>,
    expired: Vec<Bytes>,
}

fn snapshot<E: Engine>(engine: &E) -> Snapshot {
    let entries = scan_all(engine, 3)
        .into_iter()
        .map(|k| {
            let e = engine
                .get(&k)
                .expect("get failed")
                .expect("scanned key present");
            (k, e)
        })
        .collect();
    Snapshot {
        entries,
        stats: engine.stats(),
        next_expiry: engine.next_expiry().expect("next_expiry failed"),
        expired: engine
            .expired(u64::MAX, usize::MAX)
            .expect("expired failed"),
    }
}

fn seal_at<E: Engine>(engine: &mut E, clock: &mut HlcClock, now_ms: u64) {
    clock.tick(now_ms);
    engine.seal(clock).expect("seal failed");
}

/// Every field of every entry, the stats, the expiry index and the scan order come back.
pub fn reopen_keeps_every_field<R: Reopen>(storage: &R) {
    let mut engine = storage.open();
    empty_engine(&engine);
    let mut clock = HlcClock::new("state-store");
    let mut fenced = entry(b"fenced value", 10, Some(5_000));
    fenced.fencing_token = Some(Box::new(Hlc::new(9, 4, "lock:holder")));
    put(&mut engine, b"a", entry(b"first", 8, None));
    put(&mut engine, b"a", fenced);
    put(&mut engine, b"\x00\xff\r\n", entry(b"", 11, Some(4_000)));
    put(&mut engine, b"plain", entry(b"\r\n$-1\r\n", 12, None));
    seal_at(&mut engine, &mut clock, 12);
    let before = snapshot(&engine);
    storage.close(engine);
    let engine = storage.open();
    assert_eq!(snapshot(&engine), before);
}

/// Removed keys stay removed; replaced values stay replaced.
pub fn reopen_forgets_removed_keys<R: Reopen>(storage: &R) {
    let mut engine = storage.open();
    let mut clock = HlcClock::new("state-store");
    put(&mut engine, b"gone", entry(b"v", 1, Some(100)));
    put(&mut engine, b"kept", entry(b"old", 1, None));
    seal_at(&mut engine, &mut clock, 1);
    engine.remove(b"gone").expect("remove failed");
    put(&mut engine, b"kept", entry(b"new", 2, None));
    put(&mut engine, b"brief", entry(b"v", 2, None));
    engine.remove(b"brief").expect("remove failed");
    seal_at(&mut engine, &mut clock, 2);
    storage.close(engine);
    let engine = storage.open();
    assert_eq!(engine.get(b"gone").expect("get failed"), None);
    assert_eq!(engine.get(b"brief").expect("get failed"), None);
    assert_eq!(
        engine.get(b"kept").expect("get failed").map(|e| e.value),
        Some(Value::new(b"new"))
    );
    assert_eq!(engine.stats(), Stats { keys: 1, bytes: 7 });
    assert_eq!(engine.next_expiry().expect("next_expiry failed"), None);
}

/// An entry that expired while the engine was closed is still there: the machine
/// removes it, the engine never does.
pub fn reopen_keeps_expired_entries<R: Reopen>(storage: &R) {
    let mut engine = storage.open();
    let mut clock = HlcClock::new("state-store");
    put(&mut engine, b"old", entry(b"v", 1, Some(2)));
    seal_at(&mut engine, &mut clock, 1);
    storage.close(engine);
    let engine = storage.open();
    assert!(engine.get(b"old").expect("get failed").is_some());
    assert_eq!(
        engine.expired(u64::MAX, 10).expect("expired failed"),
        vec![&b"old"[..]]
    );
}

/// `max_version` after reopening covers the clock sealed with the last write, even when
/// no entry carries that version (a deletion's).
pub fn reopen_keeps_the_clock_high_water<R: Reopen>(storage: &R) {
    let mut engine = storage.open();
    let mut clock = HlcClock::new("state-store");
    put(&mut engine, b"k", entry(b"v", 1_000, None));
    seal_at(&mut engine, &mut clock, 1_000);
    engine.remove(b"k").expect("remove failed");
    for _ in 0..3 {
        clock.tick(900_000);
    }
    engine.seal(&clock).expect("seal failed");
    let high = clock.current();
    storage.close(engine);
    let engine = storage.open();
    let max = engine
        .max_version()
        .expect("max_version failed")
        .expect("a version");
    assert!(
        (max.wall_ms, max.counter) >= (high.wall_ms, high.counter),
        "max_version {max} is below the sealed clock {high}"
    );
}

/// Reopening without writing changes nothing.
pub fn reopen_twice<R: Reopen>(storage: &R) {
    let mut engine = storage.open();
    let mut clock = HlcClock::new("state-store");
    put(&mut engine, b"k", entry(b"v", 3, Some(77)));
    seal_at(&mut engine, &mut clock, 3);
    let before = snapshot(&engine);
    storage.close(engine);
    storage.close(storage.open());
    let engine = storage.open();
    assert_eq!(snapshot(&engine), before);
}
