//! The first half of opening a store: take the directory's lock, recover it
//! (`recovery.rs` decides, reading only), then act on what recovery found (the torn end
//! of the journal, files nothing needs) and write the manifest. `store.rs` then starts the
//! threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::OpenError;
use crate::files::Segment;
use crate::format::TableNames;
use crate::journal::Continue;
use crate::lock::DirLock;
use crate::manifest::Manifest;
use crate::recovery::{recover, Recovered, Recovery};
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
            if t.after > 0 {
                // Zeros over the torn bytes: the segment keeps its length (see
                // `files::prepare_spare`), and the committer writes on from its last batch.
                zero(&t.path, t.after, t.written).map_err(io(&t.path))?;
            }
            tracing::warn!(
                journal = %t.path.display(),
                discarded_bytes = t.written - t.after,
                "recovery discarded the end of a journal after its last whole batch: either a \
                 batch statehub was writing when it stopped (never acknowledged), or damage, in \
                 which case the writes after the damaged point are lost; every batch before it is kept"
            );
        }
        // What recovery kept (a new store's first manifest, or one without a segment it
        // removed).
        Manifest {
            snapshot_seq: snapshot.as_ref().map_or(0, |s| s.seq),
            newest_segment: segments.last().map_or(0, |s| s.first_seq),
        }
        .write(&dir)
        .map_err(io(&Manifest::path(&dir)))?;
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

/// Overwrites bytes `from..to` of the file at `path` with zeros, synced.
fn zero(path: &Path, from: u64, to: u64) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(from))?;
    let zeros = vec![0u8; usize::try_from(to.saturating_sub(from)).unwrap_or(0)];
    file.write_all(&zeros)?;
    file.sync_data()
}
