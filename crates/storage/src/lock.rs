//! `DIR/LOCK`: one statehub per data directory.
//!
//! An exclusive advisory lock (`flock`) on the file, held for the life of the store and
//! released by the kernel when the process dies, however it dies, so a `kill -9` never
//! leaves a stale lock behind. The file holds the owner's pid, only for the error message
//! of the process that is refused.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use crate::error::OpenError;

/// The held lock; dropping it releases the lock.
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

impl DirLock {
    pub(crate) fn acquire(dir: &Path) -> Result<Self, OpenError> {
        let path = dir.join("LOCK");
        let io = |source| OpenError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder = match file.read_to_string(&mut text) {
                    Ok(_) if !text.trim().is_empty() => format!("pid {}", text.trim()),
                    _ => "unknown owner".to_owned(),
                };
                return Err(OpenError::Locked {
                    dir: dir.to_owned(),
                    holder,
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file })
    }
}
