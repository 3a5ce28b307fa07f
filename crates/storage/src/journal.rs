//! The journal's writing side: segment files of records, one record per batch,
//! appended by the committer ([`Log`], its [`Backend`]). `scan.rs` reads them back.
//!
//! The committer starts a segment at its first commit after the store opens, when the
//! current one holds [`crate::Options::segment_bytes`], and when a table was opened
//! since the current one started (a segment's header names every table its records
//! use). It starts it in the spare segment (zeros written in advance, see
//! `files::prepare_spare`) when one is waiting.
//! Rolling syncs the finished segment, so a closed segment is complete on disk, syncs
//! the directory after creating the new one, so its name survives a power cut, and then
//! records it in the manifest (`manifest.rs`). Every step of a roll may be done twice
//! (after a full disk failed the first attempt, see `committer.rs`): the new segment's
//! file is opened whether or not an earlier attempt created it, and the file set changes
//! only once the manifest names the new segment.
//!
//! Records are written with `pwrite` at the segment's end as the committer knows it, so
//! a write tried again after a full disk overwrites what the failed one left. The first
//! record of each write carries `format::SYNCED_BEFORE` when every earlier byte of the
//! segment is known synced: always with `--sync always` (each commit synced before the
//! next), with the interval policy once the syncer reports it (`syncer.rs`).
//!
//! Back-pressure: before each commit the committer waits while the closed segments the
//! compactor has not folded yet add up to more than the journal's bound
//! ([`journal_bound`]): writes then wait for the compactor instead of growing the
//! journal without end.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::batch::Batch;
use crate::committer::{Backend, BackendError};
use crate::files::{segment_path, spare_path, sync_dir, Files, Segment};
use crate::format::{self, segment_header, TableNames};
use crate::io_stats::IoStats;
use crate::manifest::Manifest;
use crate::syncer::{Syncer, SYNC_EVERY_BYTES};

/// The names of the tables opened so far, indexed by their ids in this process (a
/// segment's header maps its own ids to names, so ids need not agree across runs).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    names: Mutex<Vec<Arc<str>>>,
    version: AtomicU64,
}

impl Registry {
    /// A registry holding `tables` under their ids, if those are 0, 1, 2...: the tables
    /// of the segment the committer continues after a restart.
    pub(crate) fn continuing(tables: &[(u16, String)]) -> Option<Registry> {
        let mut sorted = tables.to_vec();
        sorted.sort_by_key(|(id, _)| *id);
        let contiguous = sorted
            .iter()
            .enumerate()
            .all(|(i, (id, _))| usize::from(*id) == i);
        contiguous.then(|| Registry {
            names: Mutex::new(
                sorted
                    .into_iter()
                    .map(|(_, n)| Arc::from(n.as_str()))
                    .collect(),
            ),
            version: AtomicU64::new(0),
        })
    }

    /// The id of table `name`, adding it if new.
    pub(crate) fn id(&self, name: &str) -> u16 {
        let mut names = self.names.lock();
        if let Some(i) = names.iter().position(|n| &**n == name) {
            return i as u16;
        }
        names.push(Arc::from(name));
        self.version.fetch_add(1, Ordering::AcqRel);
        (names.len() - 1) as u16
    }

    pub(crate) fn len(&self) -> usize {
        self.names.lock().len()
    }

    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Every table, as a segment header lists them.
    pub(crate) fn tables(&self) -> TableNames {
        self.names
            .lock()
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u16, n.to_string()))
            .collect()
    }
}

/// The segment being written.
struct Current {
    file: File,
    bytes: u64,
    /// The registry version its header lists.
    registry_version: u64,
    /// Through which offset the committer itself synced it.
    synced: u64,
    /// Bytes written since the syncer was last asked to sync.
    unsynced: u64,
}

impl Current {
    /// A segment with `bytes` written, all of them synced.
    fn new(file: File, bytes: u64, registry_version: u64) -> Self {
        Self {
            file,
            bytes,
            registry_version,
            synced: bytes,
            unsynced: 0,
        }
    }

    /// Whether anything was written since the committer's own last sync (the syncer's
    /// may not have happened yet).
    fn dirty(&self) -> bool {
        self.synced < self.bytes
    }

    /// Syncs what was written; the syncer owes nothing for it any more.
    fn sync(&mut self, io: &IoStats) -> Result<(), BackendError> {
        io.timed(|| self.file.sync_data())
            .map_err(BackendError::sync)?;
        self.synced = self.bytes;
        self.unsynced = 0;
        Ok(())
    }
}

/// The committer's backend: appends each batch as a record to the current segment.
pub(crate) struct Log {
    files: Arc<Files>,
    registry: Arc<Registry>,
    current: Option<Current>,
    buf: Vec<u8>,
    /// The sequence number the next batch gets on disk.
    next_seq: u64,
    /// Set while a write of records failed for want of room: the committer tries the
    /// same batches again, in the same segment at the same offset.
    retrying: bool,
    /// With the interval policy: the thread that syncs the current segment.
    syncer: Option<Arc<Syncer>>,
    /// [`crate::Options::max_journal_bytes`].
    max_journal: u64,
    /// When waiting for the compactor was last logged at warning level (a flood makes
    /// writes wait at every compaction: once a minute is enough).
    journal_warned: Option<std::time::Instant>,
    /// Told after each commit: a view of the tables read at open is stale now.
    on_commit: Box<dyn FnMut() + Send>,
}

/// The segment the committer goes on writing after a restart: its path and where its
/// batches end.
#[derive(Debug, Clone)]
pub(crate) struct Continue {
    pub(crate) path: PathBuf,
    pub(crate) end: u64,
}

/// How much closed journal the compactor may leave unfolded before commits wait for it:
/// `max_journal` or twice the compaction threshold (half the snapshot, at least
/// [`crate::Options::compact_after_bytes`]), whichever is more, so the bound never
/// stops writes before a compaction is due.
pub(crate) fn journal_bound(files: &Files, max_journal: u64) -> u64 {
    let snapshot = files.set.read().snapshot.as_ref().map_or(0, |s| s.len);
    max_journal.max((snapshot / 2).max(files.compact_after).saturating_mul(2))
}

impl Log {
    /// The committer's log, after batch `last_seq`. With `resume` it writes on in that
    /// segment (whose tables the registry holds), so a store restarted often does not
    /// leave a mostly empty segment behind each time; otherwise its first commit starts
    /// a segment.
    pub(crate) fn new(
        files: Arc<Files>,
        registry: Arc<Registry>,
        last_seq: u64,
        resume: Option<Continue>,
        syncer: Option<Arc<Syncer>>,
        max_journal: u64,
        on_commit: Box<dyn FnMut() + Send>,
    ) -> std::io::Result<Self> {
        let current = match resume {
            Some(Continue { path, end }) => {
                let file = OpenOptions::new().write(true).open(path)?;
                // What the previous run wrote may not be on disk yet (with the interval
                // policy, or after a kill): synced now, the first write of this run can
                // say that every byte before it is (`format::SYNCED_BEFORE`).
                file.sync_data()?;
                if let Some(syncer) = &syncer {
                    syncer.set_file(file.try_clone()?, end);
                }
                Some(Current::new(file, end, registry.version()))
            }
            None => None,
        };
        Ok(Self {
            files,
            registry,
            current,
            buf: Vec::with_capacity(64 << 10),
            next_seq: last_seq + 1,
            retrying: false,
            syncer,
            max_journal,
            journal_warned: None,
            on_commit,
        })
    }

    /// Closes the current segment (synced) and starts the next one at `next_seq`, in the
    /// spare segment if one is waiting (see `files::prepare_spare`), else in a new file.
    fn roll(&mut self) -> Result<(), BackendError> {
        // A closed segment is whole on disk before the next one holds anything (with the
        // interval policy the syncer has left little to write; with `always` every
        // commit was synced already).
        if let Some(done) = self.current.as_mut().filter(|d| d.dirty()) {
            done.sync(&self.files.io)?;
        }
        let version = self.registry.version();
        let path = segment_path(&self.files.dir, self.next_seq);
        let file = open_next(&spare_path(&self.files.dir), &path).map_err(BackendError::write)?;
        let header = segment_header(self.next_seq, &self.registry.tables());
        file.write_all_at(&header, 0).map_err(BackendError::write)?;
        file.sync_data().map_err(BackendError::sync)?;
        sync_dir(&self.files.dir.join("journal")).map_err(BackendError::sync)?;
        {
            let mut set = self.files.set.write();
            Manifest {
                snapshot_seq: set.snapshot.as_ref().map_or(0, |s| s.seq),
                newest_segment: self.next_seq,
            }
            .write(&self.files.dir)?;
            if let Some(last) = set.segments.last_mut().filter(|s| !s.closed) {
                last.bytes = self.current.as_ref().map_or(0, |d| d.bytes);
                last.closed = true;
            }
            set.segments.push(Segment {
                path,
                first_seq: self.next_seq,
                bytes: 0,
                closed: false,
            });
        }
        let bytes = header.len() as u64;
        if let Some(syncer) = &self.syncer {
            let handle = file
                .try_clone()
                .map_err(|e| BackendError::Fatal(Box::new(e)))?;
            syncer.set_file(handle, bytes);
        }
        self.current = Some(Current::new(file, bytes, version));
        self.files.notify_rolled();
        Ok(())
    }

    /// Whether the next commit starts a segment: there is none, it is full, or a table was
    /// opened since it started. Never while a write is tried again (its batches use only
    /// tables the segment lists, and a new segment would leave its failed bytes behind).
    fn must_roll(&self) -> bool {
        match &self.current {
            None => true,
            Some(_) if self.retrying => false,
            Some(c) => {
                c.bytes >= self.files.segment_bytes || c.registry_version != self.registry.version()
            }
        }
    }
}

/// The next segment's file at `path`: the spare renamed there, or, without a spare, the
/// file an earlier attempt created, or a new one.
fn open_next(spare: &Path, path: &Path) -> std::io::Result<File> {
    match std::fs::rename(spare, path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

impl Backend for Log {
    fn commit(&mut self, batches: &[Batch], sync: bool) -> Result<(), BackendError> {
        #[cfg(feature = "fault-injection")]
        if self.files.full.load(Ordering::Acquire) {
            let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
            return Err(BackendError::write(full));
        }
        if self.must_roll() {
            self.roll()?;
        }
        let Some(current) = self.current.as_mut() else {
            return Err("no journal segment".into());
        };
        let at = current.bytes;
        let synced_before =
            current.synced >= at || self.syncer.as_ref().is_some_and(|s| s.synced() >= at);
        self.buf.clear();
        self.buf.reserve(
            batches
                .iter()
                .map(|b| b.ops.len() + format::RECORD_OVERHEAD)
                .sum(),
        );
        let mut seq = self.next_seq;
        for (i, batch) in batches.iter().enumerate() {
            format::put_record(&mut self.buf, seq, i == 0 && synced_before, &batch.ops);
            seq += 1;
        }
        if let Err(e) = current.file.write_all_at(&self.buf, at) {
            self.retrying = true;
            return Err(BackendError::write(e));
        }
        self.retrying = false;
        self.next_seq = seq;
        current.bytes += self.buf.len() as u64;
        self.files.io.set_current_segment(current.bytes);
        if sync {
            current.sync(&self.files.io)?;
        } else {
            current.unsynced += self.buf.len() as u64;
            if let Some(syncer) = self
                .syncer
                .as_ref()
                .filter(|_| current.unsynced >= SYNC_EVERY_BYTES)
            {
                syncer.request(current.bytes);
                current.unsynced = 0;
            }
        }
        (self.on_commit)();
        Ok(())
    }

    fn sync(&mut self) -> Result<(), BackendError> {
        match self.current.as_mut() {
            Some(current) => current.sync(&self.files.io),
            None => Ok(()),
        }
    }

    fn sync_soon(&mut self) -> Result<(), BackendError> {
        match (&self.syncer, self.current.as_mut()) {
            (Some(syncer), Some(current)) => {
                syncer.request(current.bytes);
                current.unsynced = 0;
                Ok(())
            }
            _ => self.sync(),
        }
    }

    fn wait_for_room(&mut self, give_up: &dyn Fn() -> bool) {
        let bound = journal_bound(&self.files, self.max_journal);
        let backlog = || self.files.set.read().closed_bytes();
        if backlog() <= bound {
            return;
        }
        let warn = self
            .journal_warned
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
        let message = "storage: the journal waiting for compaction is over its bound; \
                       writes wait for the compactor";
        if warn {
            self.journal_warned = Some(std::time::Instant::now());
            tracing::warn!(journal_bytes = backlog(), bound, "{message}");
        } else {
            tracing::debug!(journal_bytes = backlog(), bound, "{message}");
        }
        let started = std::time::Instant::now();
        let mut guard = self.files.compacted.0.lock();
        while backlog() > journal_bound(&self.files, self.max_journal) && !give_up() {
            // A timeout as well: a close sets `give_up` without ringing this condvar.
            self.files
                .compacted
                .1
                .wait_for(&mut guard, Duration::from_millis(100));
        }
        let waited_ms = started.elapsed().as_millis() as u64;
        if warn {
            tracing::info!(waited_ms, "storage: the compactor caught up; writes go on");
        }
    }
}
