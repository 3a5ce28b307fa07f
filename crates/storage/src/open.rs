//! The first half of opening a store: take the directory's lock, recover it
//! (`recovery.rs` decides, reading only), then act on what recovery found (the torn end
//! of the journal, files nothing needs) and write the manifest. `store.rs` then starts the
//! threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::OpenError;
use crate::files::{damaged_dir, sync_dir, write_file, Segment};
use crate::format::TableNames;
use crate::journal::Continue;
use crate::lock::DirLock;
use crate::manifest::Manifest;
use crate::recovery::{recover, Recovered, Recovery, TruncatedJournal};
use crate::scan::Overlay;
use crate::snapshot::Snapshot;

/// A recovered directory, locked, ready for its threads.
#[derive(Debug)]
pub(crate) struct Opened {
    pub(crate) dir: PathBuf,
    pub(crate) lock: DirLock,
    pub(crate) snapshot: Option<Arc<Snapshot>>,
    /// The segments after the snapshot, all closed.
    pub(crate) segments: Vec<Segment>,
    /// Their changes to the snapshot.
    pub(crate) overlay: Overlay,
    /// The last batch recovered (0 for a new store).
    pub(crate) last_seq: u64,
    /// The last segment, which the committer goes on writing, and its tables.
    pub(crate) resume: Option<(Continue, TableNames)>,
    pub(crate) recovery: Recovery,
}

impl Opened {
    /// Locks `dir` (creating it if needed), recovers it and tidies it up.
    pub(crate) fn recover(dir: &Path) -> Result<Opened, OpenError> {
        let dir = dir.to_owned();
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
            segments,
            overlay,
            last_seq,
            truncated_journals,
            obsolete,
            resume,
        } = recover(&dir)?;
        for t in &truncated_journals {
            set_aside(&dir, t).map_err(io(&t.kept))?;
            tracing::warn!(
                journal = %t.path.display(),
                discarded_bytes = t.written - t.after,
                kept_in = %t.kept.display(),
                "recovery discarded the end of the journal after its last whole batch: a write \
                 statehub was making when it stopped (never acknowledged with --sync always; \
                 with --sync interval, at most the writes of the last interval before a power \
                 cut). Every batch before it is kept; the discarded bytes are kept in their own file"
            );
        }
        // What recovery kept (a new store's first manifest, or one without a segment it
        // removed).
        Manifest {
            snapshot_seq: snapshot.as_ref().map_or(0, |s| s.seq),
            newest_segment: segments.last().map_or(0, |s| s.first_seq),
        }
        .write(&dir)
        .map_err(|e| io(&Manifest::path(&dir))(e.into_io()))?;
        for path in &obsolete {
            std::fs::remove_file(path).map_err(io(path))?;
        }
        Ok(Opened {
            dir,
            lock,
            snapshot,
            segments,
            overlay,
            last_seq,
            resume,
            recovery: Recovery { truncated_journals },
        })
    }
}

/// Copies the torn end of a segment into its own file (synced) and only then overwrites
/// it with zeros in the segment, so the committer can write on after the last whole
/// batch (the segment keeps its length, see `files::prepare_spare`). A crash in between
/// finds the same torn end at the next open and copies it again.
fn set_aside(dir: &Path, torn: &TruncatedJournal) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&torn.path)?;
    let len = usize::try_from(torn.written.saturating_sub(torn.after)).unwrap_or(0);
    let mut bytes = vec![0u8; len];
    file.read_exact_at(&mut bytes, torn.after)?;
    let damaged = damaged_dir(dir);
    std::fs::create_dir_all(&damaged)?;
    sync_dir(dir)?;
    write_file(&torn.kept, &bytes)?;
    if torn.after > 0 {
        bytes.fill(0);
        file.write_all_at(&bytes, torn.after)?;
        file.sync_data()?;
    }
    Ok(())
}
