//! A batch: writes staged in memory, applied atomically by the committer.
//!
//! Staging copies the key and value once, into the form the storage engine takes, so the
//! committer moves them into its write without another copy and the caller keeps its
//! own buffers.

use fjall::{Keyspace, Slice};

use crate::error::StorageError;
use crate::store::Table;

/// Longest key a table takes, in bytes (the storage engine's limit).
pub const MAX_KEY_LEN: usize = u16::MAX as usize;
/// Longest value a table takes, in bytes (the storage engine's limit).
pub const MAX_VALUE_LEN: usize = u32::MAX as usize;

/// One staged write.
pub(crate) struct Op {
    pub(crate) keyspace: Keyspace,
    pub(crate) key: Slice,
    /// `None` deletes the key.
    pub(crate) value: Option<Slice>,
}

/// Writes to apply together, all or nothing, in the order staged. Building one does no
/// I/O; hand it to [`crate::Store::submit`].
#[derive(Default)]
pub struct Batch {
    pub(crate) ops: Vec<Op>,
    bytes: usize,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("ops", &self.ops.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

fn check_key(key: &[u8]) -> Result<(), StorageError> {
    if key.len() > MAX_KEY_LEN {
        return Err(StorageError::KeyTooLong {
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    Ok(())
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stages `key = value` in `table`. Refuses (leaving the batch unchanged) a key over
    /// [`MAX_KEY_LEN`] or a value over [`MAX_VALUE_LEN`] bytes.
    pub fn put(&mut self, table: &Table, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StorageError::ValueTooLong {
                len: value.len(),
                max: MAX_VALUE_LEN,
            });
        }
        self.bytes += key.len() + value.len();
        self.ops.push(Op {
            keyspace: table.keyspace.clone(),
            key: Slice::from(key),
            value: Some(Slice::from(value)),
        });
        Ok(())
    }

    /// Stages the removal of `key` from `table` (a no-op on disk if it is absent).
    pub fn delete(&mut self, table: &Table, key: &[u8]) -> Result<(), StorageError> {
        check_key(key)?;
        self.bytes += key.len();
        self.ops.push(Op {
            keyspace: table.keyspace.clone(),
            key: Slice::from(key),
            value: None,
        });
        Ok(())
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Number of staged writes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Sum of staged key and value lengths (what [`crate::Options::max_pending_bytes`]
    /// counts).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
