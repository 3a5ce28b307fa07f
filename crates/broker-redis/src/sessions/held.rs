//! Write-behind for queued messages, as the data directory's session store does it
//! (`broker-durable`'s `sessions/mod.rs`). Most messages queued for a connected
//! session are acknowledged within a round trip (a state store reply, say): writing
//! each to Redis and then its deletion would triple the session store's Redis work
//! for nothing. So a message queued outside a group is held in memory; its
//! acknowledgement cancels it with no Redis write, and it is written, in the order of
//! the changes recorded after it:
//!
//! * when anyone asks for a barrier (a publisher awaiting its PUBACK asks at once, so
//!   no promised message waits and none is lost with the node);
//! * when [`STALE`] has passed (a flusher thread looks every [`STALE`]), or
//!   [`MAX_HELD`] messages are held;
//! * before its session is released to another node (the release is fenced in Redis:
//!   a message written after it would be refused), and dropped with its session's end.
//!
//! Messages applied from the stream are recorded in the reader's group, never held, so
//! the reader's position mark still covers them; those replayed into a session that
//! moved here are handed to the writer as soon as the replay ends (`fetch::install`). What a node crash can lose is only a
//! message nobody was promised anything about (a service's reply or notification
//! queued in the last [`STALE`]), exactly as on the data directory.

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use statehub_broker::Message;

use super::{Inner, Op, State};

/// How long a queued message may be held unwritten.
pub(crate) const STALE: Duration = Duration::from_millis(50);
/// How many queued messages may be held unwritten at once.
pub(crate) const MAX_HELD: usize = 4096;

/// A queued message not written yet: its record, and its body (still referred to).
#[derive(Debug)]
pub(super) struct Held {
    pub record: Vec<u8>,
    pub msg: Arc<Message>,
}

/// Starts the thread that writes held messages once [`STALE`]; it ends with the store.
pub(super) fn start_flusher(inner: &Arc<Inner>) -> std::io::Result<()> {
    let weak: Weak<Inner> = Arc::downgrade(inner);
    std::thread::Builder::new()
        .name("mqtt-session-flusher".into())
        .spawn(move || loop {
            std::thread::sleep(STALE);
            let Some(inner) = weak.upgrade() else { return };
            inner.flush_stale();
        })
        .map(drop)
}

impl Inner {
    /// Holds a queued message (key: incarnation, sequence number).
    pub(super) fn hold(state: &mut State, key: (u64, u64), held: Held) {
        state.held.insert(key, held);
        state.held_since.get_or_insert_with(Instant::now);
    }

    /// Writes the held messages if the oldest has waited [`STALE`] or too many are held.
    pub(super) fn flush_due(&self, state: &mut State) {
        let due = state.held_since.is_some_and(|t| t.elapsed() >= STALE);
        if due || state.held.len() >= MAX_HELD {
            self.flush_held(state);
        }
    }

    /// [`Inner::flush_held`] under the lock.
    pub(super) fn write_held(&self) {
        self.flush_held(&mut self.state.lock());
    }

    /// [`Inner::flush_due`] under the lock.
    pub(super) fn flush_stale(&self) {
        self.flush_due(&mut self.state.lock());
    }

    /// Hands every held message to the writer now, in (incarnation, sequence) order,
    /// ahead of any change pushed after (into the open group if there is one).
    pub(super) fn flush_held(&self, state: &mut State) {
        state.held_since = None;
        if state.held.is_empty() {
            return;
        }
        let mut held: Vec<_> = state.held.drain().collect();
        held.sort_unstable_by_key(|(key, _)| *key);
        // A body sent with records written earlier may have left Redis with their
        // deletion while these were held: each body's first record here brings its
        // data again (Redis keeps the copy it has).
        let mut bodies = HashSet::new();
        let ops: Vec<Op> = held
            .into_iter()
            .filter_map(|((incarnation, seq), held)| {
                let first = bodies.insert(Arc::as_ptr(&held.msg));
                Self::message_op(state, (incarnation, seq), &held.msg, held.record, first)
            })
            .collect();
        self.push(state, ops);
    }
}
