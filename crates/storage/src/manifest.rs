//! `DIR/MANIFEST`: which snapshot is current and which journal segment is the newest,
//! so that a missing file is found missing instead of looking like a store that never
//! had it.
//!
//! ```text
//! "SHMANI01" | snapshot_seq u64 (0: none) | newest_segment u64 (first batch; 0: none) | crc u32
//! ```
//!
//! Written whole under a temporary name, synced and renamed, whenever the committer
//! starts a segment or the compactor swaps a snapshot in (both under the file set's
//! lock, from its state). Without it, deleting the only snapshot, or the newest segment,
//! would open as an older store: data lost without a word.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::files::{sync_dir, WriteError};
use crate::format::{crc, FormatError, Reader};

const MAGIC: &[u8; 8] = b"SHMANI01";
const NAME: &str = "MANIFEST";

/// What the manifest records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Manifest {
    /// The batch of the current snapshot (0: no snapshot).
    pub(crate) snapshot_seq: u64,
    /// The first batch of the newest segment (0: no segment).
    pub(crate) newest_segment: u64,
}

impl Manifest {
    fn encode(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(28);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.snapshot_seq.to_le_bytes());
        out.extend_from_slice(&self.newest_segment.to_le_bytes());
        let sum = crc(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(bytes);
        if r.take(8)? != MAGIC {
            return Err(FormatError::Magic("manifest"));
        }
        let snapshot_seq = r.u64()?;
        let newest_segment = r.u64()?;
        let end = r.pos();
        if r.u32()? != crc(&bytes[..end]) || !r.is_empty() {
            return Err(FormatError::Checksum);
        }
        Ok(Self {
            snapshot_seq,
            newest_segment,
        })
    }

    /// Replaces `dir/MANIFEST` atomically and durably.
    pub(crate) fn write(self, dir: &Path) -> Result<(), WriteError> {
        let tmp = dir.join("MANIFEST.tmp");
        let mut file = File::create(&tmp).map_err(WriteError::Write)?;
        file.write_all(&self.encode()).map_err(WriteError::Write)?;
        file.sync_all().map_err(WriteError::Sync)?;
        std::fs::rename(&tmp, dir.join(NAME)).map_err(WriteError::Write)?;
        sync_dir(dir).map_err(WriteError::Sync)
    }

    /// Reads `dir/MANIFEST`: `Ok(None)` if there is none, `Err` with what is wrong if it
    /// cannot be read or is damaged.
    pub(crate) fn read(dir: &Path) -> Result<Option<Self>, String> {
        match std::fs::read(dir.join(NAME)) {
            Ok(bytes) => Self::decode(&bytes).map(Some).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Where it lives.
    pub(crate) fn path(dir: &Path) -> std::path::PathBuf {
        dir.join(NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_every_flip_is_caught() {
        let m = Manifest {
            snapshot_seq: 41,
            newest_segment: 42,
        };
        let bytes = m.encode();
        assert_eq!(Manifest::decode(&bytes), Ok(m));
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 4;
            assert!(Manifest::decode(&damaged).is_err(), "flip at {i}");
        }
        assert!(Manifest::decode(&bytes[..bytes.len() - 1]).is_err());
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Manifest::read(dir.path()), Ok(None));
        m.write(dir.path()).unwrap();
        assert_eq!(Manifest::read(dir.path()), Ok(Some(m)));
    }
}
