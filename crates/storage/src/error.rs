//! Errors: [`OpenError`] when a store cannot be opened (statehub refuses to start),
//! [`StorageError`] afterwards.
//!
//! A refused write (a key over the size limit) is [`StorageError::KeyTooLong`] /
//! [`StorageError::ValueTooLong`] and leaves the store healthy; [`StorageError::Failed`]
//! means the store is broken for good (see the crate docs). Damaged files are told apart
//! from other I/O errors so the message can say "damaged" and name the files.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

/// Why [`crate::Store::open`] failed. Every variant names the directory or file.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process (or another open in this one) holds `DIR/LOCK`.
    #[error(
        "data directory {dir} is in use by another statehub ({holder}); refusing to open it twice"
    )]
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// What the lock file says about its owner (`pid N`), or `unknown owner`.
        holder: String,
    },
    /// The directory or a file in it cannot be created, read or written.
    #[error("cannot use data directory {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Files in the directory are damaged beyond the torn last write recovery sets aside;
    /// nothing in the directory was changed.
    #[error("data directory {dir} is damaged ({files}): {detail}; refusing to start rather than lose data (`statehub repair --data-dir {dir}` keeps every intact batch and reports what is lost; or restore the directory from a backup, or move it away to start empty)", dir = dir.display())]
    Corrupt {
        /// The data directory.
        dir: PathBuf,
        /// The damaged file(s).
        files: String,
        /// What is wrong.
        detail: String,
    },
    /// The directory holds something this version cannot read.
    #[error("cannot open data directory {dir}: {detail}; move it away to start empty")]
    Unsupported {
        /// The data directory.
        dir: PathBuf,
        /// What it holds.
        detail: String,
    },
}

/// Why a store operation failed after open. Cheap to clone: one failure is handed to
/// every waiting ticket.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StorageError {
    /// A commit or sync failed earlier; the store accepts no more writes.
    #[error("the store failed and accepts no more writes: {0}")]
    Failed(Arc<dyn std::error::Error + Send + Sync>),
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// Writes wait for disk space: a commit found none (`ENOSPC`, `EDQUOT`) and is tried
    /// again until there is room. Nothing submitted is lost; callers refuse new writes
    /// meanwhile (see the crate docs).
    #[error("no disk space (for {} s): {cause}; writes wait and are retried until there is room", waiting.as_secs())]
    NoSpace {
        /// How long writes have been waiting.
        waiting: std::time::Duration,
        /// The error of the write that found no room.
        cause: Arc<io::Error>,
    },
    /// A key over [`crate::MAX_KEY_LEN`] bytes; the batch is unchanged.
    #[error("a key of {len} bytes is over the storage limit of {max} bytes")]
    KeyTooLong {
        /// The key's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A value over [`crate::MAX_VALUE_LEN`] bytes; the batch is unchanged.
    #[error("a value of {len} bytes is over the storage limit of {max} bytes")]
    ValueTooLong {
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The batch would grow past [`crate::MAX_BATCH_BYTES`]; it is unchanged.
    #[error("a batch may hold at most {max} bytes")]
    BatchTooLarge {
        /// The limit.
        max: usize,
    },
    /// Reading found damaged data.
    #[error("damaged data in {files}: {detail}")]
    Corrupt {
        /// The damaged file(s).
        files: String,
        /// What is wrong.
        detail: String,
    },
    /// Reading failed for another reason.
    #[error("reading table {table} failed: {source}")]
    Read {
        /// The table.
        table: String,
        /// The cause.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
    /// Opening a table failed.
    #[error("cannot open table {table}: {source}")]
    Table {
        /// The table.
        table: String,
        /// The cause.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}
