//! The files of a data directory and where they live: the journal's segments, the spare
//! segment, snapshots, and the file set the committer, the compactor and readers share.
//!
//! ```text
//! DIR/LOCK                          lock.rs
//! DIR/MANIFEST                      manifest.rs
//! DIR/journal/{first_seq:020}.log   the journal's segments (format.rs, journal.rs)
//! DIR/journal/spare                 the next segment's zeros (prepare_spare)
//! DIR/snapshots/{seq:020}.snap      the snapshot (snapshot.rs)
//! DIR/damaged/                      bytes recovery and repair took out (recovery.rs, repair.rs)
//! ```
//!
//! Everything else in the crate names files through this module, so the layout is
//! written down once.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex, RwLock};

use crate::io_stats::IoStats;
use crate::snapshot::Snapshot;

/// Where a journal segment lives: `DIR/journal/{first_seq:020}.log`.
pub(crate) fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join("journal").join(format!("{first_seq:020}.log"))
}

/// Where the snapshot of batch `seq` lives.
pub(crate) fn snapshot_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join("snapshots").join(format!("{seq:020}.snap"))
}

/// Where the spare segment waits: zeros, written and synced ahead of the roll that
/// takes it (see [`prepare_spare`]).
pub(crate) fn spare_path(dir: &Path) -> PathBuf {
    dir.join("journal").join("spare")
}

/// Where recovery and repair put the bytes they take out of the store: never deleted by
/// statehub, so what they held can still be looked at (and the directory can be deleted
/// by hand once it has been).
pub(crate) fn damaged_dir(dir: &Path) -> PathBuf {
    dir.join("damaged")
}

/// A journal segment the store knows of.
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    pub(crate) first_seq: u64,
    /// Its length once closed.
    pub(crate) bytes: u64,
    /// Whether it is complete: every segment but the one the committer writes.
    pub(crate) closed: bool,
}

/// The files that hold the store: the snapshot and the segments after it (the last one
/// is the committer's, still growing). Readers hold the lock shared while they read
/// files; the compactor takes it exclusively to swap a new snapshot in.
#[derive(Debug, Default)]
pub(crate) struct FileSet {
    pub(crate) snapshot: Option<Arc<Snapshot>>,
    pub(crate) segments: Vec<Segment>,
    /// Changes whenever the snapshot does.
    pub(crate) generation: u64,
}

impl FileSet {
    /// Bytes of the segments the committer has closed.
    pub(crate) fn closed_bytes(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.closed)
            .map(|s| s.bytes)
            .sum()
    }
}

/// The store's directory and its file set, shared by the committer, the compactor and
/// readers.
#[derive(Debug)]
pub(crate) struct Files {
    pub(crate) dir: PathBuf,
    pub(crate) set: RwLock<FileSet>,
    /// [`crate::Options::segment_bytes`].
    pub(crate) segment_bytes: u64,
    /// [`crate::Options::compact_after_bytes`].
    pub(crate) compact_after: u64,
    /// Rung when a segment closes: the compactor may have work.
    pub(crate) rolled: (Mutex<()>, Condvar),
    /// Rung when a compaction swapped a snapshot in: the journal shrank.
    pub(crate) compacted: (Mutex<()>, Condvar),
    /// Held through a compaction: one at a time (the compactor's, or a forced one).
    pub(crate) compacting: Mutex<()>,
    /// fsync latency and compactions, for the metrics endpoint.
    pub(crate) io: Arc<IoStats>,
    /// Commits fail as on a full disk while set (`Store::set_disk_full`).
    #[cfg(feature = "fault-injection")]
    pub(crate) full: std::sync::atomic::AtomicBool,
}

impl Files {
    pub(crate) fn new(dir: PathBuf, set: FileSet, segment_bytes: u64, compact_after: u64) -> Self {
        Self {
            dir,
            set: RwLock::new(set),
            segment_bytes,
            compact_after,
            rolled: (Mutex::new(()), Condvar::new()),
            compacted: (Mutex::new(()), Condvar::new()),
            compacting: Mutex::new(()),
            io: Arc::default(),
            #[cfg(feature = "fault-injection")]
            full: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn notify_rolled(&self) {
        let _guard = self.rolled.0.lock();
        self.rolled.1.notify_all();
    }

    pub(crate) fn notify_compacted(&self) {
        let _guard = self.compacted.0.lock();
        self.compacted.1.notify_all();
    }
}

/// Writes the spare segment (zeros, synced) unless one is waiting already. It holds a
/// segment's size plus room for the commit that crosses it (usually; a larger one grows
/// the file). A failed attempt leaves nothing behind (a half-written spare would hold
/// disk space a full disk needs back).
///
/// Why zeros written in advance: appending grows the file, and an `fdatasync` after an
/// append must also write the inode (its size), one more I/O the sync waits for before
/// the device flush. Overwriting bytes that are already there changes no metadata. On
/// the development machine's virtio disk that made `--sync always` about 13% faster
/// (64 clients, A/B of the same binary with and without a zeroed segment).
pub(crate) fn prepare_spare(files: &Files) -> std::io::Result<()> {
    let spare = spare_path(&files.dir);
    if spare.exists() {
        return Ok(());
    }
    let tmp = spare.with_extension("tmp");
    let written = write_zeros(&tmp, files.segment_bytes + files.segment_bytes / 8)
        .and_then(|()| std::fs::rename(&tmp, &spare));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn write_zeros(path: &Path, len: u64) -> std::io::Result<()> {
    let mut file = File::create(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

/// A failed step of making a file durable. Writing it (creating, writing, renaming) may
/// fail for want of space, and is then safe to try again; a failed sync never is (see
/// `committer.rs`), so the two are told apart.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WriteError {
    /// Creating, writing or renaming the file failed.
    #[error(transparent)]
    Write(std::io::Error),
    /// `fsync` or `fdatasync` failed.
    #[error("sync failed: {0}")]
    Sync(std::io::Error),
}

impl WriteError {
    /// The underlying error (a sync's says so).
    pub(crate) fn into_io(self) -> std::io::Error {
        match self {
            Self::Write(e) => e,
            Self::Sync(e) => std::io::Error::new(e.kind(), format!("sync failed: {e}")),
        }
    }
}

/// Whether a failed write found no room: a full file system (`ENOSPC`) or quota
/// (`EDQUOT`). Such a write left nothing the next attempt does not overwrite.
pub(crate) fn no_space(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Writes `bytes` to a new file at `path` durably: under a temporary name, synced,
/// renamed, and the directory synced.
pub(crate) fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut file = File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(parent) => sync_dir(parent),
        None => Ok(()),
    }
}

/// Fsyncs a directory, so that files created or renamed in it stay after a power cut.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The `.log` segments in `dir/journal`, by first sequence number.
pub(crate) fn list_segments(dir: &Path) -> std::io::Result<Vec<Segment>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir.join("journal"))? {
        let path = entry?.path();
        let first = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(first_seq) = first.filter(|&f| f > 0) {
            let bytes = std::fs::metadata(&path)?.len();
            out.push(Segment {
                path,
                first_seq,
                bytes,
                closed: true,
            });
        }
    }
    out.sort_by_key(|s| s.first_seq);
    Ok(out)
}

/// The files of `dir/snapshots`.
#[derive(Debug, Default)]
pub(crate) struct Snapshots {
    /// The `.snap` files by batch, oldest first.
    pub(crate) snapshots: Vec<(u64, PathBuf)>,
    /// Temporary files a compaction left behind.
    pub(crate) temporary: Vec<PathBuf>,
}

/// The files of `dir/snapshots`.
pub(crate) fn list_snapshots(dir: &Path) -> std::io::Result<Snapshots> {
    let (mut snapshots, mut temporary) = (Vec::new(), Vec::new());
    for entry in std::fs::read_dir(dir.join("snapshots"))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            temporary.push(path);
        } else if let Some(seq) = name
            .strip_suffix(".snap")
            .and_then(|n| n.parse::<u64>().ok())
        {
            snapshots.push((seq, path));
        }
    }
    snapshots.sort();
    Ok(Snapshots {
        snapshots,
        temporary,
    })
}
