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
//! records it in the manifest (`manifest.rs`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::batch::Batch;
use crate::committer::{Backend, BackendError};
use crate::files::{segment_path, spare_path, sync_dir, Files, Segment};
use crate::format::{self, segment_header, TableNames};
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
    /// Bytes written since the syncer was last asked to sync.
    unsynced: u64,
    /// Whether anything was written since the committer's own last sync (the syncer's
    /// may not have happened yet).
    dirty: bool,
}

impl Current {
    /// A segment with `bytes` written, all of them synced.
    fn new(file: File, bytes: u64, registry_version: u64) -> Self {
        Self {
            file,
            bytes,
            registry_version,
            unsynced: 0,
            dirty: false,
        }
    }

    /// Syncs what was written; the syncer owes nothing for it any more.
    fn sync(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        self.unsynced = 0;
        self.dirty = false;
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
    /// With the interval policy: the thread that syncs the current segment.
    syncer: Option<Arc<Syncer>>,
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
        on_commit: Box<dyn FnMut() + Send>,
    ) -> std::io::Result<Self> {
        let current = match resume {
            Some(Continue { path, end }) => {
                use std::io::{Seek, SeekFrom};
                let mut file = OpenOptions::new().write(true).open(path)?;
                file.seek(SeekFrom::Start(end))?;
                if let Some(syncer) = &syncer {
                    syncer.set_file(file.try_clone()?);
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
            syncer,
            on_commit,
        })
    }

    /// Closes the current segment (synced) and starts the next one at `next_seq`, in the
    /// spare segment if one is waiting (see `files::prepare_spare`), else in a new file.
    fn roll(&mut self) -> std::io::Result<()> {
        let version = self.registry.version();
        let path = segment_path(&self.files.dir, self.next_seq);
        let mut file = match std::fs::rename(spare_path(&self.files.dir), &path) {
            Ok(()) => OpenOptions::new().write(true).open(&path)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)?,
            Err(e) => return Err(e),
        };
        let header = segment_header(self.next_seq, &self.registry.tables());
        file.write_all(&header)?;
        let bytes = header.len() as u64;
        let done = self.current.take();
        // A closed segment is whole on disk before the next one holds anything (with the
        // interval policy the syncer has left little to write; with `always` every
        // commit was synced already).
        if let Some(done) = done.as_ref().filter(|d| d.dirty) {
            done.file.sync_data()?;
        }
        file.sync_data()?;
        if let Some(syncer) = &self.syncer {
            syncer.set_file(file.try_clone()?);
        }
        sync_dir(&self.files.dir.join("journal"))?;
        {
            let mut set = self.files.set.write();
            if let Some(last) = set.segments.last_mut().filter(|s| !s.closed) {
                last.bytes = done.map_or(0, |d| d.bytes);
                last.closed = true;
            }
            set.segments.push(Segment {
                path,
                first_seq: self.next_seq,
                bytes: 0,
                closed: false,
            });
            Manifest::of(&set).write(&self.files.dir)?;
        }
        self.current = Some(Current::new(file, bytes, version));
        self.files.notify_rolled();
        Ok(())
    }
}

impl Backend for Log {
    fn commit(&mut self, batches: Vec<Batch>, sync: bool) -> Result<(), BackendError> {
        let stale = match &self.current {
            None => true,
            Some(c) => {
                c.bytes >= self.files.segment_bytes || c.registry_version != self.registry.version()
            }
        };
        if stale {
            self.roll()?;
        }
        self.buf.clear();
        self.buf.reserve(
            batches
                .iter()
                .map(|b| b.ops.len() + format::RECORD_OVERHEAD)
                .sum(),
        );
        for batch in &batches {
            format::put_record(&mut self.buf, self.next_seq, &batch.ops);
            self.next_seq += 1;
        }
        let Some(current) = self.current.as_mut() else {
            return Err("no journal segment".into());
        };
        current.file.write_all(&self.buf)?;
        current.bytes += self.buf.len() as u64;
        if sync {
            current.sync()?;
        } else {
            current.dirty = true;
            current.unsynced += self.buf.len() as u64;
            if let Some(syncer) = self
                .syncer
                .as_ref()
                .filter(|_| current.unsynced >= SYNC_EVERY_BYTES)
            {
                syncer.request();
                current.unsynced = 0;
            }
        }
        (self.on_commit)();
        Ok(())
    }

    fn sync(&mut self) -> Result<(), BackendError> {
        if let Some(current) = self.current.as_mut() {
            current.sync()?;
        }
        Ok(())
    }

    fn sync_soon(&mut self) -> Result<(), BackendError> {
        match (&self.syncer, self.current.as_mut()) {
            (Some(syncer), Some(current)) => {
                syncer.request();
                current.unsynced = 0;
                Ok(())
            }
            _ => self.sync(),
        }
    }
}
