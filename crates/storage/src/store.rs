//! [`Store`]: opening a data directory, tables, submitting batches, waiting for them,
//! and reading tables back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::{Mutex, RwLockReadGuard};

use crate::batch::Batch;
use crate::committer::{self, Shared};
use crate::compactor;
use crate::error::{OpenError, StorageError};
use crate::journal::{prepare_spare, spare_path, FileSet, Files, Log, Overlay, Registry};
use crate::lock::DirLock;
use crate::manifest::Manifest;
use crate::merge::merge;
use crate::options::{Options, SyncPolicy};
use crate::recovery::{recover, Recovered};
use crate::snapshot::{Snapshot, SnapshotDamage};
use crate::syncer::Syncer;

/// A handle to an open data directory. Cheap to clone; every clone is the same store.
/// See the crate docs for the contract.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    disk: Arc<Disk>,
    registry: Arc<Registry>,
    committer: Mutex<Option<JoinHandle<()>>>,
    syncer: Mutex<Option<(Arc<Syncer>, JoinHandle<()>)>>,
    compactor: Mutex<Option<JoinHandle<()>>>,
    stop_compactor: Arc<AtomicBool>,
    recovery: Recovery,
    // Declared last: released only after the threads above have stopped.
    _lock: DirLock,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What recovery did when the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Journal segments whose torn or damaged tail recovery discarded (overwrote with
    /// zeros).
    pub truncated_journals: Vec<TruncatedJournal>,
}

/// A journal segment that recovery cut short of what had been written in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedJournal {
    /// The segment file.
    pub path: PathBuf,
    /// Where its written bytes ended before opening.
    pub written: u64,
    /// Where they end after recovery: the end of its last whole batch.
    pub after: u64,
}

/// What reads see: a snapshot and the journal's changes since, as of a durable batch.
#[derive(Debug)]
struct View {
    seq: u64,
    generation: u64,
    snapshot: Option<Arc<Snapshot>>,
    overlay: Overlay,
}

/// The files and what reads need of them; shared by tables and the committer.
#[derive(Debug)]
pub(crate) struct Disk {
    files: Arc<Files>,
    shared: Arc<Shared>,
    /// The last view built, kept while no batch has been committed since: start-up reads
    /// every table once, from the view recovery built, without reading the journal
    /// again. The committer drops it at its next commit.
    view: Mutex<Option<Arc<View>>>,
    view_held: AtomicBool,
}

impl Disk {
    /// The view as of the durable watermark, with the file set locked so its files stay.
    fn view(&self) -> Result<(Arc<View>, RwLockReadGuard<'_, FileSet>), StorageError> {
        let set = self.files.set.read();
        let durable = self.shared.durable_seq();
        if let Some(view) = self.view.lock().as_ref() {
            if view.seq == durable && view.generation == set.generation {
                return Ok((view.clone(), set));
            }
        }
        let after = set.snapshot.as_ref().map_or(0, |s| s.seq);
        let mut changes = crate::journal::Changes::default();
        for segment in &set.segments {
            let tail = if segment.closed {
                crate::journal::Tail::Whole
            } else {
                crate::journal::Tail::Live { upto: durable }
            };
            crate::journal::scan(
                &segment.path,
                segment.first_seq,
                after,
                tail,
                &mut changes.sink(),
            )
            .map_err(|d| StorageError::Corrupt {
                files: d.path.display().to_string(),
                detail: d.detail,
            })?;
        }
        let view = Arc::new(View {
            seq: durable,
            generation: set.generation,
            snapshot: set.snapshot.clone(),
            overlay: changes.sorted(),
        });
        *self.view.lock() = Some(view.clone());
        self.view_held.store(true, Ordering::Release);
        Ok((view, set))
    }

    /// Forgets the view (a batch was committed after it).
    fn drop_view(&self) {
        if self.view_held.swap(false, Ordering::AcqRel) {
            *self.view.lock() = None;
        }
    }
}

/// A named table of a [`Store`]. Cheap to clone.
#[derive(Clone)]
pub struct Table {
    name: Arc<str>,
    id: u16,
    disk: Arc<Disk>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Table").field(&self.name).finish()
    }
}

/// A submitted batch's place in line: await it before acknowledging the batch's writes.
#[derive(Debug, Clone)]
pub struct Ticket {
    seq: u64,
    shared: Arc<Shared>,
}

/// One key and value read from a table.
#[derive(Debug, Clone)]
pub struct Record {
    key: Bytes,
    value: Bytes,
}

impl Record {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }
}

fn corrupt_read(d: SnapshotDamage) -> StorageError {
    StorageError::Corrupt {
        files: d.path.display().to_string(),
        detail: d.detail,
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, recovering it from its snapshot and
    /// journal, and starts its committer and compactor threads. Fails if another process
    /// holds the directory, or if files are damaged (see the crate docs for the outcomes).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, OpenError> {
        let dir = dir.as_ref().to_owned();
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| OpenError::Io { path, source }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let lock = DirLock::acquire(&dir)?;
        if dir.join("db").is_dir() {
            return Err(OpenError::Unsupported {
                dir: dir.clone(),
                detail: "it holds an older statehub's store (db/, the fjall layout), which this version does not read"
                    .to_owned(),
            });
        }
        for sub in ["journal", "snapshots"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(&dir.join(sub)))?;
        }
        let Recovered {
            snapshot,
            mut segments,
            overlay,
            last_seq,
            truncated_journals,
            obsolete,
            resume,
        } = recover(&dir)?;
        for t in &truncated_journals {
            tracing::warn!(
                journal = %t.path.display(),
                discarded_bytes = t.written - t.after,
                "recovery discarded the end of a journal after its last whole batch: either a \
                 batch statehub was writing when it stopped (never acknowledged), or damage, in \
                 which case the writes after the damaged point are lost; every batch before it is kept"
            );
        }
        // Go on writing the last segment, if its tables can keep their ids.
        let (registry, resume) =
            match resume.and_then(|(at, tables)| Some((Registry::continuing(&tables)?, at))) {
                Some((registry, at)) => {
                    if let Some(last) = segments.last_mut() {
                        last.closed = false;
                    }
                    (registry, Some(at))
                }
                None => (Registry::default(), None),
            };
        let registry = Arc::new(registry);
        let view = View {
            seq: last_seq,
            generation: 0,
            snapshot: snapshot.clone(),
            overlay,
        };
        let set = FileSet {
            snapshot,
            segments,
            generation: 0,
        };
        // What recovery kept (a new store's first manifest, or one without a segment it
        // removed).
        Manifest::of(&set)
            .write(&dir)
            .map_err(io(&Manifest::path(&dir)))?;
        for path in &obsolete {
            std::fs::remove_file(path).map_err(io(path))?;
        }
        let files = Arc::new(Files::new(
            dir.clone(),
            set,
            options.segment_bytes.max(1024),
            options.compact_after_bytes.max(1),
        ));
        // The first segment of this run, zeros ready (see `journal::prepare_spare`).
        prepare_spare(&files).map_err(io(&spare_path(&dir)))?;
        let shared = Arc::new(Shared::new(options.max_pending_bytes, last_seq));
        let disk = Arc::new(Disk {
            files: files.clone(),
            shared: shared.clone(),
            view: Mutex::new(Some(Arc::new(view))),
            view_held: AtomicBool::new(true),
        });
        let syncer = match options.sync {
            SyncPolicy::Interval(_) => Some(Syncer::start(shared.clone()).map_err(io(&dir))?),
            SyncPolicy::Always => None,
        };
        let backend = Log::new(
            files.clone(),
            registry.clone(),
            last_seq,
            resume,
            syncer.as_ref().map(|(s, _)| s.clone()),
            {
                let disk = disk.clone();
                Box::new(move || disk.drop_view())
            },
        )
        .map_err(io(&dir.join("journal")))?;
        let committer = std::thread::Builder::new()
            .name("storage-committer".to_owned())
            .spawn({
                let shared = shared.clone();
                move || committer::run(shared, backend, options.sync)
            })
            .map_err(io(&dir))?;
        let stop_compactor = Arc::new(AtomicBool::new(false));
        let compactor = std::thread::Builder::new()
            .name("storage-compactor".to_owned())
            .spawn({
                let (files, stop) = (files.clone(), stop_compactor.clone());
                move || compactor::run(files, stop)
            })
            .map_err(io(&dir))?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                disk,
                registry,
                committer: Mutex::new(Some(committer)),
                syncer: Mutex::new(syncer),
                compactor: Mutex::new(Some(compactor)),
                stop_compactor,
                recovery: Recovery { truncated_journals },
                _lock: lock,
            }),
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
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
        Ok(Table {
            name: Arc::from(name),
            id: self.inner.registry.id(name),
            disk: self.inner.disk.clone(),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.inner.disk.shared
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
    /// work that will submit. Returns at once if the store failed (the submit will say so).
    pub async fn admit(&self) {
        self.shared().admit().await;
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
        compactor::compact(&self.inner.disk.files, &AtomicBool::new(false))
            .map_err(|e| StorageError::Failed(Arc::new(e)))
    }

    /// Commits and syncs everything submitted, then stops the committer and the
    /// compactor: later submits fail with [`StorageError::Closed`]. Returns the store's
    /// failure if it had one. Dropping the last handle does the same.
    pub fn close(&self) -> Result<(), StorageError> {
        self.inner.close()
    }
}

impl Inner {
    fn close(&self) -> Result<(), StorageError> {
        self.disk.shared.request_close();
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
        self.disk.files.notify_rolled();
        if let Some(handle) = self.compactor.lock().take() {
            if handle.join().is_err() {
                tracing::error!("the storage compactor thread panicked");
            }
        }
        match self.disk.shared.failure() {
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

impl Table {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's id in this process's journal segments.
    pub(crate) fn id(&self) -> u16 {
        self.id
    }

    /// The committed value of `key`. Reads files: for start-up and inspection.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let (view, _files) = self.disk.view()?;
        if let Some(changes) = view.overlay.get(&self.name) {
            if let Ok(i) = changes.binary_search_by(|(k, _)| k[..].cmp(key)) {
                return Ok(changes[i].1.as_ref().map(|v| v.to_vec()));
            }
        }
        let Some(snapshot) = &view.snapshot else {
            return Ok(None);
        };
        for record in snapshot.records(&self.name) {
            let (k, v) = record.map_err(corrupt_read)?;
            match (*k).cmp(key) {
                std::cmp::Ordering::Less => continue,
                std::cmp::Ordering::Equal => return Ok(Some(v.to_vec())),
                std::cmp::Ordering::Greater => break,
            }
        }
        Ok(None)
    }

    /// About how many records the table holds, without reading them all: keys changed
    /// in the journal since the snapshot may be counted twice. For sizing what a full
    /// read will fill.
    pub fn approximate_len(&self) -> usize {
        let Ok((view, _files)) = self.disk.view() else {
            return 0;
        };
        let snapshot = view
            .snapshot
            .as_ref()
            .and_then(|s| s.table(&self.name))
            .map_or(0, |t| t.records);
        let changes = view.overlay.get(&self.name).map_or(0, |t| t.len());
        usize::try_from(snapshot)
            .unwrap_or(usize::MAX)
            .saturating_add(changes)
    }

    /// Every committed record, in key order.
    pub fn iter(&self) -> impl Iterator<Item = Result<Record, StorageError>> + '_ {
        self.records(&[])
    }

    /// The committed records whose key starts with `prefix`, in key order.
    pub fn prefix<'a>(
        &'a self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<Record, StorageError>> + 'a {
        self.records(prefix)
    }

    fn records(
        &self,
        prefix: &[u8],
    ) -> Box<dyn Iterator<Item = Result<Record, StorageError>> + '_> {
        let (view, files) = match self.disk.view() {
            Ok(v) => v,
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        let changes: Vec<(Bytes, Option<Bytes>)> = view
            .overlay
            .get(&self.name)
            .map(|t| t[t.partition_point(|(k, _)| k[..] < *prefix)..].to_vec())
            .unwrap_or_default();
        // Opened while the file set is locked, so compaction cannot remove it first.
        let base = view
            .snapshot
            .as_ref()
            .map(|s| s.records(&self.name))
            .into_iter()
            .flatten();
        drop(files);
        let (start, within) = (prefix.to_vec(), prefix.to_vec());
        let records = merge(base, changes)
            .skip_while(move |r| matches!(r, Ok((k, _)) if k[..] < start[..]))
            .take_while(move |r| !matches!(r, Ok((k, _)) if !k.starts_with(&within)))
            .map(|r| {
                r.map(|(key, value)| Record { key, value })
                    .map_err(corrupt_read)
            });
        Box::new(records)
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

#[cfg(test)]
impl Table {
    /// A table that only stages writes, for the committer's unit tests.
    pub(crate) fn for_test(name: &str, id: u16) -> Self {
        let files = Arc::new(Files::new(
            PathBuf::from("/nonexistent"),
            FileSet::default(),
            1 << 20,
            1,
        ));
        let shared = Arc::new(Shared::new(usize::MAX, 0));
        let disk = Arc::new(Disk {
            files,
            shared,
            view: Mutex::new(None),
            view_held: AtomicBool::new(false),
        });
        Self {
            name: Arc::from(name),
            id,
            disk,
        }
    }
}
