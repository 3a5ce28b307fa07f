//! Message bodies: a message queued for several persistent sessions is stored once, in
//! a body record of its own, and each session's message record refers to it by id.
//!
//! The table counts, per message (the broker's `Arc<Message>`, keyed by its address,
//! which the entry keeps alive), the message records that refer to it: written or
//! still held back. Crash safety comes from order alone, since the store applies
//! batches whole and in the order they are submitted: a body's put is staged before
//! (or in the same batch as) the first record that refers to it, and its deletion with
//! (or after) the deletion of the last one. So every message record on disk has its
//! body; a body left without records by a crash is deleted at the next load.

use std::sync::Arc;
use std::time::Instant;

use rustc_hash::FxHashMap;
use statehub_broker::Message;
use statehub_storage::{Batch, StorageError, Table};

use super::records::{body_key, encode_body};

/// The bodies referred to now, by message.
#[derive(Debug, Default)]
pub(super) struct Bodies {
    by_message: FxHashMap<usize, Body>,
    next_id: u64,
}

#[derive(Debug)]
struct Body {
    id: u64,
    /// Message records (written or held) that refer to it.
    refs: u64,
    /// Its put is staged (it is, or will be, on disk before any record referring to it).
    written: bool,
    msg: Arc<Message>,
    /// When it was first queued: what its Message Expiry counts from when written.
    queued_at: Instant,
}

/// The key of a message in [`Bodies`]: its address, kept valid by the entry's `Arc`.
fn key(msg: &Arc<Message>) -> usize {
    Arc::as_ptr(msg) as usize
}

impl Bodies {
    /// The bodies a load found referred to: (id, message, records referring to it),
    /// all on disk; new ids start after `max_id`.
    pub fn loaded(
        bodies: impl IntoIterator<Item = (u64, Arc<Message>, u64)>,
        max_id: u64,
        now: Instant,
    ) -> Bodies {
        let by_message = bodies
            .into_iter()
            .map(|(id, msg, refs)| {
                let body = Body {
                    id,
                    refs,
                    written: true,
                    msg: msg.clone(),
                    queued_at: now,
                };
                (key(&msg), body)
            })
            .collect();
        Bodies {
            by_message,
            next_id: max_id + 1,
        }
    }

    /// One more record refers to `msg` (queued at `now`).
    pub fn refer(&mut self, msg: &Arc<Message>, now: Instant) {
        let next_id = &mut self.next_id;
        self.by_message
            .entry(key(msg))
            .or_insert_with(|| {
                let id = *next_id;
                *next_id += 1;
                Body {
                    id,
                    refs: 0,
                    written: false,
                    msg: msg.clone(),
                    queued_at: now,
                }
            })
            .refs += 1;
    }

    /// Whether some record refers to `msg`.
    pub fn is_referred(&self, msg: &Arc<Message>) -> bool {
        self.by_message.contains_key(&key(msg))
    }

    /// Stages `msg`'s body into `batch` unless it is staged already, ahead of a record
    /// that refers to it; its id. `None` if no record refers to `msg`.
    pub fn write(
        &mut self,
        table: &Table,
        batch: &mut Batch,
        msg: &Arc<Message>,
    ) -> Result<Option<u64>, StorageError> {
        let Some(body) = self.by_message.get_mut(&key(msg)) else {
            return Ok(None);
        };
        if !body.written {
            let value = encode_body(&body.msg, body.queued_at);
            batch.put(table, &body_key(body.id), &value)?;
            body.written = true;
        }
        Ok(Some(body.id))
    }

    /// A record referring to `msg` is gone (its deletion staged into `batch`, or it was
    /// never written); the last one takes the body with it.
    pub fn release(
        &mut self,
        table: &Table,
        batch: &mut Batch,
        msg: &Arc<Message>,
    ) -> Result<(), StorageError> {
        let k = key(msg);
        let Some(body) = self.by_message.get_mut(&k) else {
            return Ok(());
        };
        body.refs = body.refs.saturating_sub(1);
        if body.refs > 0 {
            return Ok(());
        }
        let written = body.written;
        let id = body.id;
        self.by_message.remove(&k);
        if written {
            batch.delete(table, &body_key(id))?;
        }
        Ok(())
    }
}
