//! [`repair`]: the explicit step for a directory that recovery refuses. It keeps every
//! whole batch it can find and says exactly what it could not keep.
//!
//! What it reads: the newest snapshot that opens (a newer one that does not is reported
//! lost), every block of it that passes its checksum, and every journal record that
//! passes its checksum, in every segment, also after damage (the next whole record is
//! searched for, see `scan::next_whole`). Records are applied in batch order, each
//! batch whole or not at all; a batch that is missing is reported with the bytes it was
//! in. The result is written as one new snapshot, numbered one past the last batch kept
//! (so nothing later can reuse a number), and the manifest names it alone.
//!
//! Nothing is deleted: the files it replaces (the segments, the old snapshots, the
//! manifest) are moved to `DIR/damaged/repair-{unix seconds}/`. The steps are ordered so
//! that a crash anywhere leaves a directory that a second run repairs the same way: the
//! new snapshot is written before anything is moved, the manifest that names it last
//! (until then, recovery refuses the directory, and a repair picks the newest snapshot,
//! the new one). A directory with nothing damaged is left unchanged.
//!
//! What a repair cannot know: a batch whose record is damaged is lost whole, and the
//! batches kept after it were applied without it (each is whole, but the state is no
//! longer exactly a prefix of what was written), so the report lists every missing
//! batch. A record a client could have forged inside a value is found only where the
//! damaged record's own length does not say where it ends; the report then shows the
//! batch numbers found after the gap.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use bytes::Bytes;

use crate::compactor::write_snapshot;
use crate::error::OpenError;
use crate::files::{
    damaged_dir, list_segments, list_snapshots, spare_path, sync_dir, Segment, Snapshots,
};
use crate::format::{self, read_record, read_segment_header};
use crate::lock::DirLock;
use crate::manifest::Manifest;
use crate::scan::{next_whole, Changes};
use crate::snapshot::{Snapshot, SnapshotDamage};

/// Something a repair could not keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loss {
    /// The file it was in.
    pub file: PathBuf,
    /// The bytes of the file it was in (empty when the whole file is meant).
    pub bytes: std::ops::Range<u64>,
    /// The batches known lost, first and last, if known.
    pub batches: Option<(u64, u64)>,
    /// What was wrong.
    pub what: String,
}

/// What [`repair`] did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    /// The data directory.
    pub dir: PathBuf,
    /// The snapshot it started from and the batch it holds.
    pub snapshot: Option<(PathBuf, u64)>,
    /// Journal batches kept, after that snapshot's.
    pub batches: u64,
    /// The last batch kept (the snapshot's, if no journal batch was).
    pub last_seq: u64,
    /// Everything it could not keep.
    pub losses: Vec<Loss>,
    /// Whether the directory was (or, with `dry_run`, would be) rewritten; `false` when
    /// nothing was damaged.
    pub changed: bool,
    /// Where the replaced files went.
    pub moved_to: Option<PathBuf>,
    /// Records in the new snapshot.
    pub records: u64,
}

/// Repairs the data directory `dir` (see the module docs): every whole batch is kept,
/// every loss reported. With `dry_run` nothing is written. Fails if another process holds
/// the directory or it cannot be read or written; damage is never an error here.
pub fn repair(dir: &Path, dry_run: bool) -> Result<RepairReport, OpenError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| OpenError::Io { path, source }
    };
    if !dir.is_dir() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        return Err(io(dir)(missing));
    }
    let _lock = DirLock::acquire(dir)?;
    if dir.join("db").is_dir() {
        return Err(OpenError::Unsupported {
            dir: dir.to_owned(),
            detail: "it holds an older statehub's store (db/), which this version does not read"
                .to_owned(),
        });
    }
    let mut report = RepairReport {
        dir: dir.to_owned(),
        ..RepairReport::default()
    };
    let snapshots = match list_snapshots(dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Snapshots::default(),
        Err(e) => return Err(io(&dir.join("snapshots"))(e)),
    };
    let base = newest_snapshot(&snapshots, &mut report);
    let after = base.as_ref().map_or(0, |s| s.seq);
    report.snapshot = base.as_ref().map(|s| (s.path.clone(), s.seq));
    let segments = match list_segments(dir) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(&dir.join("journal"))(e)),
    };
    let mut salvage = Salvage::new(after);
    for segment in &segments {
        salvage.segment(segment, &mut report);
    }
    check_manifest(dir, base.as_ref(), &segments, &mut report);
    report.batches = salvage.kept;
    report.last_seq = salvage.last;
    let mut blocks = Vec::new();
    let seq = salvage.last + 1;
    let overlay = salvage.changes.sorted();
    let stop = AtomicBool::new(false);
    let new = if dry_run {
        count_damaged_blocks(base.as_ref(), &mut blocks);
        None
    } else if report.losses.is_empty() && !has_damaged_blocks(base.as_ref()) {
        return Ok(report);
    } else {
        write_snapshot(dir, base.as_ref(), overlay, seq, &stop, Some(&mut blocks)).map_err(|e| {
            OpenError::Io {
                path: dir.join("snapshots"),
                source: std::io::Error::other(e.to_string()),
            }
        })?
    };
    report.losses.extend(blocks.into_iter().map(block_loss));
    report.changed = !report.losses.is_empty();
    if let Some(new) = new {
        report.records = new.tables.iter().map(|t| t.records).sum();
        report.moved_to = Some(replace(dir, &new, &snapshots, &segments).map_err(io(dir))?);
    }
    Ok(report)
}

/// A manifest that recovery would refuse (missing, damaged, naming another snapshot or a
/// segment that is not there) is reported, so the directory is rewritten.
fn check_manifest(
    dir: &Path,
    snapshot: Option<&Snapshot>,
    segments: &[Segment],
    report: &mut RepairReport,
) {
    let any = snapshot.is_some() || !segments.is_empty();
    let wrong = match Manifest::read(dir) {
        Ok(None) if !any => None,
        Ok(None) => Some("missing".to_owned()),
        Err(e) => Some(e),
        Ok(Some(m)) => {
            let seq = snapshot.map_or(0, |s| s.seq);
            let newest = segments.last().map_or(0, |s| s.first_seq);
            (m.snapshot_seq != seq || m.newest_segment > newest).then(|| {
                format!(
                    "names snapshot {} and newest segment {}, the directory holds {seq} and {newest}",
                    m.snapshot_seq, m.newest_segment
                )
            })
        }
    };
    if let Some(what) = wrong {
        let what = format!("{what}: written again");
        report.losses.push(whole_file(&Manifest::path(dir), what));
    }
}

/// The newest snapshot that opens; newer ones that do not are reported lost.
fn newest_snapshot(snapshots: &Snapshots, report: &mut RepairReport) -> Option<Snapshot> {
    for (_, path) in snapshots.snapshots.iter().rev() {
        match Snapshot::open(path) {
            Ok(snapshot) => return Some(snapshot),
            Err(SnapshotDamage { path, detail }) => report.losses.push(Loss {
                file: path,
                bytes: 0..0,
                batches: None,
                what: format!(
                    "snapshot unreadable ({detail}): its records are lost unless an older \
                     snapshot or the journal holds them"
                ),
            }),
        }
    }
    None
}

fn block_loss(damage: SnapshotDamage) -> Loss {
    Loss {
        file: damage.path,
        bytes: 0..0,
        batches: None,
        what: format!(
            "{}: the records of that block are lost unless the journal wrote them again",
            damage.detail
        ),
    }
}

fn has_damaged_blocks(snapshot: Option<&Snapshot>) -> bool {
    let mut damaged = Vec::new();
    count_damaged_blocks(snapshot, &mut damaged);
    !damaged.is_empty()
}

/// Reads every block of `snapshot`, recording those that fail their checksum.
fn count_damaged_blocks(snapshot: Option<&Snapshot>, damaged: &mut Vec<SnapshotDamage>) {
    let Some(snapshot) = snapshot else {
        return;
    };
    for table in &snapshot.tables {
        damaged.extend(snapshot.salvage(&table.name).filter_map(Result::err));
    }
}

/// The journal's batches after the snapshot, collected in order across every segment.
struct Salvage {
    /// The snapshot's batch.
    after: u64,
    /// The last batch kept (or the snapshot's).
    last: u64,
    kept: u64,
    changes: Changes,
}

impl Salvage {
    fn new(after: u64) -> Self {
        Self {
            after,
            last: after,
            kept: 0,
            changes: Changes::default(),
        }
    }

    /// Records that batches `last + 1 .. seq` are not to be found, in `bytes` of `file`,
    /// if any of them is after the snapshot.
    fn gap(
        &self,
        report: &mut RepairReport,
        file: &Path,
        bytes: std::ops::Range<u64>,
        seq: u64,
        what: &str,
    ) {
        let first = self.last + 1;
        if seq > first && seq - 1 > self.after {
            report.losses.push(Loss {
                file: file.to_owned(),
                bytes,
                batches: Some((first.max(self.after + 1), seq - 1)),
                what: what.to_owned(),
            });
        }
    }

    /// Keeps every whole record of `segment`.
    fn segment(&mut self, segment: &Segment, report: &mut RepairReport) {
        let path = &segment.path;
        let bytes = match std::fs::read(path) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                report
                    .losses
                    .push(whole_file(path, format!("unreadable: {e}")));
                return;
            }
        };
        let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let header = match read_segment_header(&bytes) {
            Ok(h) => h,
            Err(_) if written == 0 => return,
            Err(e) => {
                let what = format!("header damaged ({e}): the batches in it cannot be read");
                report.losses.push(whole_file(path, what));
                return;
            }
        };
        if header.first_seq > self.last + 1 {
            let what = "missing: no journal segment holds these batches";
            self.gap(report, path, 0..0, header.first_seq, what);
        }
        let names = crate::scan::table_names(&header.tables);
        let (mut pos, mut seen) = (header.len, header.first_seq - 1);
        while pos < written {
            let from = pos;
            let (at, record, len) = match read_record(&bytes[pos..written]) {
                Ok((record, len)) if record.seq > seen => (pos, record, len),
                _ => match next_whole(&bytes[..written], pos, seen) {
                    Some(found) => found,
                    None => {
                        self.torn(report, path, pos..written, seen);
                        return;
                    }
                },
            };
            if at > from && record.seq == seen + 1 && record.seq > self.after {
                report.losses.push(Loss {
                    file: path.clone(),
                    bytes: from as u64..at as u64,
                    batches: None,
                    what: "damaged bytes between two whole batches; no batch is missing".into(),
                });
            }
            (seen, pos) = (record.seq, at + len);
            if record.seq <= self.last {
                continue;
            }
            let what = "damaged records: these batches are lost";
            self.gap(report, path, from as u64..at as u64, record.seq, what);
            self.keep(report, path, at as u64..pos as u64, record, &names, &bytes);
        }
    }

    /// Applies one whole record, all of its operations or, if one does not parse, none.
    fn keep(
        &mut self,
        report: &mut RepairReport,
        path: &Path,
        bytes: std::ops::Range<u64>,
        record: format::RecordRef<'_>,
        names: &crate::scan::Names,
        file: &Bytes,
    ) {
        let checked = format::ops(record.payload).try_for_each(|op| {
            let op = op?;
            match names.contains_key(&op.table) {
                true => Ok(()),
                false => Err(format::FormatError::Malformed(
                    "table id not in the segment header",
                )),
            }
        });
        let applied = checked.and_then(|()| {
            crate::scan::apply_record(record.payload, names, file, &mut self.changes.sink())
        });
        if let Err(e) = applied {
            report.losses.push(Loss {
                file: path.to_owned(),
                bytes,
                batches: Some((record.seq, record.seq)),
                what: format!("batch {} is whole but unreadable: {e}", record.seq),
            });
        } else {
            self.kept += 1;
        }
        self.last = record.seq;
    }

    /// The end of a segment from `bytes` is not a whole record.
    fn torn(
        &self,
        report: &mut RepairReport,
        path: &Path,
        bytes: std::ops::Range<usize>,
        seen: u64,
    ) {
        if seen >= self.after {
            report.losses.push(Loss {
                file: path.to_owned(),
                what: format!(
                    "{} bytes after batch {seen} are not a whole record: a write that never \
                     finished, or damage",
                    bytes.len()
                ),
                bytes: bytes.start as u64..bytes.end as u64,
                batches: None,
            });
        }
    }
}

fn whole_file(path: &Path, what: String) -> Loss {
    Loss {
        file: path.to_owned(),
        bytes: 0..0,
        batches: None,
        what,
    }
}

/// Moves the files `new` replaces into a directory of their own under `DIR/damaged`,
/// then writes the manifest that names `new` alone. Returns where they went.
fn replace(
    dir: &Path,
    new: &Snapshot,
    snapshots: &Snapshots,
    segments: &[Segment],
) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = damaged_dir(dir).join(format!("repair-{stamp}"));
    for sub in ["journal", "snapshots"] {
        std::fs::create_dir_all(aside.join(sub))?;
    }
    let manifest = Manifest::path(dir);
    if manifest.exists() {
        std::fs::copy(&manifest, aside.join("MANIFEST"))?;
    }
    let moves = segments
        .iter()
        .map(|s| s.path.clone())
        .chain(std::iter::once(spare_path(dir)).filter(|p| p.exists()))
        .chain(
            snapshots
                .snapshots
                .iter()
                .map(|(_, p)| p.clone())
                .filter(|p| *p != new.path),
        );
    for path in moves {
        let sub = path
            .parent()
            .and_then(Path::file_name)
            .map_or_else(|| aside.clone(), |s| aside.join(s));
        if let Some(name) = path.file_name() {
            std::fs::rename(&path, sub.join(name))?;
        }
    }
    for sub in ["journal", "snapshots"] {
        sync_dir(&aside.join(sub))?;
        sync_dir(&dir.join(sub))?;
    }
    sync_dir(&damaged_dir(dir))?;
    Manifest {
        snapshot_seq: new.seq,
        newest_segment: 0,
    }
    .write(dir)
    .map_err(crate::files::WriteError::into_io)?;
    Ok(aside)
}

impl fmt::Display for RepairReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "data directory {}:", self.dir.display())?;
        match &self.snapshot {
            Some((path, seq)) => writeln!(f, "  snapshot {} (batch {seq})", path.display())?,
            None => writeln!(f, "  no readable snapshot")?,
        }
        writeln!(
            f,
            "  {} journal batches kept after it; the last batch kept is {}",
            self.batches, self.last_seq
        )?;
        if self.losses.is_empty() {
            return writeln!(f, "  nothing is damaged; nothing was changed");
        }
        writeln!(f, "  lost:")?;
        for loss in &self.losses {
            write!(f, "  - {}", loss.file.display())?;
            if !loss.bytes.is_empty() {
                write!(f, " bytes {}..{}", loss.bytes.start, loss.bytes.end)?;
            }
            match loss.batches {
                Some((a, b)) if a == b => write!(f, ", batch {a}")?,
                Some((a, b)) => write!(f, ", batches {a} to {b}")?,
                None => {}
            }
            writeln!(f, ": {}", loss.what)?;
        }
        match &self.moved_to {
            Some(aside) => writeln!(
                f,
                "  repaired: a new snapshot of {} records holds everything kept; the files it \
                 replaces were moved to {}",
                self.records,
                aside.display()
            ),
            None => writeln!(f, "  dry run: nothing was changed"),
        }
    }
}
