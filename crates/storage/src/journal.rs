//! The journal: segment files of records, one record per batch, appended by the
//! committer ([`Log`], its [`Backend`]) and read back at open, for reads and by the
//! compactor ([`scan`]).
//!
//! The committer starts a segment at its first commit after the store opens, when the
//! current one holds [`crate::Options::segment_bytes`], and when a table was opened
//! since the current one started (a segment's header names every table its records
//! use). It starts it in the spare segment (zeros written in advance, see
//! [`prepare_spare`]) when one is waiting.
//! Rolling syncs the finished segment, so a closed segment is complete on disk, syncs
//! the directory after creating the new one, so its name survives a power cut, and then
//! records it in the manifest (`manifest.rs`).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::batch::Batch;
use crate::committer::{Backend, BackendError};
use crate::format::{
    self, read_record, read_segment_header, segment_header, FormatError, TableNames,
};
use crate::manifest::Manifest;
use crate::snapshot::Snapshot;
use crate::syncer::{Syncer, SYNC_EVERY_BYTES};

/// Where a journal segment lives: `DIR/journal/{first_seq:020}.log`.
pub(crate) fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join("journal").join(format!("{first_seq:020}.log"))
}

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
    pub(crate) rolled: (Mutex<()>, parking_lot::Condvar),
    /// Held through a compaction: one at a time (the compactor's, or a forced one).
    pub(crate) compacting: Mutex<()>,
}

impl Files {
    pub(crate) fn new(dir: PathBuf, set: FileSet, segment_bytes: u64, compact_after: u64) -> Self {
        Self {
            dir,
            set: RwLock::new(set),
            segment_bytes,
            compact_after,
            rolled: (Mutex::new(()), parking_lot::Condvar::new()),
            compacting: Mutex::new(()),
        }
    }

    pub(crate) fn notify_rolled(&self) {
        let _guard = self.rolled.0.lock();
        self.rolled.1.notify_all();
    }
}

/// Where the spare segment waits: zeros, written and synced ahead of the roll that
/// takes it (see [`prepare_spare`]).
pub(crate) fn spare_path(dir: &Path) -> PathBuf {
    dir.join("journal").join("spare")
}

/// Writes the spare segment (zeros, synced) unless one is waiting already. It holds a
/// segment's size plus room for the commit that crosses it (usually; a larger one grows
/// the file).
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
    let mut file = File::create(&tmp)?;
    let zeros = vec![0u8; 1 << 20];
    let mut left = files.segment_bytes + files.segment_bytes / 8;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_all()?;
    std::fs::rename(&tmp, &spare)
}

/// Fsyncs a directory, so that files created or renamed in it stay after a power cut.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
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
    /// spare segment if one is waiting (see [`prepare_spare`]), else in a new file.
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

/// Changes recorded in the journal since a snapshot, per table name: the latest value of
/// each key written (`None`: removed), sorted by key.
pub(crate) type Overlay = HashMap<Arc<str>, Vec<(Bytes, Option<Bytes>)>>;

/// An [`Overlay`] being collected from segments: hashed, then sorted once per table by
/// [`Changes::sorted`]. Most writes overwrite a key written shortly before, and a sorted
/// map would pay a search for each.
#[derive(Debug, Default)]
pub(crate) struct Changes(HashMap<Arc<str>, HashMap<Bytes, Option<Bytes>>>);

impl Changes {
    /// An `apply_op` for [`scan`] that records each operation.
    pub(crate) fn sink(&mut self) -> impl FnMut(&Arc<str>, Bytes, Option<Bytes>) + '_ {
        |table, key, value| {
            self.0.entry(table.clone()).or_default().insert(key, value);
        }
    }

    pub(crate) fn sorted(self) -> Overlay {
        self.0
            .into_iter()
            .map(|(table, keys)| {
                let mut keys: Vec<(Bytes, Option<Bytes>)> = keys.into_iter().collect();
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                (table, keys)
            })
            .collect()
    }
}

/// What [`scan`] hands each operation to: table, key, and value (`None`: removed).
pub(crate) type ApplyOp<'a> = dyn FnMut(&Arc<str>, Bytes, Option<Bytes>) + 'a;

/// Damage found in a journal segment.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {detail}", path.display())]
pub(crate) struct SegmentDamage {
    pub(crate) path: PathBuf,
    pub(crate) detail: String,
}

/// What reading one segment found.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// The sequence number of the last whole record (`first_seq - 1` if none).
    pub(crate) last_seq: u64,
    /// Where the last whole record ends.
    pub(crate) end: u64,
    /// Where its written bytes end (its length, but for zeros not written yet).
    pub(crate) written: u64,
    /// Bytes after `end` that are not a record: a torn last write.
    pub(crate) torn: bool,
    /// The tables its header names (none without a header).
    pub(crate) tables: TableNames,
}

/// How a segment read treats what follows its last whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// The last segment at open: whatever follows its last whole record is discarded
    /// (see `recovery.rs` for why).
    Recover,
    /// A closed segment: it must end exactly after a record.
    Whole,
    /// The segment the committer is writing: stop at the first record past `upto`.
    Live { upto: u64 },
}

/// Reads the segment at `path` whose name says `first_seq`: checks its header, its
/// records' checksums and that their sequence numbers count up from `first_seq`, and
/// hands each operation of the records above `after` to `apply_op` (table, key, value
/// or `None` for a removal; slices of the file as read).
pub(crate) fn scan(
    path: &Path,
    first_seq: u64,
    after: u64,
    tail: Tail,
    apply_op: &mut ApplyOp<'_>,
) -> Result<Scanned, SegmentDamage> {
    let damage = |detail: String| SegmentDamage {
        path: path.to_owned(),
        detail,
    };
    let bytes = Bytes::from(std::fs::read(path).map_err(|e| damage(e.to_string()))?);
    let written = bytes.len() as u64;
    let header = match read_segment_header(&bytes) {
        Ok(h) => h,
        // A crash while the committer started the segment, before its header was
        // whole: no batch was written in it.
        Err(FormatError::Truncated) if tail == Tail::Recover => {
            return Ok(Scanned {
                last_seq: first_seq - 1,
                end: 0,
                written,
                torn: written > 0,
                tables: Vec::new(),
            });
        }
        Err(_) if tail == Tail::Recover && all_zero(&bytes) => {
            return Ok(Scanned {
                last_seq: first_seq - 1,
                end: 0,
                written,
                torn: false,
                tables: Vec::new(),
            });
        }
        Err(e) => return Err(damage(format!("header: {e}"))),
    };
    if header.first_seq != first_seq {
        return Err(damage(format!(
            "header says it starts at batch {}, its name at {first_seq}",
            header.first_seq
        )));
    }
    let names: HashMap<u16, Arc<str>> = header
        .tables
        .iter()
        .map(|(id, name)| (*id, Arc::from(name.as_str())))
        .collect();
    let mut pos = header.len;
    let mut last_seq = first_seq - 1;
    while pos < bytes.len() {
        let (record, len) = match read_record(&bytes[pos..]) {
            Ok(r) => r,
            // The zeros a segment is made of, not written yet: its end.
            Err(_) if all_zero(&bytes[pos..]) => break,
            Err(e) => match tail {
                Tail::Live { .. } => break,
                Tail::Recover => {
                    let written = bytes
                        .iter()
                        .rposition(|&b| b != 0)
                        .map_or(0, |i| i as u64 + 1);
                    return Ok(Scanned {
                        last_seq,
                        end: pos as u64,
                        written,
                        torn: true,
                        tables: header.tables,
                    });
                }
                _ => {
                    return Err(damage(format!(
                        "record after batch {last_seq} at byte {pos}: {e}"
                    )))
                }
            },
        };
        if record.seq != last_seq + 1 {
            return Err(damage(format!(
                "batch {} follows batch {last_seq} at byte {pos}",
                record.seq
            )));
        }
        if let Tail::Live { upto } = tail {
            if record.seq > upto {
                break;
            }
        }
        if record.seq > after {
            apply(record.payload, &names, &bytes, apply_op)
                .map_err(|e| damage(format!("batch {}: {e}", record.seq)))?;
        }
        last_seq = record.seq;
        pos += len;
    }
    Ok(Scanned {
        last_seq,
        end: pos as u64,
        written,
        torn: false,
        tables: header.tables,
    })
}

/// Whether `bytes` are all zero: an OR over them, which the compiler vectorises (a
/// segment can end in tens of MiB of them).
fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |acc, &b| acc | b) == 0
}

/// Hands one record's operations to `apply_op`, as slices of `file`.
fn apply(
    payload: &[u8],
    names: &HashMap<u16, Arc<str>>,
    file: &Bytes,
    apply_op: &mut ApplyOp<'_>,
) -> Result<(), FormatError> {
    for op in format::ops(payload) {
        let op = op?;
        let name = names
            .get(&op.table)
            .ok_or(FormatError::Malformed("table id not in the segment header"))?;
        apply_op(
            name,
            file.slice_ref(op.key),
            op.value.map(|v| file.slice_ref(v)),
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(records: &[(u64, &[u8])]) -> Vec<u8> {
        let mut out = segment_header(records.first().map_or(1, |r| r.0), &[(0, "t".to_owned())]);
        for (seq, key) in records {
            let mut payload = Vec::new();
            format::put_op(&mut payload, 0, key, Some(b"v"));
            format::put_record(&mut out, *seq, &payload);
        }
        out
    }

    fn scan_bytes(bytes: &[u8], tail: Tail) -> Result<(Scanned, Overlay), SegmentDamage> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        std::fs::write(&path, bytes).unwrap();
        let mut changes = Changes::default();
        let scanned = scan(&path, 1, 0, tail, &mut changes.sink())?;
        Ok((scanned, changes.sorted()))
    }

    #[test]
    fn the_last_segment_recovers_to_its_last_whole_record_and_a_closed_one_is_whole() {
        let clean = segment(&[(1, b"a"), (2, b"b"), (3, b"c")]);
        let (s, overlay) = scan_bytes(&clean, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.end, s.torn), (3, clean.len() as u64, false));
        assert_eq!(overlay[&Arc::from("t")].len(), 3);
        // Cut inside the last record: recovered to the first two.
        let (s, _) = scan_bytes(&clean[..clean.len() - 3], Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.torn), (2, true));
        // The same cut in a closed segment is damage.
        assert!(scan_bytes(&clean[..clean.len() - 3], Tail::Whole).is_err());
        // A flipped byte in the middle record: the last segment ends before it (a power
        // cut can persist a later page of the last write and not an earlier one), a
        // closed segment is damaged.
        let second = segment(&[(1, b"a")]).len() + 13;
        let mut damaged = clean.clone();
        damaged[second] ^= 1;
        let (s, _) = scan_bytes(&damaged, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.torn), (1, true));
        assert!(scan_bytes(&damaged, Tail::Whole).is_err());
    }

    #[test]
    fn sequence_gaps_are_damage() {
        let gap = segment(&[(1, b"a"), (3, b"c")]);
        assert!(scan_bytes(&gap, Tail::Recover)
            .unwrap_err()
            .detail
            .contains("follows batch 1"));
    }
}
