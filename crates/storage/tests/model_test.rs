//! The store against a map: random batches of puts and deletes over three tables, with
//! tiny journal segments (so the committer rolls and the compactor folds segments into
//! snapshots all the time, in the background), forced compactions and reopens. After
//! every step each table reads back exactly as the model holds it, whole, by prefix and
//! key by key.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use statehub_storage::{Batch, Options, Store, SyncPolicy, Table};

const TABLES: [&str; 3] = ["alpha", "beta", "gamma"];

#[derive(Debug, Clone)]
enum Op {
    Put {
        table: usize,
        key: u8,
        value: Vec<u8>,
    },
    Delete {
        table: usize,
        key: u8,
    },
}

#[derive(Debug, Clone)]
enum Step {
    /// One batch of these operations, awaited.
    Batch(Vec<Op>),
    Compact,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize, 0..24u8, proptest::collection::vec(any::<u8>(), 0..300))
            .prop_map(|(table, key, value)| Op::Put { table, key, value }),
        1 => (0..3usize, 0..24u8).prop_map(|(table, key)| Op::Delete { table, key }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => proptest::collection::vec(op(), 0..8).prop_map(Step::Batch),
        1 => Just(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

fn key(k: u8) -> Vec<u8> {
    format!("k{k:02}").into_bytes()
}

type Model = [BTreeMap<Vec<u8>, Vec<u8>>; 3];

fn open(dir: &Path) -> (Store, Vec<Table>) {
    let options = Options {
        sync: SyncPolicy::Always,
        segment_bytes: 1024,
        compact_after_bytes: 512,
        ..Options::default()
    };
    let store = Store::open(dir, options).unwrap();
    let tables = TABLES.iter().map(|t| store.table(t).unwrap()).collect();
    (store, tables)
}

fn check(tables: &[Table], model: &Model) -> Result<(), TestCaseError> {
    for (table, expected) in tables.iter().zip(model) {
        let got: Vec<(Vec<u8>, Vec<u8>)> = table
            .iter()
            .map(|r| r.map(|r| (r.key().to_vec(), r.value().to_vec())))
            .collect::<Result<_, _>>()
            .unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = expected
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        prop_assert_eq!(&got, &want, "table {}", table.name());
        let prefixed: Vec<Vec<u8>> = table
            .prefix(b"k1")
            .map(|r| r.unwrap().key().to_vec())
            .collect();
        let want_prefixed: Vec<Vec<u8>> = expected
            .keys()
            .filter(|k| k.starts_with(b"k1"))
            .cloned()
            .collect();
        prop_assert_eq!(prefixed, want_prefixed);
        for k in [0u8, 7, 23] {
            prop_assert_eq!(table.get(&key(k)).unwrap(), expected.get(&key(k)).cloned());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn the_store_reads_back_what_the_model_holds(steps in proptest::collection::vec(step(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut model: Model = Default::default();
        let (mut store, mut tables) = open(dir.path());
        for step in steps {
            match step {
                Step::Batch(ops) => {
                    let mut batch = Batch::new();
                    for op in ops {
                        match op {
                            Op::Put { table, key: k, value } => {
                                batch.put(&tables[table], &key(k), &value).unwrap();
                                model[table].insert(key(k), value);
                            }
                            Op::Delete { table, key: k } => {
                                batch.delete(&tables[table], &key(k)).unwrap();
                                model[table].remove(&key(k));
                            }
                        }
                    }
                    store.submit(batch).unwrap().wait().unwrap();
                }
                Step::Compact => store.compact().unwrap(),
                Step::Reopen => {
                    let last = store.last_seq();
                    store.close().unwrap();
                    drop((store, tables));
                    (store, tables) = open(dir.path());
                    prop_assert_eq!(store.last_seq(), last, "sequence numbers continue after a reopen");
                    prop_assert!(store.recovery().truncated_journals.is_empty());
                }
            }
            check(&tables, &model)?;
        }
        store.close().unwrap();
        drop((store, tables));
        let (_store, tables) = open(dir.path());
        check(&tables, &model)?;
    }
}

/// Compaction keeps the disk close to the live data: 10,000 overwrites of 100 keys
/// leave about the live records plus a few segments, and everything reads back.
#[test]
fn overwrites_are_compacted_away() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        sync: SyncPolicy::Interval(std::time::Duration::from_millis(50)),
        segment_bytes: 64 << 10,
        compact_after_bytes: 64 << 10,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options.clone()).unwrap();
    let t = store.table("t").unwrap();
    for i in 0..10_000u32 {
        let mut batch = Batch::new();
        batch
            .put(
                &t,
                format!("key{:03}", i % 100).as_bytes(),
                &[(i % 251) as u8; 200],
            )
            .unwrap();
        let ticket = store.submit(batch).unwrap();
        // Commits of at most 50 batches: a segment grows past its size by one commit.
        if i % 50 == 49 {
            ticket.wait().unwrap();
        }
    }
    store.compact().unwrap();
    // 100 live records of ~210 bytes; the journal written was 10,000 of them (2.2 MB).
    let space = store.disk_space();
    let listing = || {
        ["journal", "snapshots"]
            .iter()
            .flat_map(|d| std::fs::read_dir(dir.path().join(d)).unwrap().flatten())
            .map(|e| format!("{} {}", e.path().display(), e.metadata().unwrap().len()))
            .collect::<Vec<_>>()
    };
    assert!(
        space < 400 << 10,
        "{space} bytes on disk for 21 KB of live data: {:#?}",
        listing()
    );
    store.close().unwrap();
    drop((store, t));
    let store = Store::open(dir.path(), options).unwrap();
    let t = store.table("t").unwrap();
    let records: Vec<_> = t.iter().map(|r| r.unwrap()).collect();
    assert_eq!(records.len(), 100);
    for r in &records {
        let i: u32 = std::str::from_utf8(&r.key()[3..]).unwrap().parse().unwrap();
        assert_eq!(
            r.value(),
            &[((9_900 + i) % 251) as u8; 200][..],
            "key{i:03}"
        );
    }
}
