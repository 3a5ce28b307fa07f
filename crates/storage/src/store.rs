//! [`Store`]: a data directory opened in two steps (recovered by `open.rs`, then
//! started here: the committer, syncer and compactor threads), tables, submitting
//! batches and waiting for them.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::batch::Batch;
use crate::committer;
use crate::compactor;
use crate::error::{OpenError, StorageError};
use crate::files::{prepare_spare, spare_path, FileSet, Files, Segment};
use crate::format::TableNames;
use crate::io_stats::StorageStats;
use crate::journal::{Continue, Log, Registry};
use crate::lock::DirLock;
use crate::open::Opened;
use crate::options::{Options, SyncPolicy};
use crate::shared::Shared;
use crate::syncer::Syncer;
use crate::table::{Disk, Table};

use crate::recovery::Recovery;

/// A handle to an open data directory. Cheap to clone; every clone is the same store.
/// See the crate docs for the contract.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: std::path::PathBuf,
    files: Arc<Files>,
    disk: Arc<Disk>,
    registry: Arc<Registry>,
    committer: Mutex<Option<JoinHandle<()>>>,
    syncer: Mutex<Option<(Arc<Syncer>, JoinHandle<()>)>>,
    compactor: Mutex<Option<JoinHandle<()>>>,
    stop_compactor: Arc<AtomicBool>,
    recovery: Recovery,
    /// Released by `close` once the threads above have stopped (or with the store).
    lock: Mutex<Option<DirLock>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// A submitted batch's place in line: await it before acknowledging the batch's writes.
#[derive(Debug, Clone)]
pub struct Ticket {
    seq: u64,
    shared: Arc<Shared>,
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, recovering it from its snapshot and
    /// journal, and starts its committer and compactor threads. Fails if another process
    /// holds the directory, or if files are damaged (see the crate docs for the outcomes).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, OpenError> {
        let opened = Opened::recover(dir.as_ref())?;
        Store::start(opened, options)
    }

    /// Starts the threads of a recovered directory.
    fn start(opened: Opened, options: Options) -> Result<Store, OpenError> {
        let Opened {
            dir,
            lock,
            snapshot,
            mut segments,
            overlay,
            last_seq,
            resume,
            recovery,
        } = opened;
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        let (registry, resume) = resume_point(resume, &mut segments);
        let registry = Arc::new(registry);
        let files = Arc::new(Files::new(
            dir.clone(),
            FileSet {
                snapshot: snapshot.clone(),
                segments,
                generation: 0,
            },
            options.segment_bytes.max(1024),
            options.compact_after_bytes.max(1),
        ));
        // The first segment of this run, zeros ready (see `files::prepare_spare`).
        prepare_spare(&files).map_err(io(&spare_path(&dir)))?;
        let shared = Arc::new(Shared::new(options.max_pending_bytes, last_seq));
        let disk = Arc::new(Disk::new(
            files.clone(),
            shared.clone(),
            last_seq,
            snapshot,
            overlay,
        ));
        let syncer = match options.sync {
            SyncPolicy::Interval(_) => {
                Some(Syncer::start(shared.clone(), files.io.clone()).map_err(io(&dir))?)
            }
            SyncPolicy::Always => None,
        };
        let backend = Log::new(
            files.clone(),
            registry.clone(),
            last_seq,
            resume,
            syncer.as_ref().map(|(s, _)| s.clone()),
            options.max_journal_bytes,
            {
                let disk = disk.clone();
                Box::new(move || disk.drop_view())
            },
        )
        .map_err(io(&dir.join("journal")))?;
        let (committer, compactor, stop_compactor) =
            spawn(&shared, backend, options.sync, &files).map_err(io(&dir))?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                files,
                disk,
                registry,
                committer: Mutex::new(Some(committer)),
                syncer: Mutex::new(syncer),
                compactor: Mutex::new(Some(compactor)),
                stop_compactor,
                recovery,
                lock: Mutex::new(Some(lock)),
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Its files and what the store's threads did with the disk so far.
    pub fn io_stats(&self) -> StorageStats {
        let files = &self.inner.files;
        StorageStats::read(&files.io, &files.set.read())
    }

    #[cfg(test)]
    pub(crate) fn files(&self) -> &Arc<Files> {
        self.inner.disk.files()
    }

    /// What recovery did on open.
    pub fn recovery(&self) -> &Recovery {
        &self.inner.recovery
    }

    /// Opens the table `name` (1 to 255 bytes), creating it empty if it does not exist.
    pub fn table(&self, name: &str) -> Result<Table, StorageError> {
        if name.is_empty() || name.len() > 255 {
            return Err(StorageError::Table {
                table: name.to_owned(),
                source: Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                    "table names are 1 to 255 bytes",
                )),
            });
        }
        if self.inner.registry.len() >= usize::from(u16::MAX) {
            return Err(StorageError::Table {
                table: name.to_owned(),
                source: Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                    "too many tables",
                )),
            });
        }
        Ok(Table::new(
            name,
            self.inner.registry.id(name),
            self.inner.disk.clone(),
        ))
    }

    fn shared(&self) -> &Arc<Shared> {
        self.inner.disk.shared()
    }

    /// Queues `batch` for the committer and returns its ticket. Never blocks and does no
    /// I/O. Fails once the store has failed or closed.
    pub fn submit(&self, batch: Batch) -> Result<Ticket, StorageError> {
        let seq = self.shared().submit(batch)?;
        Ok(Ticket {
            seq,
            shared: self.shared().clone(),
        })
    }

    /// Waits while more than [`Options::max_pending_bytes`] are queued; call it before
    /// work that will submit. Returns at once if the store failed (the submit will say so)
    /// or writes wait for disk space (see [`Store::stall_error`]).
    pub async fn admit(&self) {
        self.shared().admit().await;
    }

    /// Whether [`Store::admit`] would return at once (nothing waits for it).
    pub fn admits(&self) -> bool {
        self.shared().admits()
    }

    /// The sequence number of the last batch submitted (the last recovered at open if
    /// none since; 0 for a new store).
    pub fn last_seq(&self) -> u64 {
        self.shared().last_seq()
    }

    /// The highest sequence number whose batch, and every earlier one, is durable.
    pub fn durable_seq(&self) -> u64 {
        self.shared().durable_seq()
    }

    /// A ticket for sequence number `seq` (one returned by an earlier submit).
    pub fn ticket(&self, seq: u64) -> Ticket {
        Ticket {
            seq,
            shared: self.shared().clone(),
        }
    }

    /// [`StorageError::NoSpace`] while writes wait for disk space: batches submitted
    /// meanwhile are queued and written once there is room, and callers are to refuse new
    /// writes (and not wait in [`Store::admit`], which returns at once then). Cheap: one
    /// atomic load when writes are not waiting.
    pub fn stall_error(&self) -> Option<StorageError> {
        self.shared().stall_error()
    }

    /// Resolves once writes no longer wait for disk space (at once if they do not), or the
    /// store has stopped.
    pub async fn unstalled(&self) {
        self.shared().unstalled().await;
    }

    /// While writes wait for disk space ([`Store::stall_error`]): the keys of `table` that
    /// batches not yet durable write, so that a reader can tell whether what it reads is
    /// durable. Decodes every such batch (at most [`Options::max_pending_bytes`] and a
    /// group); `None` when writes do not wait.
    pub fn pending_keys(&self, table: &Table) -> Option<Vec<Bytes>> {
        self.shared().pending_keys(table.id())
    }

    /// Makes every commit from now on fail as a write to a full disk does (`ENOSPC`), or
    /// stops doing so: for the tests of the crates that use the store.
    #[cfg(feature = "fault-injection")]
    pub fn set_disk_full(&self, full: bool) {
        self.inner.disk.files().full.store(full, Ordering::Release);
    }

    /// The failure that broke the store, if one did.
    pub fn failure(&self) -> Option<StorageError> {
        self.shared().failure()
    }

    /// Bytes the data directory's snapshot and journal occupy on disk.
    pub fn disk_space(&self) -> u64 {
        ["journal", "snapshots"]
            .iter()
            .filter_map(|sub| std::fs::read_dir(self.inner.dir.join(sub)).ok())
            .flat_map(|entries| entries.flatten())
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }

    /// Folds the journal's closed segments into a new snapshot now, instead of when
    /// the compactor next finds it worth it (for tests and tools).
    pub fn compact(&self) -> Result<(), StorageError> {
        compactor::compact(self.inner.disk.files(), &AtomicBool::new(false))
            .map_err(|e| StorageError::Failed(Arc::new(e)))
    }

    /// Commits and syncs everything submitted, then stops the committer and the
    /// compactor: later submits fail with [`StorageError::Closed`]. Returns the store's
    /// failure if it had one. Dropping the last handle does the same.
    pub fn close(&self) -> Result<(), StorageError> {
        self.inner.close()
    }
}

/// The committer and the compactor threads, and the compactor's stop flag.
type Threads = (JoinHandle<()>, JoinHandle<()>, Arc<AtomicBool>);

fn spawn(
    shared: &Arc<Shared>,
    backend: Log,
    sync: SyncPolicy,
    files: &Arc<Files>,
) -> std::io::Result<Threads> {
    let committer = std::thread::Builder::new()
        .name("storage-committer".to_owned())
        .spawn({
            let shared = shared.clone();
            move || committer::run(shared, backend, sync)
        })?;
    let stop = Arc::new(AtomicBool::new(false));
    let compactor = std::thread::Builder::new()
        .name("storage-compactor".to_owned())
        .spawn({
            let (files, stop) = (files.clone(), stop.clone());
            move || compactor::run(files, stop)
        })?;
    Ok((committer, compactor, stop))
}

impl Inner {
    fn close(&self) -> Result<(), StorageError> {
        self.disk.shared().request_close();
        if let Some(handle) = self.committer.lock().take() {
            if handle.join().is_err() {
                tracing::error!("the storage committer thread panicked");
            }
        }
        if let Some((syncer, handle)) = self.syncer.lock().take() {
            syncer.stop();
            if handle.join().is_err() {
                tracing::error!("the storage syncer thread panicked");
            }
        }
        self.stop_compactor.store(true, Ordering::Release);
        self.disk.files().notify_rolled();
        if let Some(handle) = self.compactor.lock().take() {
            if handle.join().is_err() {
                tracing::error!("the storage compactor thread panicked");
            }
        }
        drop(self.lock.lock().take());
        match self.disk.shared().failure() {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(error = %e, dir = %self.dir.display(), "store closed after a failure");
        }
    }
}

impl Ticket {
    /// The batch's sequence number (batches are applied in this order).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Whether the batch is durable already.
    pub fn is_durable(&self) -> bool {
        self.shared.durable_seq() >= self.seq
    }

    /// Resolves once the batch (and every earlier one) is durable, or with the store's
    /// failure. Cancel-safe; never holds a lock while pending.
    pub async fn durable(&self) -> Result<(), StorageError> {
        self.shared.wait(self.seq).await
    }

    /// Blocks the thread until [`Ticket::durable`] would resolve. Not for async code.
    pub fn wait(&self) -> Result<(), StorageError> {
        self.shared.wait_blocking(self.seq)
    }
}

/// The tables' registry, and where the journal goes on: in the last segment, reopened,
/// if its tables can keep their ids; else in a new segment with a fresh registry.
fn resume_point(
    resume: Option<(Continue, TableNames)>,
    segments: &mut [Segment],
) -> (Registry, Option<Continue>) {
    match resume.and_then(|(at, tables)| Some((Registry::continuing(&tables)?, at))) {
        Some((registry, at)) => {
            if let Some(last) = segments.last_mut() {
                last.closed = false;
            }
            (registry, Some(at))
        }
        None => (Registry::default(), None),
    }
}

#[cfg(test)]
#[path = "store_test.rs"]
mod tests;
