//! What the store's threads did with the disk, counted for the metrics endpoint: fsync
//! latency, compactions, the bytes of the segment being written. Atomics the committer,
//! syncer and compactor threads update once per fsync, commit or compaction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use statehub_stats::{Histogram, HistogramSnapshot};

#[derive(Debug, Default)]
pub(crate) struct IoStats {
    fsync: Histogram,
    compactions: AtomicU64,
    compaction_failures: AtomicU64,
    /// Bytes of the segment the committer is writing (closed ones are in the file set).
    current_segment: AtomicU64,
}

impl IoStats {
    /// Runs `sync` (an fsync or fdatasync) and records how long it took.
    pub(crate) fn timed<T>(&self, sync: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = sync();
        self.fsync.record(start.elapsed());
        out
    }

    pub(crate) fn compacted(&self, ok: bool) {
        let counter = match ok {
            true => &self.compactions,
            false => &self.compaction_failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_current_segment(&self, bytes: u64) {
        self.current_segment.store(bytes, Ordering::Relaxed);
    }
}

/// The store's files and disk activity, as read at one moment ([`crate::Store::io_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StorageStats {
    /// fsync/fdatasync calls on journal segments, and their latency.
    pub fsync: HistogramSnapshot,
    /// Compactions that folded the journal into a new snapshot.
    pub compactions: u64,
    /// Compactions that failed (retried later).
    pub compaction_failures: u64,
    /// Bytes of journal segments on disk (closed ones and the one being written).
    pub journal_bytes: u64,
    /// Journal segments on disk.
    pub journal_segments: u64,
    /// Bytes of the current snapshot.
    pub snapshot_bytes: u64,
}

impl StorageStats {
    pub(crate) fn read(io: &IoStats, set: &crate::files::FileSet) -> StorageStats {
        let closed = set.closed_bytes();
        let current = match set.segments.last() {
            Some(last) if !last.closed => io.current_segment.load(Ordering::Relaxed),
            _ => 0,
        };
        StorageStats {
            fsync: io.fsync.snapshot(),
            compactions: io.compactions.load(Ordering::Relaxed),
            compaction_failures: io.compaction_failures.load(Ordering::Relaxed),
            journal_bytes: closed + current,
            journal_segments: set.segments.len() as u64,
            snapshot_bytes: set.snapshot.as_ref().map_or(0, |s| s.len),
        }
    }
}
