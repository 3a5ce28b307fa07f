//! The engine while its storage waits for disk space ([`statehub_storage::Store::stall_error`]).
//!
//! What it does then, and why:
//! * **Client writes are refused** before anything changes: the first `put` or `remove`
//!   of a request fails with [`statehub_storage::StorageError::NoSpace`] (the shell answers
//!   that request with an error and carries on; it is not a failure of the engine).
//!   Queueing them instead would only grow memory with writes nobody can be promised,
//!   and their callers would wait with no answer. A request whose first write was
//!   accepted has its later writes accepted too, so no request is applied in part.
//! * **Expiry goes on**: removing a key whose expiry has passed is not refused. It is
//!   safe to reveal before it is durable: a restart removes an expired key anyway.
//! * **Reads of durable data are answered at once**: the engine learns from the store
//!   which of its keys have writes waiting (written before the stall was seen), watches
//!   the keys each request reads, and [`crate::DurableEngine`]'s `seal` asks the reply
//!   to wait only if the request read one of those, wrote, or read nothing it could
//!   tell (a scan, or a call such as a cached reply re-sent, which reads nothing through
//!   the engine). So a GET of a key written before the disk filled waits with that write;
//!   a GET of anything else is answered.
//!
//! Outside a stall all of this costs one atomic load per request that writes, and one
//! branch per read.

use std::cell::Cell;
use std::collections::HashSet;

use bytes::Bytes;

/// What the engine tracks per request about a stall (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct StallWatch {
    /// `now` of the last `expired` call: a removal of a key expired by then is expiry.
    expired_as_of: Cell<u64>,
    /// A client write was accepted in this request.
    client_wrote: bool,
    /// The keys whose writes wait for disk space, while they do (read from the store at
    /// the first seal that sees the stall, and again after a client write).
    stuck: Option<HashSet<Bytes>>,
    /// This request read a key of `stuck` (or scanned while some wait).
    revealed: Cell<bool>,
    /// This request read anything through the engine.
    read: Cell<bool>,
}

impl StallWatch {
    /// The machine asked which keys expired at `now_ms`.
    pub(crate) fn expiring_at(&self, now_ms: u64) {
        self.expired_as_of.set(now_ms);
    }

    /// Whether removing an entry that expires at `expires_at_ms` is expiry.
    pub(crate) fn is_expiry(&self, expires_at_ms: Option<u64>) -> bool {
        expires_at_ms.is_some_and(|at| at <= self.expired_as_of.get())
    }

    /// Whether a client write must be checked against a stall: the first of its request.
    pub(crate) fn first_client_write(&self) -> bool {
        !self.client_wrote
    }

    /// A client write was accepted.
    pub(crate) fn client_wrote(&mut self) {
        self.client_wrote = true;
    }

    /// The request read `key`.
    pub(crate) fn read(&self, key: &[u8]) {
        self.read.set(true);
        if self.stuck.as_ref().is_some_and(|keys| keys.contains(key)) {
            self.revealed.set(true);
        }
    }

    /// The request scanned: it may reveal any key's presence.
    pub(crate) fn scanned(&self) {
        self.read.set(true);
        if self.stuck.as_ref().is_some_and(|keys| !keys.is_empty()) {
            self.revealed.set(true);
        }
    }

    /// The end of a request (`seal`) while the store is stalled: whether its reply must
    /// wait for the engine's writes. `pending_keys` gives the keys that wait (`None`: not
    /// stalled after all). Resets the request's tracking.
    pub(crate) fn must_wait(&mut self, pending_keys: impl FnOnce() -> Option<Vec<Bytes>>) -> bool {
        let client_wrote = std::mem::take(&mut self.client_wrote);
        let revealed = self.revealed.replace(false);
        let read = self.read.replace(false);
        let watched = self.stuck.is_some();
        // Batches submitted since the keys were read hold this request's client writes
        // (then it waits anyway, and the keys are read again) or only expiry, which
        // readers need not wait for: no need to decode everything pending again.
        if watched && !client_wrote {
            return !read || revealed;
        }
        match pending_keys() {
            None => {
                self.stuck = None;
                true
            }
            Some(keys) => {
                self.stuck = Some(keys.into_iter().collect());
                !watched || !read || client_wrote || revealed
            }
        }
    }

    /// Writes no longer wait.
    pub(crate) fn clear(&mut self) {
        self.stuck = None;
        self.client_wrote = false;
        self.revealed.set(false);
        self.read.set(false);
    }
}
