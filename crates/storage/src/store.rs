//! [`Store`]: opening a data directory, tables, submitting batches, waiting for them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fjall::{Keyspace, KeyspaceCreateOptions, Slice};
use parking_lot::Mutex;

use crate::batch::Batch;
use crate::committer::{self, Fjall, Shared};
use crate::error::{describe, is_damage, OpenError, StorageError};
use crate::lock::DirLock;
use crate::options::Options;

/// Journals never grow past this before their memtables are flushed to table files
/// (fjall's minimum). Together with [`MEMTABLE_BYTES`] it bounds how much journal a
/// start-up replays: measured, 1M keys of 100 bytes open and load in under a second.
const MAX_JOURNAL_BYTES: u64 = 64 << 20;
/// Size at which a table's in-memory write buffer is flushed to a table file.
const MEMTABLE_BYTES: u64 = 16 << 20;

/// A handle to an open data directory. Cheap to clone; every clone is the same store.
/// See the crate docs for the contract.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    db: fjall::Database,
    shared: Arc<Shared>,
    committer: Mutex<Option<JoinHandle<()>>>,
    recovery: Recovery,
    // Declared last: released only after the database above is dropped.
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
    /// Journals whose damaged or torn tail recovery cut off.
    pub truncated_journals: Vec<TruncatedJournal>,
}

/// A journal that recovery cut short of what had been written in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TruncatedJournal {
    /// The journal file.
    pub path: PathBuf,
    /// Where its written bytes ended before opening (its last non-zero byte + 1).
    pub written: u64,
    /// Its length after recovery: the end of its last whole batch.
    pub after: u64,
}

/// A named table of a [`Store`]. Cheap to clone.
#[derive(Clone)]
pub struct Table {
    name: Arc<str>,
    pub(crate) keyspace: Keyspace,
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
    key: Slice,
    value: Slice,
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

fn journal_paths(db_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(db_dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jnl"))
        .collect();
    paths.sort();
    paths
}

/// How far a journal holds written bytes: the offset after its last non-zero byte.
/// Journals are preallocated, zero-filled files, so their length says nothing; this
/// skips the unwritten hole at the end (`SEEK_HOLE`/`SEEK_DATA`, where the file system
/// keeps one) and scans the rest backwards, a megabyte at a time.
fn written_extent(path: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const CHUNK: u64 = 1 << 20;
    let mut file = std::fs::File::open(path)?;
    let mut end = data_end(&file)?;
    let mut buf = vec![0u8; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let chunk = &mut buf[..usize::try_from(end - start).unwrap_or(0)];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// The end of the file's last data region (its length if it has no holes).
fn data_end(file: &std::fs::File) -> std::io::Result<u64> {
    use rustix::fs::{seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut end = 0;
    let mut pos = 0;
    while pos < len {
        let Ok(data) = seek(file, SeekFrom::Data(pos)) else {
            break;
        };
        let hole = seek(file, SeekFrom::Hole(data)).map_err(std::io::Error::from)?;
        end = hole;
        pos = hole;
    }
    Ok(end.min(len))
}

/// The written extent of every journal, before recovery touches them.
fn journal_extents(db_dir: &Path) -> Vec<(PathBuf, u64)> {
    journal_paths(db_dir)
        .into_iter()
        .filter_map(|p| Some((p.clone(), written_extent(&p).ok()?)))
        .collect()
}

/// Journals whose recovered length is shorter than what was written in them.
fn truncated_journals(before: Vec<(PathBuf, u64)>) -> Vec<TruncatedJournal> {
    before
        .into_iter()
        .filter_map(|(path, written)| {
            let after = std::fs::metadata(&path).ok()?.len();
            (after < written).then_some(TruncatedJournal {
                path,
                written,
                after,
            })
        })
        .collect()
}

/// The journal files of `db_dir`, for messages about damage found while opening.
fn journal_names(db_dir: &Path) -> String {
    let names: Vec<String> = journal_paths(db_dir)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    match names.len() {
        0 => format!("files under {}", db_dir.display()),
        _ => format!(
            "journal {} or the table files under {}",
            names.join(", "),
            db_dir.join("keyspaces").display()
        ),
    }
}

fn open_error(dir: &Path, db_dir: &Path, error: fjall::Error) -> OpenError {
    if is_damage(&error) {
        return OpenError::Corrupt {
            dir: dir.to_owned(),
            files: journal_names(db_dir),
            detail: describe(&error),
        };
    }
    match error {
        fjall::Error::Io(source) => OpenError::Io {
            path: db_dir.to_owned(),
            source,
        },
        other => OpenError::Backend {
            dir: dir.to_owned(),
            source: Box::new(other),
        },
    }
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, replaying its journal, and starts
    /// its committer thread. Fails if another process holds the directory, or if files
    /// are damaged (see the crate docs for the outcomes).
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store, OpenError> {
        let dir = dir.as_ref().to_owned();
        std::fs::create_dir_all(&dir).map_err(|source| OpenError::Io {
            path: dir.clone(),
            source,
        })?;
        let lock = DirLock::acquire(&dir)?;
        let db_dir = dir.join("db");
        let before = journal_extents(&db_dir);
        let opened = catch_unwind(AssertUnwindSafe(|| {
            fjall::Database::builder(&db_dir)
                .manual_journal_persist(true)
                .max_journaling_size(MAX_JOURNAL_BYTES)
                .worker_threads(1)
                .open()
        }));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(e)) => return Err(open_error(&dir, &db_dir, e)),
            Err(_) => {
                return Err(OpenError::Corrupt {
                    dir: dir.clone(),
                    files: journal_names(&db_dir),
                    detail: "the storage engine panicked while recovering (see the message above)"
                        .to_owned(),
                })
            }
        };
        let truncated_journals = truncated_journals(before);
        for t in &truncated_journals {
            tracing::warn!(
                journal = %t.path.display(),
                discarded_bytes = t.written - t.after,
                "recovery discarded the end of a journal after its last whole batch: either a \
                 batch statehub was writing when it stopped (never acknowledged), or damage, in \
                 which case the writes after the damaged point are lost; every batch before it is kept"
            );
        }
        let shared = Arc::new(Shared::new(options.max_pending_bytes));
        let committer = std::thread::Builder::new()
            .name("storage-committer".to_owned())
            .spawn({
                let shared = shared.clone();
                let backend = Fjall(db.clone());
                move || committer::run(shared, backend, options.sync)
            })
            .map_err(|source| OpenError::Io {
                path: dir.clone(),
                source,
            })?;
        Ok(Store {
            inner: Arc::new(Inner {
                dir,
                db,
                shared,
                committer: Mutex::new(Some(committer)),
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
        let invalid = || StorageError::Table {
            table: name.to_owned(),
            source: Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(
                "table names are 1 to 255 bytes",
            )),
        };
        if name.is_empty() || name.len() > 255 {
            return Err(invalid());
        }
        let keyspace = self
            .inner
            .db
            .keyspace(name, || {
                KeyspaceCreateOptions::default()
                    .max_memtable_size(MEMTABLE_BYTES)
                    .manual_journal_persist(true)
                    .expect_point_read_hits(true)
            })
            .map_err(|e| StorageError::Table {
                table: name.to_owned(),
                source: Arc::new(e),
            })?;
        Ok(Table {
            name: Arc::from(name),
            keyspace,
        })
    }

    /// Queues `batch` for the committer and returns its ticket. Never blocks and does no
    /// I/O. Fails once the store has failed or closed.
    pub fn submit(&self, batch: Batch) -> Result<Ticket, StorageError> {
        let seq = self.inner.shared.submit(batch)?;
        Ok(Ticket {
            seq,
            shared: self.inner.shared.clone(),
        })
    }

    /// Waits while more than [`Options::max_pending_bytes`] are queued; call it before
    /// work that will submit. Returns at once if the store failed (the submit will say so).
    pub async fn admit(&self) {
        self.inner.shared.admit().await;
    }

    /// The sequence number of the last batch submitted (0 if none).
    pub fn last_seq(&self) -> u64 {
        self.inner.shared.last_seq()
    }

    /// The highest sequence number whose batch, and every earlier one, is durable.
    pub fn durable_seq(&self) -> u64 {
        self.inner.shared.durable_seq()
    }

    /// A ticket for sequence number `seq` (one returned by an earlier submit).
    pub fn ticket(&self, seq: u64) -> Ticket {
        Ticket {
            seq,
            shared: self.inner.shared.clone(),
        }
    }

    /// The failure that broke the store, if one did.
    pub fn failure(&self) -> Option<StorageError> {
        self.inner.shared.failure()
    }

    /// Bytes the data directory's database occupies on disk.
    pub fn disk_space(&self) -> u64 {
        self.inner.db.disk_space().unwrap_or(0)
    }

    /// Commits and syncs everything submitted, then stops the committer: later submits
    /// fail with [`StorageError::Closed`]. Returns the store's failure if it had one.
    /// Dropping the last handle does the same.
    pub fn close(&self) -> Result<(), StorageError> {
        self.inner.close()
    }
}

impl Inner {
    fn close(&self) -> Result<(), StorageError> {
        self.shared.request_close();
        if let Some(handle) = self.committer.lock().take() {
            if handle.join().is_err() {
                tracing::error!("the storage committer thread panicked");
            }
        }
        match self.shared.failure() {
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

    fn read_error(&self, error: fjall::Error) -> StorageError {
        if is_damage(&error) {
            return StorageError::Corrupt {
                files: format!("the table files under {}", self.keyspace.path().display()),
                detail: describe(&error),
            };
        }
        StorageError::Read {
            table: self.name.to_string(),
            source: Arc::new(error),
        }
    }

    /// The committed value of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self.keyspace.get(key) {
            Ok(value) => Ok(value.map(|v| v.to_vec())),
            Err(e) => Err(self.read_error(e)),
        }
    }

    /// About how many records the table holds, without reading them: overwritten and
    /// deleted records may still be counted. For sizing what a full read will fill.
    pub fn approximate_len(&self) -> usize {
        self.keyspace.approximate_len()
    }

    /// Every committed record, in key order.
    pub fn iter(&self) -> impl Iterator<Item = Result<Record, StorageError>> + '_ {
        self.records(self.keyspace.iter())
    }

    /// The committed records whose key starts with `prefix`, in key order.
    pub fn prefix<'a>(
        &'a self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<Record, StorageError>> + 'a {
        self.records(self.keyspace.prefix(prefix))
    }

    fn records(
        &self,
        iter: fjall::Iter,
    ) -> impl Iterator<Item = Result<Record, StorageError>> + '_ {
        iter.map(move |guard| match guard.into_inner() {
            Ok((key, value)) => Ok(Record { key, value }),
            Err(e) => Err(self.read_error(e)),
        })
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
    /// A table over a bare keyspace, for the committer's unit tests.
    pub(crate) fn for_test(name: &str, keyspace: Keyspace) -> Self {
        Self {
            name: Arc::from(name),
            keyspace,
        }
    }
}
