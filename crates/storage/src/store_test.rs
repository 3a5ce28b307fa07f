//! The journal's bound: with the compactor held back (as a saturated core holds back a
//! thread at nice 10), a flood of writes makes commits wait once the closed journal
//! passes the bound, instead of growing it; released, everything completes.

use std::time::Duration;

use super::*;

#[test]
fn writes_wait_for_the_compactor_once_the_journal_passes_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options {
        sync: SyncPolicy::Interval(Duration::from_secs(3600)),
        segment_bytes: 4 << 10,
        compact_after_bytes: 8 << 10,
        max_journal_bytes: 32 << 10,
        ..Options::default()
    };
    let store = Store::open(dir.path(), options).unwrap();
    let bound = crate::journal::journal_bound(store.files(), 32 << 10);
    assert_eq!(bound, 32 << 10);
    let paused = store.files().compacting.lock();
    let writer = std::thread::spawn({
        let store = store.clone();
        move || {
            let t = store.table("t").unwrap();
            // 2,000 batches of about 100 bytes: six times the bound.
            for i in 0..2_000u32 {
                let mut batch = Batch::new();
                batch.put(&t, &i.to_be_bytes(), &[7; 96]).unwrap();
                store.submit(batch).unwrap().wait().unwrap();
            }
        }
    });
    let closed = || store.files().set.read().closed_bytes();
    while closed() <= bound {
        assert!(
            !writer.is_finished(),
            "all written, the journal still under its bound"
        );
        std::thread::yield_now();
    }
    // Past the bound by at most the segment that crossed it: commits wait now.
    let limit = bound + (4 << 10) + 4096;
    for _ in 0..20 {
        assert!(closed() <= limit, "{} bytes of journal", closed());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !writer.is_finished(),
        "writes went on past the journal's bound"
    );
    drop(paused);
    writer.join().unwrap();
    store.close().unwrap();
}
