//! Damaged data directories: every outcome must be one the crate docs list. Either the
//! store refuses to open (or to read) with an error that says "damaged" and names the
//! file, leaving the directory as it was, or it recovers to the last good batch: what it
//! holds is exactly the first `m` batches written, each whole, the cut journal is
//! reported and its cut bytes kept in a file of their own. Never a gap, never half a
//! batch, never a silent loss of older batches. A refused directory can be repaired
//! (`repair`), which keeps every whole batch and lists every one it lost.

use std::path::{Path, PathBuf};
use std::time::Duration;

use statehub_storage::{repair, Batch, OpenError, Options, StorageError, Store, SyncPolicy};

#[path = "damage_test/repair.rs"]
mod repair_tests;

const PER_BATCH: usize = 4;

fn key(batch: usize, i: usize) -> Vec<u8> {
    format!("b{batch:05}-{i}").into_bytes()
}

fn options() -> Options {
    Options {
        sync: SyncPolicy::Interval(Duration::from_secs(3600)),
        ..Options::default()
    }
}

/// Writes `batches` batches of `PER_BATCH` keys with `value_len`-byte values, each
/// awaited before the next is submitted (so each is its own record), then closes.
fn fill(dir: &Path, batches: usize, value_len: usize) {
    fill_with(dir, 0..batches, value_len, options());
}

/// [`fill`] of the batches numbered `range`, with `options`.
fn fill_with(dir: &Path, range: std::ops::Range<usize>, value_len: usize, options: Options) {
    let store = Store::open(dir, options).unwrap();
    let t = store.table("t").unwrap();
    for b in range {
        let mut batch = Batch::new();
        for i in 0..PER_BATCH {
            batch
                .put(&t, &key(b, i), &vec![(b % 251) as u8; value_len])
                .unwrap();
        }
        store.submit(batch).unwrap().wait().unwrap();
    }
    store.close().unwrap();
}

/// `runs` opens of the store with segments of `segment_bytes`, each writing 50 batches of
/// one key: a journal of several segments.
fn fill_segments(dir: &Path, runs: usize, segment_bytes: u64) {
    for run in 0..runs {
        let store = Store::open(
            dir,
            Options {
                segment_bytes,
                ..options()
            },
        )
        .unwrap();
        let t = store.table("t").unwrap();
        for b in 0..50 {
            let mut batch = Batch::new();
            batch.put(&t, &key(run * 50 + b, 0), &[1; 100]).unwrap();
            store.submit(batch).unwrap().wait().unwrap();
        }
        store.close().unwrap();
    }
}

/// Folds the journal into a snapshot: reopens, compacts, closes.
fn compact(dir: &Path) {
    let store = Store::open(dir, options()).unwrap();
    store.compact().unwrap();
    store.close().unwrap();
}

fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = ["journal", "snapshots"]
        .iter()
        .flat_map(|d| std::fs::read_dir(dir.join(d)).unwrap().flatten())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    out
}

fn last_segment(dir: &Path) -> PathBuf {
    files_in(dir, "log").pop().expect("a journal segment")
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = usize::try_from(at).unwrap().min(bytes.len() - 1);
    let end = (at + 8).min(bytes.len());
    for b in &mut bytes[at..end] {
        *b ^= 0xA5;
    }
    std::fs::write(path, bytes).unwrap();
}

fn truncate(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// Where a segment's written bytes end: segments are files of zeros that commits
/// overwrite.
fn written(path: &Path) -> u64 {
    std::fs::read(path)
        .unwrap()
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1)
}

/// What opening and reading everything gave.
#[derive(Debug)]
enum Outcome {
    Refused(String),
    Recovered { batches: usize, truncated: bool },
}

/// Opens `dir` and reads the table; checks that a recovery is a whole-batch prefix.
fn outcome(dir: &Path, written: usize) -> Outcome {
    let store = match Store::open(dir, Options::default()) {
        Ok(s) => s,
        Err(e @ OpenError::Corrupt { .. }) => return Outcome::Refused(e.to_string()),
        Err(e) => panic!("damage gave an error that does not say so: {e}"),
    };
    let t = store.table("t").unwrap();
    let mut keys = Vec::new();
    for r in t.iter() {
        match r {
            Ok(r) => keys.push(r.key().to_vec()),
            Err(e @ StorageError::Corrupt { .. }) => return Outcome::Refused(e.to_string()),
            Err(e) => panic!("damage gave a read error that does not say so: {e}"),
        }
    }
    assert_eq!(keys.len() % PER_BATCH, 0, "half a batch recovered");
    let batches = keys.len() / PER_BATCH;
    let expected: Vec<Vec<u8>> = (0..batches)
        .flat_map(|b| (0..PER_BATCH).map(move |i| key(b, i)))
        .collect();
    assert_eq!(
        keys, expected,
        "recovered batches are not the first {batches} written"
    );
    assert!(batches <= written);
    let truncated = !store.recovery().truncated_journals.is_empty();
    Outcome::Recovered { batches, truncated }
}

fn copy_dir(from: &Path, to: &Path) {
    let mut stack = vec![from.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let dest = to.join(p.strip_prefix(from).unwrap());
            if p.is_dir() {
                std::fs::create_dir_all(&dest).unwrap();
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n != "LOCK") {
                std::fs::copy(&p, dest).unwrap();
            }
        }
    }
}

/// (header, record) lengths of a segment of `fill(_, n, 100)`, measured from two fills.
fn record_layout() -> (u64, u64) {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fill(one.path(), 1, 100);
    fill(two.path(), 2, 100);
    let (l1, l2) = (
        written(&last_segment(one.path())),
        written(&last_segment(two.path())),
    );
    (l1 - (l2 - l1), l2 - l1)
}

#[test]
fn a_torn_tail_is_cut_and_reported_without_losing_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 50, 100);
    let segment = last_segment(dir.path());
    let end = written(&segment);
    // The start of a batch whose payload never arrived, as a crash mid-write leaves it.
    let mut bytes = std::fs::read(&segment).unwrap();
    let torn = [0x40, 0x01, 0, 0, 51, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00];
    let at = usize::try_from(end).unwrap();
    bytes[at..at + torn.len()].copy_from_slice(&torn);
    std::fs::write(&segment, bytes).unwrap();
    match outcome(dir.path(), 50) {
        Outcome::Recovered { batches, truncated } => assert_eq!((batches, truncated), (50, true)),
        Outcome::Refused(e) => panic!("a torn tail must be repaired, not refused: {e}"),
    }
    assert_eq!(written(&segment), end, "the torn bytes are zeroed");
    let kept = dir.path().join("damaged").join(format!(
        "{}.torn-at-{end}",
        segment.file_name().unwrap().to_string_lossy()
    ));
    // Up to their last byte that is not zero (zeros are what an unwritten segment holds).
    assert_eq!(
        std::fs::read(&kept).unwrap(),
        torn[..torn.len() - 1],
        "the torn bytes are kept"
    );
    // Cut for good: the next open has nothing to report.
    match outcome(dir.path(), 50) {
        Outcome::Recovered { batches, truncated } => assert_eq!((batches, truncated), (50, false)),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

#[test]
fn a_clean_journal_is_not_reported() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 20, 100);
    match outcome(dir.path(), 20) {
        Outcome::Recovered { batches, truncated } => assert_eq!((batches, truncated), (20, false)),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

#[test]
fn a_journal_cut_inside_a_batch_recovers_to_the_last_whole_batch_and_says_so() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path(), 200, 100);
    let (header, record) = record_layout();
    for fraction in [0.1, 0.5, 0.9] {
        let whole = (200.0 * fraction) as u64;
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        truncate(&last_segment(dir.path()), header + whole * record + 7);
        match outcome(dir.path(), 200) {
            Outcome::Recovered { batches, truncated } => {
                assert_eq!(batches as u64, whole, "cut at {fraction}");
                assert!(truncated, "cut at {fraction} not reported");
            }
            Outcome::Refused(e) => {
                panic!("a cut journal must recover to its last whole batch: {e}")
            }
        }
    }
}

/// The documented limit: a journal cut exactly where a batch ends looks like a journal
/// that ended there. The store holds exactly the batches before the cut.
#[test]
fn a_journal_cut_between_batches_recovers_the_batches_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 200, 100);
    let (header, record) = record_layout();
    truncate(&last_segment(dir.path()), header + 50 * record);
    match outcome(dir.path(), 200) {
        Outcome::Recovered { batches, .. } => assert_eq!(batches, 50),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

/// Flipped bytes in the last segment written with `--sync interval` and no sync since
/// its first batch: in its header, refused; in a record, the segment ends before that
/// record (whole records after it included: a power cut can persist a later page of
/// what was written since the last sync and not an earlier one), and it is reported.
#[test]
fn flipped_journal_bytes_are_refused_or_recovered_to_a_prefix_and_reported() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path(), 200, 100);
    let segment_len = written(&last_segment(source.path()));
    let (header, record) = record_layout();
    for at in [
        0,
        9,
        100,
        segment_len / 3,
        segment_len / 2,
        segment_len - 40,
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        flip(&last_segment(dir.path()), at);
        match outcome(dir.path(), 200) {
            Outcome::Refused(e) => {
                assert!(at < header, "a flip at {at} in a record was refused: {e}");
                assert!(e.contains("damaged") && e.contains(".log"), "{e}");
            }
            Outcome::Recovered { batches, truncated } => {
                assert!(at >= header, "a flip at {at} in the header was not refused");
                assert!(truncated, "the flip at {at} was not reported");
                assert_eq!(
                    batches as u64,
                    (at - header) / record,
                    "a flip at {at} kept the wrong prefix"
                );
            }
        }
    }
}

/// A closed segment must be whole: a flipped byte there is refused.
#[test]
fn flipped_bytes_in_a_closed_segment_are_refused() {
    let source = tempfile::tempdir().unwrap();
    fill_segments(source.path(), 2, 8 << 10);
    let closed = files_in(source.path(), "log").remove(0);
    let at = written(&closed) / 2;
    flip(&closed, at);
    match Store::open(source.path(), Options::default()) {
        Err(e @ OpenError::Corrupt { .. }) => assert!(e.to_string().contains(".log"), "{e}"),
        other => panic!("a flip in a closed segment gave {other:?}"),
    }
}

/// A journal of several segments, the older ones folded into a snapshot.
fn with_snapshot() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let small = Options {
        segment_bytes: 16 << 10,
        compact_after_bytes: 16 << 10,
        ..options()
    };
    let store = Store::open(dir.path(), small).unwrap();
    let t = store.table("t").unwrap();
    for b in 0..400 {
        let mut batch = Batch::new();
        for i in 0..PER_BATCH {
            batch.put(&t, &key(b, i), &[(b % 251) as u8; 100]).unwrap();
        }
        store.submit(batch).unwrap().wait().unwrap();
    }
    store.compact().unwrap();
    store.close().unwrap();
    assert_eq!(files_in(dir.path(), "snap").len(), 1, "no snapshot written");
    assert!(!files_in(dir.path(), "log").is_empty());
    dir
}

#[test]
fn a_snapshot_and_the_journal_after_it_read_back_whole() {
    let dir = with_snapshot();
    match outcome(dir.path(), 400) {
        Outcome::Recovered { batches, truncated } => assert_eq!((batches, truncated), (400, false)),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

#[test]
fn damaged_or_missing_snapshots_are_refused_naming_the_file() {
    let source = with_snapshot();
    let snapshot = files_in(source.path(), "snap").remove(0);
    let rel = snapshot.strip_prefix(source.path()).unwrap().to_owned();
    let size = len(&snapshot);
    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage)> = vec![
        ("flip in the middle", Box::new(move |p| flip(p, size / 2))),
        ("flip near the start", Box::new(|p| flip(p, 3))),
        ("flip in the footer", Box::new(move |p| flip(p, size - 30))),
        (
            "truncated to half",
            Box::new(move |p| truncate(p, size / 2)),
        ),
        ("deleted", Box::new(|p| std::fs::remove_file(p).unwrap())),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        damage(&dir.path().join(&rel));
        match outcome(dir.path(), 400) {
            Outcome::Refused(e) => {
                assert!(e.contains("damaged") && e.contains(".snap"), "{what}: {e}")
            }
            Outcome::Recovered { batches, .. } => {
                panic!("{what}: opened with {batches} batches from a damaged snapshot")
            }
        }
    }
}

#[test]
fn a_missing_segment_or_manifest_is_refused() {
    // Segments of 4 KiB: several of them, far below the size that would make the
    // compactor fold them.
    let source = tempfile::tempdir().unwrap();
    fill_segments(source.path(), 4, 4 << 10);
    let segments = files_in(source.path(), "log");
    assert!(segments.len() >= 4, "{segments:?}");
    let rel = |p: &Path| p.strip_prefix(source.path()).unwrap().to_owned();
    for (what, victim) in [
        ("the first segment", rel(&segments[0])),
        ("a middle segment", rel(&segments[1])),
        ("the newest segment", rel(&segments[segments.len() - 1])),
        ("the manifest", PathBuf::from("MANIFEST")),
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        std::fs::remove_file(dir.path().join(&victim)).unwrap();
        match Store::open(dir.path(), Options::default()) {
            Err(e @ OpenError::Corrupt { .. }) => {
                let e = e.to_string();
                assert!(e.contains("damaged"), "{what}: {e}");
            }
            Err(e) => panic!("{what}: {e}"),
            Ok(s) => panic!("{what} deleted, yet opened at batch {}", s.last_seq()),
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy_dir(source.path(), dir.path());
    flip(&dir.path().join("MANIFEST"), 10);
    assert!(matches!(
        Store::open(dir.path(), Options::default()),
        Err(OpenError::Corrupt { .. })
    ));
}

/// The manifest names a segment only once its header is on disk: a cut header there is
/// damage, refused with the file left as it was found.
#[test]
fn a_cut_header_of_the_newest_segment_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 3, 10);
    let segment = last_segment(dir.path());
    truncate(&segment, 10);
    let before = std::fs::read(&segment).unwrap();
    match Store::open(dir.path(), Options::default()) {
        Err(e @ OpenError::Corrupt { .. }) => {
            assert!(e.to_string().contains("header is cut short"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        before,
        "the refused segment was changed"
    );
}

#[test]
fn an_older_statehubs_store_is_refused_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("db/keyspaces")).unwrap();
    std::fs::write(dir.path().join("db/0.jnl"), b"old").unwrap();
    match Store::open(dir.path(), Options::default()) {
        Err(e @ OpenError::Unsupported { .. }) => {
            assert!(e.to_string().contains("older statehub"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read(dir.path().join("db/0.jnl")).unwrap(), b"old");
}

#[test]
fn compact_after_reopen_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 30, 10);
    compact(dir.path());
    fill(dir.path(), 0, 10);
    match outcome(dir.path(), 30) {
        Outcome::Recovered { batches, .. } => assert_eq!(batches, 30),
        Outcome::Refused(e) => panic!("{e}"),
    }
}
