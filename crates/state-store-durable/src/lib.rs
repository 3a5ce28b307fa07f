//! The state store's persistent engine: [`DurableEngine`].
//!
//! Reads never touch the disk: the engine keeps a [`MemoryEngine`] as its index, so GET
//! returns the stored `Bytes` without a copy, SCAN pages through the same ordered map and
//! the expiry index is the same. Every `put` and `remove` also stages the change into a
//! [`Batch`] (no I/O), and [`Engine::seal`], called by the machine once per request,
//! adds the clock's high-water mark and submits the batch to the store's committer (no
//! I/O either: a hand-over). It returns the write sequence the reply must wait for; the
//! async shell awaits it before it answers. See the engine contract in
//! `statehub_state_store::engine`.
//!
//! On disk: table `state_store` maps each key to its entry (`record.rs`); table
//! `state_store_meta` holds `hlc`, the clock sealed with the last write whose version no
//! entry carries (a deletion's), so that the greatest stored version is at least every
//! version ever issued, even for keys since deleted, and even if the wall clock goes back
//! across a restart. [`DurableEngine::open`] reads both tables once.
//!
//! While the store waits for disk space, client writes are refused, expiry goes on and
//! reads of durable data are answered at once (`stall.rs`).
//!
//! The shell waits for durability outside the engine's lock, through a [`Progress`]
//! handle the engine gives it ([`DurableEngine::progress`]): it awaits the sequence
//! numbers `seal` returned and asks for admission before work that will write.

mod record;
mod stall;

use std::borrow::Cow;

use bytes::Bytes;
use statehub_state_store::{
    Engine, EngineError, Entry, Hlc, HlcClock, MemoryEngine, ScanBatch, Stats, WriteSeq,
};
use statehub_storage::{Batch, StorageError, Store, Table, MAX_KEY_LEN};

pub use record::RecordError;

/// The table holding the entries.
pub const ENTRIES_TABLE: &str = "state_store";
/// The table holding the clock's high-water mark.
pub const META_TABLE: &str = "state_store_meta";
const HLC_KEY: &[u8] = b"hlc";

/// What can go wrong below the engine; wrapped in [`EngineError::Backend`].
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The store refused or failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A stored record does not parse.
    #[error("state store record {key} in {dir} is damaged: {source}")]
    Record {
        /// The key, printable (`\xNN` escapes).
        key: String,
        /// The data directory.
        dir: String,
        /// What is wrong.
        source: RecordError,
    },
}

impl From<DurableError> for EngineError {
    fn from(error: DurableError) -> Self {
        EngineError::Backend(Box::new(error))
    }
}

/// Whether `error` (an engine's, or the machine's wrapping it) is a write refused because
/// the store waits for disk space: not a failure of the engine, which goes on serving
/// reads and takes writes again once there is room (see `stall.rs`).
pub fn is_no_space(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if let Some(DurableError::Storage(StorageError::NoSpace { .. })) = e.downcast_ref() {
            return true;
        }
        source = e.source();
    }
    false
}

fn storage(error: StorageError) -> EngineError {
    DurableError::Storage(error).into()
}

/// The persistent engine. See the crate docs.
#[derive(Debug)]
pub struct DurableEngine {
    memory: MemoryEngine,
    store: Store,
    entries: Table,
    meta: Table,
    staged: Batch,
    /// `(wall_ms, counter)` of the version of the last entry staged, if any.
    staged_version: Option<(u64, u64)>,
    /// The high-water mark read at open.
    loaded_clock: Option<Hlc>,
    /// The sequence number of the last batch this engine submitted.
    submitted: WriteSeq,
    /// What a stall of the store needs tracked per request (`stall.rs`).
    stall: stall::StallWatch,
}

impl DurableEngine {
    /// Loads the state store's tables from `store` into memory. Expired entries are
    /// loaded too (the machine removes them when it starts).
    pub fn open(store: &Store) -> Result<Self, EngineError> {
        let entries = store.table(ENTRIES_TABLE).map_err(storage)?;
        let meta = store.table(META_TABLE).map_err(storage)?;
        let damaged = |key: &[u8], source| DurableError::Record {
            key: key.escape_ascii().to_string(),
            dir: store.dir().display().to_string(),
            source,
        };
        // Records go into memory as they are decoded; the first bad one stops the load.
        let mut failure = None;
        let records = entries.iter().map_while(|record| {
            let decoded = record.map_err(storage).and_then(|record| {
                let entry =
                    record::decode_entry(record.value()).map_err(|e| damaged(record.key(), e))?;
                Ok((Bytes::copy_from_slice(record.key()), entry))
            });
            decoded.map_err(|e| failure = Some(e)).ok()
        });
        let memory = MemoryEngine::from_entries_with_capacity(records, entries.approximate_len());
        if let Some(e) = failure {
            return Err(e);
        }
        let loaded_clock = match meta.get(HLC_KEY).map_err(storage)? {
            Some(bytes) => Some(record::decode_hlc(&bytes).map_err(|e| damaged(HLC_KEY, e))?),
            None => None,
        };
        Ok(Self {
            memory,
            store: store.clone(),
            entries,
            meta,
            staged: Batch::new(),
            staged_version: None,
            loaded_clock,
            submitted: 0,
            stall: stall::StallWatch::default(),
        })
    }

    /// The store this engine writes to.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The data directory of its store.
    pub fn data_dir(&self) -> &std::path::Path {
        self.store.dir()
    }

    /// A handle to wait on this engine's writes without holding the engine.
    pub fn progress(&self) -> Progress {
        Progress {
            store: self.store.clone(),
        }
    }
}

/// How far a [`DurableEngine`]'s sealed writes have come, and admission to write more:
/// what the shell awaits outside the lock that holds the engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Progress {
    store: Store,
}

impl Progress {
    /// Resolves once the writes sealed up to `seq` are durable, or with the failure that
    /// lost them.
    pub async fn durable(&self, seq: WriteSeq) -> Result<(), DurableError> {
        Ok(self.store.ticket(seq).durable().await?)
    }

    /// The highest sequence number whose writes, and every earlier one's, are durable.
    pub fn durable_seq(&self) -> WriteSeq {
        self.store.durable_seq()
    }

    /// Waits while the storage holds more unwritten bytes than it admits; await it before
    /// work that may write. Returns at once while writes wait for disk space.
    pub async fn admit(&self) {
        self.store.admit().await;
    }

    /// Whether [`Progress::admit`] would return at once.
    pub fn admits(&self) -> bool {
        self.store.admits()
    }

    /// Whether writes wait for disk space (client writes are refused meanwhile).
    pub fn stalled(&self) -> bool {
        self.store.stall_error().is_some()
    }

    /// Resolves once writes no longer wait for disk space.
    pub async fn unstalled(&self) {
        self.store.unstalled().await;
    }
}

impl DurableEngine {
    /// Refuses the first client write of a request while the store waits for disk space
    /// (see `stall.rs`); later writes of the same request follow the first.
    fn admit_client_write(&mut self) -> Result<(), EngineError> {
        if self.stall.first_client_write() {
            if let Some(e) = self.store.stall_error() {
                return Err(storage(e));
            }
            self.stall.client_wrote();
        }
        Ok(())
    }
}

impl Engine for DurableEngine {
    fn peek(&self, key: &[u8]) -> Result<Option<Cow<'_, Entry>>, EngineError> {
        self.stall.read(key);
        self.memory.peek(key)
    }

    fn put(&mut self, key: &[u8], entry: Entry) -> Result<Option<Entry>, EngineError> {
        self.admit_client_write()?;
        self.staged
            .put_with(&self.entries, key, |out| {
                record::encode_entry_into(&entry, out)
            })
            .map_err(storage)?;
        self.staged_version = Some((entry.version.wall_ms, entry.version.counter));
        self.memory.put(key, entry)
    }

    fn remove(&mut self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let expiry = self
            .memory
            .peek(key)?
            .is_some_and(|e| self.stall.is_expiry(e.expires_at_ms));
        if !expiry {
            self.admit_client_write()?;
        }
        let old = self.memory.remove(key)?;
        if old.is_some() {
            self.staged.delete(&self.entries, key).map_err(storage)?;
        }
        Ok(old)
    }

    fn scan(&self, cursor: Option<&[u8]>, count: usize) -> Result<ScanBatch, EngineError> {
        self.stall.scanned();
        self.memory.scan(cursor, count)
    }

    fn next_expiry(&self) -> Result<Option<u64>, EngineError> {
        self.memory.next_expiry()
    }

    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<Bytes>, EngineError> {
        self.stall.expiring_at(now_ms);
        self.memory.expired(now_ms, limit)
    }

    fn stats(&self) -> Stats {
        self.memory.stats()
    }

    fn max_version(&self) -> Result<Option<Hlc>, EngineError> {
        Ok(self.memory.max_version()?.max(self.loaded_clock.clone()))
    }

    fn max_key_len(&self) -> usize {
        MAX_KEY_LEN
    }

    fn seal(&mut self, clock: &HlcClock) -> Result<Option<WriteSeq>, EngineError> {
        if !self.staged.is_empty() {
            let mut batch = std::mem::take(&mut self.staged);
            let current = clock.current();
            // The high-water mark is stored already when the batch's last entry carries
            // it (a SET's version is the clock's latest tick): the entries' maximum covers
            // it at reopen. Deletions leave no entry, so they store the clock itself.
            if self.staged_version.take() != Some((current.wall_ms, current.counter)) {
                batch
                    .put(&self.meta, HLC_KEY, &record::encode_hlc(&current))
                    .map_err(storage)?;
            }
            self.submitted = self.store.submit(batch).map_err(storage)?.seq();
        }
        if self.submitted <= self.store.durable_seq() {
            self.stall.clear();
            return Ok(None);
        }
        if self.store.stall_error().is_none() {
            self.stall.clear();
            return Ok(Some(self.submitted));
        }
        let (store, entries) = (&self.store, &self.entries);
        let wait = self.stall.must_wait(|| store.pending_keys(entries));
        Ok(wait.then_some(self.submitted))
    }
}
