//! The bookkeeping of a reliable session, pure and synchronous: the sequence ids and
//! the replay buffer of sequenced messages the client has not acknowledged, and the
//! processed `ackId`s. The hub holds one of each per session under the session's lock;
//! nothing here does I/O or reads the clock, so the limits are tested directly.
//!
//! # The replay buffer
//!
//! The buffer exists for recovery only: on a live connection every frame also goes to
//! the socket's outbox, so evicting a frame from the buffer never keeps it from a
//! client that stays connected. The official clients acknowledge about once a second,
//! so a subscriber reading thousands of messages a second always has thousands
//! unacknowledged; the buffer must not be what ends its session.
//!
//! The buffer is bounded in bytes (each frame's payload plus [`ENTRY_OVERHEAD`]) and,
//! for frames already written to the socket, in age. Past a bound the oldest frames
//! are evicted; frames go to the socket in sequence order, so the oldest are the ones
//! written first (and, on a draining connection, usually received). Eviction records
//! the highest sequence id evicted before the client acknowledged it. A frame written
//! to the socket is not a frame received (a reset loses what is in flight), so a
//! recovery is served only when every frame above the client's last `sequenceAck` is
//! still here: then it is replayed in full; otherwise the recovery fails with 1008
//! and the client starts a new session. Nothing is lost silently either way.
//!
//! A frame with a deadline (`messageTtlSeconds`) is not replayed after it; dropping
//! such a frame does not make a replay incomplete.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use axum::extract::ws::Message;
use tokio::time::Instant;

use crate::outbox::frame_len;

/// Bytes a buffered frame costs beyond its payload (its slot in the buffer, the shared
/// payload's header); counted so that the byte bound bounds memory even for tiny frames.
pub(crate) const ENTRY_OVERHEAD: usize = std::mem::size_of::<Entry>() + 32;

/// A recovery cannot be served: frames the client has not acknowledged were evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "messages {first} to {last} were dropped from the replay buffer before the client \
     acknowledged them, so the session cannot be recovered"
)]
pub(crate) struct ReplayLost {
    /// The first sequence id the client lacks and the buffer no longer holds.
    pub first: u64,
    /// The last sequence id evicted unacknowledged.
    pub last: u64,
}

/// What one [`Sequencer::trim`] evicted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Evicted {
    /// Frames evicted that had been written to the socket.
    pub written: usize,
    /// Frames evicted that had not been written yet (the socket is not draining, or
    /// there is none).
    pub unwritten: usize,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    frame: Message,
    /// Not replayed after this (`messageTtlSeconds`).
    deadline: Option<Instant>,
    /// When it was buffered.
    at: Instant,
}

impl Entry {
    fn cost(&self) -> usize {
        frame_len(&self.frame) + ENTRY_OVERHEAD
    }

    fn expired(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }
}

/// Sequence ids (from 1) and the replay buffer, oldest first.
#[derive(Debug)]
pub(crate) struct Sequencer {
    next: u64,
    /// The client's highest `sequenceAck`.
    acked: u64,
    /// The highest id evicted while unacknowledged and unexpired (0: none).
    evicted_through: u64,
    frames: VecDeque<Entry>,
    bytes: usize,
    max_bytes: usize,
    max_age: Option<Duration>,
}

impl Sequencer {
    /// An empty sequencer holding at most `max_bytes`, and written frames for at most
    /// `max_age` (`None`: no age bound).
    pub(crate) fn new(max_bytes: usize, max_age: Option<Duration>) -> Self {
        Self {
            next: 1,
            acked: 0,
            evicted_through: 0,
            frames: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_age,
        }
    }

    /// Gives the next message its sequence id, encodes it with `encode` and buffers
    /// the frame (not to be replayed after `deadline`). Call [`Sequencer::trim`] after.
    pub(crate) fn push(
        &mut self,
        encode: impl FnOnce(u64) -> Message,
        deadline: Option<Instant>,
        now: Instant,
    ) -> (u64, Message) {
        let id = self.next;
        self.next += 1;
        let entry = Entry {
            id,
            frame: encode(id),
            deadline,
            at: now,
        };
        let frame = entry.frame.clone();
        self.bytes += entry.cost();
        self.frames.push_back(entry);
        (id, frame)
    }

    /// Enforces the bounds, given that the socket has been written every frame up to
    /// `written` (0 when there is no socket): written frames older than the age bound
    /// go, then the oldest frames until the bytes fit (frames past their deadline
    /// first).
    pub(crate) fn trim(&mut self, written: u64, now: Instant) -> Evicted {
        let mut evicted = Evicted::default();
        if let Some(max_age) = self.max_age {
            while let Some(e) = self.frames.front() {
                if e.id > written || now.saturating_duration_since(e.at) < max_age {
                    break;
                }
                self.evict_front(now);
                evicted.written += 1;
            }
        }
        if self.bytes > self.max_bytes {
            self.drop_expired(now);
        }
        while self.bytes > self.max_bytes {
            let Some(id) = self.evict_front(now) else {
                break;
            };
            if id <= written {
                evicted.written += 1;
            } else {
                evicted.unwritten += 1;
            }
        }
        evicted
    }

    fn evict_front(&mut self, now: Instant) -> Option<u64> {
        let e = self.frames.pop_front()?;
        self.bytes -= e.cost();
        if !e.expired(now) {
            self.evicted_through = self.evicted_through.max(e.id);
        }
        Some(e.id)
    }

    fn drop_expired(&mut self, now: Instant) {
        let bytes = &mut self.bytes;
        self.frames.retain(|e| {
            let keep = !e.expired(now);
            if !keep {
                *bytes -= e.cost();
            }
            keep
        });
    }

    /// The client has every message up to `sequence_id`: forget them. An id never
    /// sent counts as the last one sent.
    pub(crate) fn ack(&mut self, sequence_id: u64) {
        let sequence_id = sequence_id.min(self.next - 1);
        self.acked = self.acked.max(sequence_id);
        while let Some(e) = self.frames.front() {
            if e.id > self.acked {
                break;
            }
            self.bytes -= e.cost();
            self.frames.pop_front();
        }
    }

    /// Whether a recovery now would be served: every frame above the client's last
    /// acknowledgement is still buffered (or past its deadline).
    pub(crate) fn replayable(&self) -> Result<(), ReplayLost> {
        if self.evicted_through > self.acked {
            return Err(ReplayLost {
                first: self.acked + 1,
                last: self.evicted_through,
            });
        }
        Ok(())
    }

    /// For a recovery: every unacknowledged frame still within its deadline, oldest
    /// first, with its sequence id; or why the replay would be incomplete.
    pub(crate) fn replay(&self, now: Instant) -> Result<Vec<(u64, Message)>, ReplayLost> {
        self.replayable()?;
        Ok(self
            .frames
            .iter()
            .filter(|e| !e.expired(now))
            .map(|e| (e.id, e.frame.clone()))
            .collect())
    }

    /// A sequencer taken over from another node: the next id to give, the client's
    /// last acknowledgement, the highest id evicted unacknowledged, and the frames still
    /// buffered there (oldest first, with their deadlines), counted as buffered `now`.
    pub(crate) fn restore(
        &mut self,
        (next, acked, evicted_through): (u64, u64, u64),
        frames: Vec<(u64, Message, Option<Instant>)>,
        now: Instant,
    ) {
        self.next = next.max(1);
        self.acked = acked.min(self.next - 1);
        self.evicted_through = evicted_through;
        self.frames.clear();
        self.bytes = 0;
        for (id, frame, deadline) in frames {
            if id <= self.acked || id >= self.next {
                continue;
            }
            let entry = Entry {
                id,
                frame,
                deadline,
                at: now,
            };
            self.bytes += entry.cost();
            self.frames.push_back(entry);
        }
    }

    /// What another node needs to take the buffer over: the first id still buffered
    /// (the next id when none is), the client's last acknowledgement and the highest id
    /// evicted unacknowledged.
    pub(crate) fn window(&self) -> (u64, u64, u64) {
        let first = self.frames.front().map_or(self.next, |e| e.id);
        (first, self.acked, self.evicted_through)
    }

    #[cfg(test)]
    /// The buffered ids, oldest first.
    pub(crate) fn buffered(&self) -> Vec<u64> {
        self.frames.iter().map(|e| e.id).collect()
    }

    #[cfg(test)]
    /// Bytes accounted to the buffer.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The last `capacity` processed `ackId`s, so a resent message is answered `Duplicate`.
#[derive(Debug)]
pub(crate) struct ProcessedAcks {
    order: VecDeque<u64>,
    set: HashSet<u64>,
    capacity: usize,
}

impl ProcessedAcks {
    /// Remembers at most `capacity` ids.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            capacity,
        }
    }

    /// Was `ack_id` processed already?
    pub(crate) fn contains(&self, ack_id: u64) -> bool {
        self.set.contains(&ack_id)
    }

    /// How many ids it remembers.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records `ack_id`, forgetting the oldest past the capacity.
    pub(crate) fn insert(&mut self, ack_id: u64) {
        if self.capacity == 0 || !self.set.insert(ack_id) {
            return;
        }
        self.order.push_back(ack_id);
        if self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
#[path = "reliable_test.rs"]
mod tests;
