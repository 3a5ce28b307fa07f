//! Opening a data directory: the snapshot the manifest names, then every journal segment
//! after it, checked and replayed; a torn last write discarded; anything else damaged
//! refused.
//!
//! The rules, each checked by `tests/damage_test.rs`:
//! * the manifest must be whole, and present unless the directory holds no snapshot or
//!   segment (a new store);
//! * the snapshot it names must open (header, footer and table list checksums); its
//!   blocks are checked when read;
//! * the newest segment it names must be there (later ones may be: a crash while the
//!   committer started one);
//! * the segments after it must continue it without a gap: the first holds the batch
//!   after the snapshot's, and each next one starts right after the last batch of the
//!   one before (a missing segment or batch is refused, never skipped);
//! * every record's checksum must match and sequence numbers must count up by one;
//! * the end of the last segment may hold a torn write (below); closed segments were
//!   synced before the next one got anything, so they must be whole.
//!
//! Recovery reads only: it decides, and `open.rs` acts. A directory it refuses is left
//! exactly as it was found, and `repair.rs` is the explicit, separate step that salvages
//! it.
//!
//! # A torn last write, or damage?
//!
//! From the first record of the last segment that is cut short or fails its checksum,
//! the rest may be a write that never completed: a crash in the middle of it, or a
//! power cut that persisted some of its pages and not others (the kernel writes dirty
//! pages in no set order, so whole records can follow a torn one). Such bytes were never
//! promised to anyone, and discarding them loses nothing acknowledged. But a record
//! that was on disk and then went bad (media damage, a flipped bit) looks the same, and
//! discarding from there would silently drop every batch after it.
//!
//! What tells them apart is a fact the writer records: the first record of each write
//! carries `SYNCED_BEFORE` when every earlier byte of the segment had been synced
//! before that write began (`format.rs`, `journal.rs`). So if any whole record after the
//! bad one carries it, the bad record was on disk before that later write was made, and
//! no crash can have torn it: the store refuses to open, naming the file, the byte and
//! the later batch, and changes nothing. Otherwise everything from the bad record on was
//! written since the last sync, which is exactly what a crash may lose:
//! * `--sync always`: every commit is synced before the next is written, so every write
//!   carries the flag, and only the final write (never acknowledged) can be torn. One
//!   flipped bit followed by later batches is refused.
//! * `--sync interval`: writes between two syncs carry no flag, and a power cut may lose
//!   any of them (that is the policy's promise: at most the last interval). Damage in
//!   what was synced before a later write is refused as above; damage in what was written
//!   since the last sync is treated as torn. The part the policy allows to lose is the
//!   part that cannot be told from damage.
//! * A segment of the first format (before the flag) cannot say: any whole record after
//!   a bad one is taken as proof, and the directory refused.
//!
//! A torn end is never overwritten in place before it is kept: its bytes (up to the
//! last that is not zero) are copied to `DIR/damaged/{segment}.torn-at-{offset}` and
//! synced, then zeroed in the segment so the committer can write on after the last
//! whole batch, and the open reports it ([`crate::Recovery`]) and logs a warning naming
//! the copy. The documented limit: a last record that went bad with nothing written
//! after it looks like a torn last write (nothing later can prove otherwise); its bytes
//! are kept in that copy.
//!
//! Segments whose batches are all in the snapshot (a crash between a compaction's swap
//! and its clean-up), a last segment without even a header (a crash as the committer
//! started it), snapshots other than the manifest's (older ones, or one a crash left
//! before the manifest named it) and temporary files are deleted, once the manifest
//! written at open no longer names them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::OpenError;
use crate::files::{
    damaged_dir, list_segments, list_snapshots, segment_path, snapshot_path, Segment, Snapshots,
};
use crate::format::TableNames;
use crate::journal::Continue;
use crate::manifest::Manifest;
use crate::scan::{scan, Changes, Overlay, SegmentDamage, Tail};
use crate::snapshot::{Snapshot, SnapshotDamage};

/// What recovery did when the store was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Journal segments whose torn end recovery took out of the store (kept in a file of
    /// their own, see [`TruncatedJournal::kept`]).
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
    /// Where the bytes taken out (`after..written` of the segment) were put:
    /// `DIR/damaged/{segment}.torn-at-{after}`, never deleted by statehub.
    pub kept: PathBuf,
}

/// The state of a directory after recovery.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) snapshot: Option<Arc<Snapshot>>,
    /// The segments after the snapshot, all closed.
    pub(crate) segments: Vec<Segment>,
    /// Their changes to the snapshot.
    pub(crate) overlay: Overlay,
    /// The last batch recovered (0 for a new store).
    pub(crate) last_seq: u64,
    pub(crate) truncated_journals: Vec<TruncatedJournal>,
    /// Files that hold nothing the store needs: to delete once the manifest no longer
    /// names them.
    pub(crate) obsolete: Vec<PathBuf>,
    /// The last segment, which the committer goes on writing, and the tables its header
    /// names.
    pub(crate) resume: Option<(Continue, TableNames)>,
}

/// Where the torn end of `segment` from byte `at` is kept.
fn torn_path(dir: &Path, segment: &Path, at: u64) -> PathBuf {
    let name = segment
        .file_name()
        .map_or_else(|| "segment".into(), |n| n.to_string_lossy());
    damaged_dir(dir).join(format!("{name}.torn-at-{at}"))
}

fn corrupt(dir: &Path, files: &Path, detail: impl Into<String>) -> OpenError {
    OpenError::Corrupt {
        dir: dir.to_owned(),
        files: files.display().to_string(),
        detail: detail.into(),
    }
}

/// Recovers `dir` (which holds `journal/` and `snapshots/`); see the module docs.
pub(crate) fn recover(dir: &Path) -> Result<Recovered, OpenError> {
    let io = |path: PathBuf| move |source| OpenError::Io { path, source };
    let Snapshots {
        snapshots,
        temporary,
    } = list_snapshots(dir).map_err(io(dir.join("snapshots")))?;
    let all = list_segments(dir).map_err(io(dir.join("journal")))?;
    let (manifest, snapshot) = base(dir, !snapshots.is_empty() || !all.is_empty(), &all)?;
    let after = snapshot.as_ref().map_or(0, |s| s.seq);
    let mut replay = Replay {
        dir,
        manifest,
        after,
        previous: after,
        changes: Changes::default(),
        segments: Vec::new(),
        obsolete: temporary,
        truncated_journals: Vec::new(),
        resume: None,
    };
    for (i, segment) in all.iter().enumerate() {
        if all
            .get(i + 1)
            .is_some_and(|next| next.first_seq <= after + 1)
        {
            replay.obsolete.push(segment.path.clone());
        } else {
            replay.segment(segment, i + 1 == all.len())?;
        }
    }
    replay.obsolete.extend(
        snapshots
            .iter()
            .filter(|(seq, _)| *seq != manifest.snapshot_seq)
            .map(|(_, p)| p.clone()),
    );
    Ok(Recovered {
        snapshot,
        segments: replay.segments,
        overlay: replay.changes.sorted(),
        last_seq: replay.previous.max(after),
        truncated_journals: replay.truncated_journals,
        obsolete: replay.obsolete,
        resume: replay.resume,
    })
}

/// The manifest and the snapshot it names; the newest segment it names must be among
/// `segments`. A directory holding anything (`any`) must have a manifest.
fn base(
    dir: &Path,
    any: bool,
    segments: &[Segment],
) -> Result<(Manifest, Option<Arc<Snapshot>>), OpenError> {
    let manifest = match Manifest::read(dir) {
        Ok(Some(m)) => m,
        Ok(None) if !any => Manifest::default(),
        Ok(None) => return Err(corrupt(dir, &Manifest::path(dir), "missing")),
        Err(detail) => return Err(corrupt(dir, &Manifest::path(dir), detail)),
    };
    let snapshot = match manifest.snapshot_seq {
        0 => None,
        seq => {
            let path = snapshot_path(dir, seq);
            Some(Arc::new(Snapshot::open(&path).map_err(
                |SnapshotDamage { path, detail }| corrupt(dir, &path, detail),
            )?))
        }
    };
    let newest = manifest.newest_segment;
    if newest > 0 && !segments.iter().any(|s| s.first_seq == newest) {
        let path = segment_path(dir, newest);
        let detail = "missing (the manifest names it as the newest journal segment)";
        return Err(corrupt(dir, &path, detail));
    }
    Ok((manifest, snapshot))
}

/// The journal's segments replayed one after the other.
struct Replay<'a> {
    dir: &'a Path,
    manifest: Manifest,
    /// The snapshot's batch.
    after: u64,
    /// The last batch of the segment before (or the snapshot's).
    previous: u64,
    changes: Changes,
    segments: Vec<Segment>,
    obsolete: Vec<PathBuf>,
    truncated_journals: Vec<TruncatedJournal>,
    resume: Option<(Continue, TableNames)>,
}

impl Replay<'_> {
    /// Checks and replays one segment (`last`: the newest, which may end torn).
    fn segment(&mut self, segment: &Segment, last: bool) -> Result<(), OpenError> {
        let dir = self.dir;
        let expected = if self.segments.is_empty() {
            segment.first_seq <= self.after + 1
        } else {
            segment.first_seq == self.previous + 1
        };
        if !expected {
            let detail = format!(
                "batches {} to {} are missing (a journal segment is gone)",
                self.previous + 1,
                segment.first_seq - 1
            );
            return Err(corrupt(dir, &segment.path, detail));
        }
        let tail = if last { Tail::Recover } else { Tail::Whole };
        let scanned = scan(
            &segment.path,
            segment.first_seq,
            self.after,
            tail,
            &mut self.changes.sink(),
        )
        .map_err(|SegmentDamage { path, detail }| corrupt(dir, &path, detail))?;
        self.previous = scanned.last_seq;
        if scanned.end == 0 && self.manifest.newest_segment == segment.first_seq {
            // The manifest names a segment only once its header is on disk. Refused
            // before anything is written to it.
            return Err(corrupt(dir, &segment.path, "its header is cut short"));
        }
        if scanned.torn {
            self.truncated_journals.push(TruncatedJournal {
                path: segment.path.clone(),
                written: scanned.written,
                after: scanned.end,
                kept: torn_path(dir, &segment.path, scanned.end),
            });
        }
        if scanned.end == 0 {
            // Not even a header (a crash as the committer started it): the next commit
            // starts a segment of that name again.
            self.obsolete.push(segment.path.clone());
            return Ok(());
        }
        if last {
            let at = Continue {
                path: segment.path.clone(),
                end: scanned.end,
            };
            self.resume = Some((at, scanned.tables));
        }
        self.segments.push(Segment {
            path: segment.path.clone(),
            first_seq: segment.first_seq,
            bytes: scanned.end,
            closed: true,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::format::segment_header;
    use crate::manifest::Manifest;
    use crate::{Batch, Options, Store};

    /// A crash right after the committer started a segment (its header on disk and named
    /// by the manifest, no batch in it): the store opens, and its next commit starts a
    /// segment of the same name.
    #[test]
    fn a_segment_without_batches_is_dropped_and_its_name_reused() {
        let dir = tempfile::tempdir().unwrap();
        let write = |n: u8| {
            let store = Store::open(dir.path(), Options::default()).unwrap();
            let t = store.table("t").unwrap();
            let mut batch = Batch::new();
            batch.put(&t, &[n], b"v").unwrap();
            let seq = store.submit(batch).unwrap().seq();
            store.close().unwrap();
            seq
        };
        let seq = write(1);
        let empty = crate::files::segment_path(dir.path(), seq + 1);
        std::fs::write(&empty, segment_header(seq + 1, &[(0, "t".to_owned())])).unwrap();
        Manifest {
            snapshot_seq: 0,
            newest_segment: seq + 1,
        }
        .write(dir.path())
        .unwrap();
        assert_eq!(write(2), seq + 1);
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let keys: Vec<Vec<u8>> = store
            .table("t")
            .unwrap()
            .iter()
            .map(|r| r.unwrap().key().to_vec())
            .collect();
        assert_eq!(keys, vec![vec![1], vec![2]]);
        assert!(store.recovery().truncated_journals.is_empty());
    }
}
