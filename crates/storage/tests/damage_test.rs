//! Damaged data directories: every outcome must be one the crate docs list. Either the
//! store refuses to open (or to read) with an error that says "damaged" and names the
//! files, or it recovers to the last good batch: what it holds is exactly the first `m`
//! batches written, each whole, and the cut journal is reported. Never a gap, never half
//! a batch, never a silent loss of older batches.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use statehub_storage::{Batch, OpenError, Options, StorageError, Store, SyncPolicy};

const PER_BATCH: usize = 4;

fn key(batch: usize, i: usize) -> Vec<u8> {
    format!("b{batch:05}-{i}").into_bytes()
}

/// Writes `batches` batches of `PER_BATCH` keys with `value_len`-byte values, each
/// awaited before the next is submitted (so each is its own commit: batches submitted
/// together are committed as one, and recover or vanish together), then closes.
fn fill(dir: &Path, batches: usize, value_len: usize) {
    let store = Store::open(
        dir,
        Options {
            sync: SyncPolicy::Interval(Duration::from_secs(1)),
            ..Options::default()
        },
    )
    .unwrap();
    let t = store.table("t").unwrap();
    for b in 0..batches {
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

fn files(dir: &Path, pick: &dyn Fn(&Path) -> bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if pick(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn non_empty(p: &Path) -> bool {
    std::fs::metadata(p).unwrap().len() > 0
}

fn journals(dir: &Path) -> Vec<PathBuf> {
    files(dir, &|p| {
        p.extension().is_some_and(|x| x == "jnl") && non_empty(p)
    })
}

fn tables(dir: &Path) -> Vec<PathBuf> {
    files(dir, &|p| {
        p.parent().is_some_and(|d| d.ends_with("tables")) && non_empty(p)
    })
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

/// What opening and reading everything gave.
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
    for f in files(from, &|_| true) {
        let dest = to.join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, dest).unwrap();
    }
}

#[test]
fn a_torn_tail_is_cut_and_reported_without_losing_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 50, 100);
    let journal = journals(dir.path()).pop().expect("a journal");
    let mut bytes = std::fs::read(&journal).unwrap();
    let end = usize::try_from(written(&journal)).unwrap();
    // The start of a batch whose items never arrived, as a crash mid-write leaves it.
    bytes[end..end + 6].copy_from_slice(&[0x01, 0x07, 0x00, 0x00, 0x17, 0x42]);
    std::fs::write(&journal, bytes).unwrap();
    match outcome(dir.path(), 50) {
        Outcome::Recovered { batches, truncated } => assert_eq!((batches, truncated), (50, true)),
        Outcome::Refused(e) => panic!("a torn tail must be repaired, not refused: {e}"),
    }
}

/// Where the journal's written bytes end (journals are preallocated with zeros).
fn written(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |i| i as u64 + 1)
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
    let journal_len = written(&journals(source.path()).pop().unwrap());
    // The 200 batches are the same size, so a fraction of the journal plus 7 bytes is
    // inside a batch.
    for fraction in [0.1, 0.5, 0.9] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        truncate(
            &journals(dir.path()).pop().unwrap(),
            (journal_len as f64 * fraction) as u64 + 7,
        );
        match outcome(dir.path(), 200) {
            Outcome::Recovered { batches, truncated } => {
                assert_eq!(batches, (200.0 * fraction) as usize, "cut at {fraction}");
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
    let journal = journals(dir.path()).pop().unwrap();
    truncate(&journal, written(&journal) / 4);
    match outcome(dir.path(), 200) {
        Outcome::Recovered { batches, .. } => assert_eq!(batches, 50),
        Outcome::Refused(e) => panic!("{e}"),
    }
}

#[test]
fn flipped_journal_bytes_are_refused_or_recovered_to_a_prefix() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path(), 200, 100);
    let journal_len = written(&journals(source.path()).pop().unwrap());
    let mut refused = 0;
    for at in [
        0,
        9,
        100,
        journal_len / 3,
        journal_len / 2,
        journal_len - 40,
    ] {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        flip(&journals(dir.path()).pop().unwrap(), at);
        match outcome(dir.path(), 200) {
            Outcome::Refused(e) => {
                assert!(e.contains("damaged") && e.contains(".jnl"), "{e}");
                refused += 1;
            }
            Outcome::Recovered { .. } => {}
        }
    }
    assert!(refused > 0, "no flip was caught by a checksum");
}

/// Writes enough for the memtable to be flushed into table files.
fn filled_with_tables() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 600, 8 << 10);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Flushes run on fjall's worker; reopen until one has produced a table file.
    while tables(dir.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "no table file after writing 19 MB"
        );
        std::thread::sleep(Duration::from_millis(50));
        drop(Store::open(dir.path(), Options::default()).unwrap());
    }
    dir
}

#[test]
fn damaged_table_files_are_refused_naming_the_table_directory() {
    let source = filled_with_tables();
    let table = tables(source.path()).remove(0);
    let rel = table.strip_prefix(source.path()).unwrap().to_owned();
    let len = std::fs::metadata(&table).unwrap().len();
    type Damage = Box<dyn Fn(&Path)>;
    let damages: Vec<(&str, Damage)> = vec![
        ("flip in the middle", Box::new(move |p| flip(p, len / 2))),
        ("flip near the start", Box::new(|p| flip(p, 64))),
        ("truncated to half", Box::new(move |p| truncate(p, len / 2))),
        ("deleted", Box::new(|p| std::fs::remove_file(p).unwrap())),
    ];
    for (what, damage) in damages {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        damage(&dir.path().join(&rel));
        match outcome(dir.path(), 600) {
            Outcome::Refused(e) => assert!(
                e.contains("damaged") && e.contains("keyspaces"),
                "{what}: {e}"
            ),
            Outcome::Recovered { batches, .. } => {
                panic!("{what}: opened with {batches} batches from a damaged table")
            }
        }
    }
}
