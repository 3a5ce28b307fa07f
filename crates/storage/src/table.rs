//! Reading tables back: [`Table`], and the view of the files that reads share (the
//! snapshot and the journal's changes since it, as of the durable watermark).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLockReadGuard};

use crate::error::StorageError;
use crate::files::{FileSet, Files};
use crate::merge::merge;
use crate::scan::{scan, Changes, Overlay, Tail};
use crate::shared::Shared;
use crate::snapshot::{Snapshot, SnapshotDamage};

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
    /// The reads of a store just recovered: the first view is the one recovery built, as
    /// of batch `seq`.
    pub(crate) fn new(
        files: Arc<Files>,
        shared: Arc<Shared>,
        seq: u64,
        snapshot: Option<Arc<Snapshot>>,
        overlay: Overlay,
    ) -> Self {
        let view = View {
            seq,
            generation: 0,
            snapshot,
            overlay,
        };
        Self {
            files,
            shared,
            view: Mutex::new(Some(Arc::new(view))),
            view_held: AtomicBool::new(true),
        }
    }

    pub(crate) fn files(&self) -> &Arc<Files> {
        &self.files
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

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
        let mut changes = Changes::default();
        for segment in &set.segments {
            let tail = if segment.closed {
                Tail::Whole
            } else {
                Tail::Live { upto: durable }
            };
            scan(
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
    pub(crate) fn drop_view(&self) {
        if self.view_held.swap(false, Ordering::AcqRel) {
            *self.view.lock() = None;
        }
    }
}

/// A named table of a [`crate::Store`]. Cheap to clone.
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

impl Table {
    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn new(name: &str, id: u16, disk: Arc<Disk>) -> Self {
        Self {
            name: Arc::from(name),
            id,
            disk,
        }
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

#[cfg(test)]
impl Table {
    /// A table that only stages writes, for the committer's unit tests.
    pub(crate) fn for_test(name: &str, id: u16) -> Self {
        let files = Arc::new(Files::new(
            std::path::PathBuf::from("/nonexistent"),
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
