//! The hub's send order lock: held for reading by a send from its broadcast to its
//! local delivery, for writing while a session taken over from another node becomes
//! reachable (and by the reader, to wait out the sends in progress), so each send
//! either reaches that session here or is applied to it by the reader (`mirror.rs`).
//!
//! A read is re-entrant on its thread. A delivery under it can take it again: a session
//! it finds gone (a slow consumer, a reliable session whose replay overflowed) is
//! removed there, and the removal publishes the end of the session's open client
//! streams (`stream::cancel_all`), a send of its own. std's `RwLock` is
//! writer-preferring: with a writer waiting between the two reads, the second one
//! would wait for the writer, which waits for the first: both forever. So a thread
//! that holds the read already takes nothing more: its outer read keeps every writer
//! out until it ends, which is all the nested send needs. Chosen over deferring the
//! removals until the lock is released because it covers every such path (a
//! delivery from a kept send, a REST send, a client's) without changing what happens
//! in which order, and it is local to the lock.
//!
//! The reads this thread holds are tracked per lock in a thread-local list; a
//! [`Sending`] is not `Send` (it cannot be held across an `.await` in a task that can
//! move between threads), so it is released on the thread that took it, innermost
//! first.

use std::cell::RefCell;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

thread_local! {
    /// The send order locks this thread holds for reading, by address.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A hub's send order lock (see the module's documentation).
#[derive(Debug, Default)]
pub(crate) struct SendOrder {
    lock: RwLock<()>,
}

/// A read of a [`SendOrder`]: the lock itself for the outermost one on its thread,
/// nothing for one taken inside it.
#[must_use]
pub(crate) struct Sending<'a> {
    /// Its type is not `Send` (a std read guard): it is released on the thread that
    /// took it, whose thread-local list names it.
    outer: Option<(usize, RwLockReadGuard<'a, ()>)>,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        if let Some((key, _)) = &self.outer {
            HELD.with(|held| held.borrow_mut().retain(|k| k != key));
        }
    }
}

impl SendOrder {
    fn key(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    fn held_here(&self) -> bool {
        let key = self.key();
        HELD.with(|held| held.borrow().contains(&key))
    }

    /// Holds the lock for reading, unless this thread already does.
    pub(crate) fn read(&self) -> Sending<'_> {
        if self.held_here() {
            return Sending { outer: None };
        }
        let guard = self.lock.read().unwrap_or_else(PoisonError::into_inner);
        HELD.with(|held| held.borrow_mut().push(self.key()));
        Sending {
            outer: Some((self.key(), guard)),
        }
    }

    /// Holds the lock for writing. Never called by a thread that holds it for reading
    /// (a takeover, a shutdown and the reader's settling run outside any send): it
    /// would wait for itself.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, ()> {
        debug_assert!(
            !self.held_here(),
            "the send order lock taken for writing inside a send"
        );
        self.lock.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a writer waits (std's lock then refuses new readers): for tests that
    /// hold it for reading and need a writer waiting behind them.
    #[cfg(test)]
    pub(crate) fn writer_waits(&self) -> bool {
        matches!(
            self.lock.try_read(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::SendOrder;

    #[test]
    fn a_read_taken_again_on_its_thread_does_not_wait_for_a_waiting_writer() {
        let order = Arc::new(SendOrder::default());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let reader = {
            let order = Arc::clone(&order);
            std::thread::spawn(move || {
                let outer = order.read();
                let writer = {
                    let order = Arc::clone(&order);
                    std::thread::spawn(move || drop(order.write()))
                };
                let deadline = Instant::now() + Duration::from_secs(30);
                while !order.writer_waits() {
                    assert!(Instant::now() < deadline, "the writer never waited");
                    std::thread::yield_now();
                }
                let inner = order.read();
                let _ = done_tx.send(());
                drop(inner);
                assert!(
                    order.writer_waits(),
                    "the outer read still holds the writer"
                );
                drop(outer);
                writer.join().unwrap();
                // Released: a read on this thread takes the lock again.
                assert!(order.read().outer.is_some());
            })
        };
        let done = done_rx.recv_timeout(Duration::from_secs(30));
        assert!(
            done.is_ok(),
            "the second read on the thread holding the first waited for the writer ({done:?})"
        );
        reader.join().unwrap();
    }

    #[test]
    fn reads_of_different_locks_are_tracked_apart() {
        let (a, b) = (SendOrder::default(), SendOrder::default());
        let ra = a.read();
        let rb = b.read();
        assert!(ra.outer.is_some() && rb.outer.is_some());
        drop(ra);
        assert!(!a.held_here() && b.held_here());
    }
}
