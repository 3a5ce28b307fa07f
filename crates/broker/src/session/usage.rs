//! What every session's queue holds together, against the broker-wide bounds
//! (`max_total_queued_messages`, `max_total_queued_bytes`).
//!
//! A delivery is counted from the moment a session takes it (queued or restored) until
//! it leaves the session: acknowledged, expired, discarded, handed to another session,
//! or dropped with the ended session. Moving from the queue into flight changes nothing.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Messages and bytes queued across every session.
#[derive(Debug)]
pub(crate) struct Usage {
    messages: AtomicUsize,
    bytes: AtomicUsize,
    max_messages: usize,
    max_bytes: usize,
}

impl Usage {
    pub fn new(max_messages: usize, max_bytes: usize) -> Usage {
        Usage {
            messages: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max_messages,
            max_bytes,
        }
    }

    /// Takes room for one message of `weight` bytes; false, with nothing taken, if
    /// that would pass a bound.
    pub fn try_take(&self, weight: usize) -> bool {
        let messages = self.messages.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = self.bytes.fetch_add(weight, Ordering::Relaxed) + weight;
        if messages > self.max_messages || bytes > self.max_bytes {
            self.give(1, weight);
            return false;
        }
        true
    }

    /// Counts one message of `weight` bytes whatever the bounds say (one a session
    /// keeps although the bounds are reached, see `Session::enqueue`).
    pub fn take(&self, weight: usize) {
        self.messages.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(weight, Ordering::Relaxed);
    }

    /// `messages` messages of `bytes` bytes in all left their sessions.
    pub fn give(&self, messages: usize, bytes: usize) {
        self.messages.fetch_sub(messages, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// (messages, bytes) queued now.
    pub fn get(&self) -> (usize, usize) {
        (
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_taken_up_to_each_bound_and_given_back() {
        let usage = Usage::new(3, 100);
        assert!(usage.try_take(40));
        assert!(usage.try_take(40));
        assert!(!usage.try_take(40), "bytes bound");
        assert_eq!(usage.get(), (2, 80));
        assert!(usage.try_take(20));
        assert!(!usage.try_take(0), "messages bound");
        usage.give(2, 60);
        assert_eq!(usage.get(), (1, 40));
        usage.take(1000);
        assert_eq!(usage.get(), (2, 1040));
    }
}
