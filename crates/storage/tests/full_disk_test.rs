//! A real full file system: a size-limited tmpfs, mounted for the test. Mounting needs
//! privileges (root, as in the project's CI container); without them the test says so
//! and passes without running. The committer's behaviour is also pinned exactly by its
//! unit tests against a backend that fails on cue (`src/committer_test.rs`).
//!
//! What it checks: with the disk full, a write that needs a new segment waits (the
//! store reports why) and nothing completes; once space is freed, the same writes
//! complete without a restart, in order, and a reopened store holds every one of them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use statehub_storage::{Batch, Options, StorageError, Store};

/// A tmpfs of `size` bytes mounted on a temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        status.success().then_some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Fills the file system holding `dir` with a file of zeros until a write fails.
fn fill_up(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let block = vec![0u8; 4096];
    while file.write_all(&block).and_then(|()| file.flush()).is_ok() {}
    path
}

fn batch(store: &Store, i: u32) -> Batch {
    let t = store.table("t").unwrap();
    let mut batch = Batch::new();
    batch.put(&t, &i.to_be_bytes(), &[i as u8; 1000]).unwrap();
    batch
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_full_file_system_stalls_writes_and_they_complete_when_space_returns() {
    let Some(fs) = Tmpfs::mount(2 << 20) else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root); see src/committer_test.rs");
        return;
    };
    let data = fs.path().join("data");
    let options = Options {
        segment_bytes: 64 << 10,
        ..Options::default()
    };
    let store = Store::open(&data, options.clone()).unwrap();
    let mut tickets = Vec::new();
    for i in 0..10 {
        let ticket = store.submit(batch(&store, i)).unwrap();
        ticket.wait().unwrap();
        tickets.push(ticket);
    }
    let filler = fill_up(fs.path());
    // The segment being written has room (its zeros were written in advance); past it a
    // new segment needs space, and the compactor could not write a spare.
    let mut i = 10;
    while store.stall_error().is_none() {
        assert!(i < 1000, "no stall after {i} batches on a full file system");
        tickets.push(store.submit(batch(&store, i)).unwrap());
        i += 1;
        if i % 16 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let err = store.stall_error().unwrap();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err}");
    assert!(err.to_string().contains("No space left"), "{err}");
    let last = tickets.last().unwrap().clone();
    assert!(!last.is_durable());
    // Writes queued meanwhile are kept, and written once there is room.
    for _ in 0..5 {
        tickets.push(store.submit(batch(&store, i)).unwrap());
        i += 1;
    }
    std::fs::remove_file(&filler).unwrap();
    wait_until(
        "writes going on after space was freed",
        Duration::from_secs(20),
        || tickets.iter().all(|t| t.is_durable()),
    );
    for t in &tickets {
        t.wait().unwrap();
    }
    assert!(store.stall_error().is_none());
    store.close().unwrap();
    let store = Store::open(&data, options).unwrap();
    let t = store.table("t").unwrap();
    let keys: Vec<Vec<u8>> = t.iter().map(|r| r.unwrap().key().to_vec()).collect();
    let expected: Vec<Vec<u8>> = (0..i).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(keys, expected);
    store.close().unwrap();
}
