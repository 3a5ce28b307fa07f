//! The compactor: one thread per store that folds closed journal segments into a new
//! snapshot, so the journal a start-up replays stays bounded and the disk holds little
//! more than the live data; it also writes the spare segment the committer's next roll
//! takes (`files::prepare_spare`).
//!
//! It wakes when the committer closes a segment and works once the closed segments add
//! up to half the snapshot (at least [`crate::Options::compact_after_bytes`]), which bounds the
//! bytes rewritten per byte of journal to about three. A compaction reads the closed
//! segments into an overlay (the last write of each key), merges it with the current
//! snapshot table by table into a new snapshot (written under a temporary name, synced,
//! renamed), records it in the manifest and swaps it in under the file set's lock, and
//! only then deletes the old snapshot and the segments it folded in. Nothing it does is
//! needed for durability, so a failed compaction (a full disk, say) is logged once and
//! retried with a backoff while writes go on, up to the journal's bound (`journal.rs`).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::files::{prepare_spare, snapshot_path, spare_path, sync_dir, Files};
use crate::manifest::Manifest;
use crate::merge::merge;
use crate::scan::{scan, Changes, Overlay, SegmentDamage, Tail};
use crate::snapshot::{Snapshot, SnapshotDamage, SnapshotWriter};

/// Why one compaction gave up; the store is unharmed and a later one tries again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CompactError {
    /// Writing the new snapshot or the manifest failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A closed segment cannot be read back.
    #[error(transparent)]
    Segment(#[from] SegmentDamage),
    /// The current snapshot, or the one just written, cannot be read back.
    #[error(transparent)]
    Snapshot(#[from] SnapshotDamage),
}

/// How long the compactor waits after a failure before it tries again: doubling from the
/// first to the last, so a full disk is not rewritten with half a snapshot every moment.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// How many times the compaction threshold the closed segments add up to (0: not due).
fn backlog(files: &Files) -> u64 {
    let set = files.set.read();
    let closed = set.closed_bytes();
    let snapshot = set.snapshot.as_ref().map_or(0, |s| s.len);
    closed / (snapshot / 2).max(files.compact_after)
}

fn due(files: &Files) -> bool {
    backlog(files) >= 1
}

/// Nice value of the compactor thread while it keeps up: its work can wait, requests
/// cannot, so on a busy core the scheduler gives it about a tenth of the time (at normal
/// priority a compaction took the core from the request path for tens of milliseconds,
/// which showed in the benchmarks' p99). Once it falls behind by [`CATCH_UP`] thresholds
/// it asks for normal priority until it has caught up, which Linux grants only within
/// the process's RLIMIT_NICE (root, or a raised limit). What keeps the journal bounded
/// when that is refused is not priority but back-pressure: past the journal's bound
/// commits wait for the compactor (`journal.rs`).
const NICE: i32 = 10;
const CATCH_UP: u64 = 2;

fn set_nice(nice: i32) {
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), nice) {
        tracing::debug!(error = %e, nice, "cannot change the compactor thread's priority");
    }
}

/// A failure that repeats (a full disk) is logged when it starts and when it ends, not
/// at every attempt.
#[derive(Debug, Default)]
struct Failing {
    since: Option<std::time::Instant>,
    delay: Duration,
}

impl Failing {
    /// Another failure: logged if it is the first; returns how long to wait.
    fn failed(&mut self, what: &str, error: &dyn std::fmt::Display, dir: &Path) -> Duration {
        if self.since.is_none() {
            tracing::error!(dir = %dir.display(), %error, "{what} failed; retried until it succeeds");
            self.since = Some(std::time::Instant::now());
            self.delay = FIRST_RETRY;
        } else {
            tracing::debug!(dir = %dir.display(), %error, "{what} failed again");
            self.delay = (self.delay * 2).min(LAST_RETRY);
        }
        self.delay
    }

    fn succeeded(&mut self, what: &str) {
        if let Some(since) = self.since.take() {
            tracing::info!(
                failed_for_ms = since.elapsed().as_millis() as u64,
                "{what} succeeded again"
            );
        }
    }
}

/// The compactor thread's body: runs until `stop` is set.
pub(crate) fn run(files: Arc<Files>, stop: Arc<AtomicBool>) {
    let mut nice = NICE;
    set_nice(nice);
    let (mut spare_failing, mut compaction_failing) = (Failing::default(), Failing::default());
    loop {
        let wanted = if backlog(&files) >= CATCH_UP { 0 } else { NICE };
        if wanted != nice {
            set_nice(wanted);
            nice = wanted;
        }
        // The committer takes the spare segment when it rolls: the next one is written
        // here, while there is time.
        let retry = match prepare_spare(&files) {
            Ok(()) => {
                spare_failing.succeeded("writing the spare journal segment");
                None
            }
            Err(e) => Some(spare_failing.failed(
                "writing the spare journal segment (the next segment starts empty)",
                &e,
                &files.dir,
            )),
        };
        {
            let mut guard = files.rolled.0.lock();
            if stop.load(Ordering::Acquire) {
                return;
            }
            if !due(&files) {
                match retry {
                    None if spare_path(&files.dir).exists() => files.rolled.1.wait(&mut guard),
                    None => {}
                    Some(delay) => drop(files.rolled.1.wait_for(&mut guard, delay)),
                }
                continue;
            }
        }
        let outcome = compact(&files, &stop);
        files.io.compacted(outcome.is_ok());
        match outcome {
            Ok(()) => compaction_failing.succeeded("compaction"),
            Err(e) => {
                let delay = compaction_failing.failed(
                    "compaction (the journal grows until one succeeds)",
                    &e,
                    &files.dir,
                );
                let mut guard = files.rolled.0.lock();
                if !stop.load(Ordering::Acquire) {
                    files.rolled.1.wait_for(&mut guard, delay);
                }
            }
        }
    }
}

/// Folds every closed segment into a new snapshot.
pub(crate) fn compact(files: &Files, stop: &AtomicBool) -> Result<(), CompactError> {
    let _one_at_a_time = files.compacting.lock();
    let (old, segments) = {
        let set = files.set.read();
        let closed: Vec<_> = set
            .segments
            .iter()
            .take_while(|s| s.closed)
            .cloned()
            .collect();
        (set.snapshot.clone(), closed)
    };
    if segments.is_empty() {
        return Ok(());
    }
    let after = old.as_ref().map_or(0, |s| s.seq);
    let mut changes = Changes::default();
    let mut last = after;
    for segment in &segments {
        let scanned = scan(
            &segment.path,
            segment.first_seq,
            after,
            Tail::Whole,
            &mut changes.sink(),
        )?;
        last = last.max(scanned.last_seq);
    }
    let overlay = changes.sorted();
    let new = if last > after {
        match write_snapshot(&files.dir, old.as_deref(), overlay, last, stop, None)? {
            Some(new) => Some(new),
            // The store is closing: the segments stay for the next start.
            None => return Ok(()),
        }
    } else {
        None
    };
    {
        let mut set = files.set.write();
        // The manifest names the new snapshot before anything it replaces is deleted.
        let manifest = Manifest {
            snapshot_seq: new.as_ref().map_or(after, |n| n.seq),
            newest_segment: set
                .segments
                .get(segments.len()..)
                .and_then(<[_]>::last)
                .map_or(0, |s| s.first_seq),
        };
        manifest.write(&files.dir).map_err(|e| CompactError::Io {
            path: Manifest::path(&files.dir),
            source: e.into_io(),
        })?;
        if let Some(new) = &new {
            set.snapshot = Some(Arc::new(new.clone()));
            set.generation += 1;
        }
        set.segments.drain(..segments.len());
    }
    files.notify_compacted();
    if let Some(new) = &new {
        if let Some(old) = old.filter(|o| o.path != new.path) {
            remove(&old.path);
        }
        tracing::debug!(
            seq = new.seq,
            bytes = new.len,
            segments = segments.len(),
            "journal compacted into a snapshot"
        );
    }
    for segment in &segments {
        remove(&segment.path);
    }
    Ok(())
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove a file compaction made obsolete");
    }
}

/// Writes the snapshot of batch `seq`: `old` with `overlay` applied, every table in
/// name order. Gives up (`None`, the temporary file removed) if `stop` is set meanwhile.
/// With `salvaged`, a damaged block of `old` is recorded there and skipped (a repair);
/// without, it fails the compaction. A failure removes the temporary file: a full disk
/// must not be kept full by a half-written snapshot.
pub(crate) fn write_snapshot(
    dir: &Path,
    old: Option<&Snapshot>,
    overlay: Overlay,
    seq: u64,
    stop: &AtomicBool,
    salvaged: Option<&mut Vec<SnapshotDamage>>,
) -> Result<Option<Snapshot>, CompactError> {
    let path = snapshot_path(dir, seq);
    let tmp = path.with_extension("snap.tmp");
    let written = write_tables(&tmp, old, overlay, seq, stop, salvaged);
    match written {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            let _ = std::fs::remove_file(&tmp);
            return written.map(|_| None);
        }
    }
    let io = |source: std::io::Error| CompactError::Io {
        path: path.clone(),
        source,
    };
    std::fs::rename(&tmp, &path).map_err(io)?;
    sync_dir(&dir.join("snapshots")).map_err(io)?;
    Ok(Some(Snapshot::open(&path)?))
}

/// Writes the tables of [`write_snapshot`] to `tmp`, synced; `false` if `stop` was set.
fn write_tables(
    tmp: &Path,
    old: Option<&Snapshot>,
    mut overlay: Overlay,
    seq: u64,
    stop: &AtomicBool,
    mut salvaged: Option<&mut Vec<SnapshotDamage>>,
) -> Result<bool, CompactError> {
    let io = |source: std::io::Error| CompactError::Io {
        path: tmp.to_owned(),
        source,
    };
    let mut names: Vec<Arc<str>> = old
        .map(|s| {
            s.tables
                .iter()
                .map(|t| Arc::from(t.name.as_str()))
                .collect()
        })
        .unwrap_or_default();
    names.extend(overlay.keys().cloned());
    names.sort();
    names.dedup();
    let mut writer = SnapshotWriter::create(tmp, seq).map_err(io)?;
    for (id, name) in names.iter().enumerate() {
        writer.begin_table(id as u16, name).map_err(io)?;
        let changes = overlay.remove(name).unwrap_or_default();
        let base = old
            .map(|s| match salvaged {
                Some(_) => s.salvage(name),
                None => s.records(name),
            })
            .into_iter()
            .flatten();
        for (i, record) in merge(base, changes).enumerate() {
            let (key, value) = match (record, salvaged.as_deref_mut()) {
                (Ok(record), _) => record,
                (Err(damage), Some(salvaged)) => {
                    salvaged.push(damage);
                    continue;
                }
                (Err(damage), None) => return Err(damage.into()),
            };
            writer.put(&key, &value).map_err(io)?;
            if i % 4096 == 0 && stop.load(Ordering::Acquire) {
                return Ok(false);
            }
        }
    }
    writer.finish().map_err(io)?;
    Ok(true)
}
