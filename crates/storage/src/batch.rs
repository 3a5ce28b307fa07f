//! A batch: writes staged in memory, applied atomically by the committer.
//!
//! Staging encodes each write straight into the batch's one buffer, in the journal's
//! own form (`format.rs`), so the committer writes it out with a header and a checksum
//! and no other copy, and a batch of any size costs one growing allocation instead of
//! one per key and value.

use crate::error::StorageError;
use crate::format::{put_op, put_op_with};
use crate::table::Table;

/// Longest key a table takes, in bytes.
pub const MAX_KEY_LEN: usize = u16::MAX as usize;
/// Longest value a table takes, in bytes: 256 MiB, the largest MQTT packet.
pub const MAX_VALUE_LEN: usize = 256 << 20;
/// Largest batch, encoded: a journal record's length is 32 bits.
pub const MAX_BATCH_BYTES: usize = u32::MAX as usize - 64;

/// Writes to apply together, all or nothing, in the order staged. Building one does no
/// I/O; hand it to [`crate::Store::submit`].
#[derive(Default)]
pub struct Batch {
    /// The encoded operations.
    pub(crate) ops: Vec<u8>,
    len: usize,
    bytes: usize,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("ops", &self.len)
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
    /// [`MAX_KEY_LEN`] or a value over [`MAX_VALUE_LEN`] bytes, and a write that would
    /// take the batch over [`MAX_BATCH_BYTES`].
    pub fn put(&mut self, table: &Table, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StorageError::ValueTooLong {
                len: value.len(),
                max: MAX_VALUE_LEN,
            });
        }
        self.check_room(key.len() + value.len() + 13)?;
        if self.ops.capacity() == 0 {
            self.ops.reserve(64 + key.len() + value.len());
        }
        put_op(&mut self.ops, table.id(), key, Some(value));
        self.len += 1;
        self.bytes += key.len() + value.len();
        Ok(())
    }

    /// Stages `key = value` in `table`, the value appended by `write` straight into the
    /// batch (no buffer of its own). Refuses what [`Batch::put`] refuses, leaving the
    /// batch unchanged.
    pub fn put_with(
        &mut self,
        table: &Table,
        key: &[u8],
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(), StorageError> {
        check_key(key)?;
        let start = self.ops.len();
        if start == 0 {
            self.ops.reserve(256);
        }
        let len = put_op_with(&mut self.ops, table.id(), key, write);
        let refused = if len > MAX_VALUE_LEN {
            Some(StorageError::ValueTooLong {
                len,
                max: MAX_VALUE_LEN,
            })
        } else if self.ops.len() > MAX_BATCH_BYTES {
            Some(StorageError::BatchTooLarge {
                max: MAX_BATCH_BYTES,
            })
        } else {
            None
        };
        if let Some(e) = refused {
            self.ops.truncate(start);
            return Err(e);
        }
        self.len += 1;
        self.bytes += key.len() + len;
        Ok(())
    }

    /// Stages the removal of `key` from `table` (a no-op if it is absent).
    pub fn delete(&mut self, table: &Table, key: &[u8]) -> Result<(), StorageError> {
        check_key(key)?;
        self.check_room(key.len() + 5)?;
        put_op(&mut self.ops, table.id(), key, None);
        self.len += 1;
        self.bytes += key.len();
        Ok(())
    }

    fn check_room(&self, op_bytes: usize) -> Result<(), StorageError> {
        if self.ops.len() + op_bytes > MAX_BATCH_BYTES {
            return Err(StorageError::BatchTooLarge {
                max: MAX_BATCH_BYTES,
            });
        }
        Ok(())
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of staged writes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Sum of staged key and value lengths (what [`crate::Options::max_pending_bytes`]
    /// counts).
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}
