//! Waiting until this node's stream writer appended everything handed to it, without
//! ever making this node's reader wait for a writer that holds back for a slow
//! reader (`lag.rs`).
//!
//! A writer holds while a live node's reader (its own included) is past the lag
//! limit; if that reader could in turn wait for its own held writer, two nodes (or a
//! node and itself) would wait for each other until a position lapsed. A reader waits for its writer in two places, and neither
//! waits for a hold:
//! * a hand-off's flush on the reader thread ([`Mode::UnlessHeld`]) gives up once the
//!   writer holds: the session is then released without a bound, and the next node
//!   tells the messages it has from the others by their origins
//!   (`sessions/origins.rs`), as when Redis is out of reach;
//! * an install flushes under the reader's cut, so the reader waits for it: it first
//!   flushes without the cut ([`Mode::Wait`], the client's CONNECT waits), then under
//!   the cut with [`Mode::ThroughHold`], which the writer serves through a hold: only
//!   what this node routed between the two goes past the limit.
//!
//! So a reader's progress never depends on its own writer's hold, and every hold ends
//! once the readers it waits for caught up: no two nodes wait for each other.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use statehub_broker::FabricError;
use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::writer::Command;

type Answer = Result<(), FabricError>;

/// What the writer says of its hold, and what it must write through one.
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    /// The writer holds back for a slow reader.
    held: AtomicBool,
    /// Flushes queued that the writer serves through a hold.
    through: AtomicUsize,
    /// Flushes waiting with [`Mode::UnlessHeld`]: woken through `changed` once the
    /// writer holds or answers (or drops) a flush. A waiter looks at both under this
    /// lock, and a notifier takes it after changing either, so no wake-up is lost.
    waiting: Mutex<usize>,
    changed: Condvar,
}

impl HoldState {
    pub(crate) fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
        if held {
            self.wake();
        }
    }

    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// A flush the writer must serve through a hold is queued.
    pub(crate) fn urgent(&self) -> bool {
        self.through.load(Ordering::SeqCst) > 0
    }

    /// The writer answered a flush queued with [`Mode::ThroughHold`].
    pub(crate) fn served(&self) {
        self.through.fetch_sub(1, Ordering::SeqCst);
    }

    /// Wakes the flushes waiting with [`Mode::UnlessHeld`], after what they wait for
    /// changed.
    fn wake(&self) {
        let waiting = self.waiting.lock();
        if *waiting > 0 {
            self.changed.notify_all();
        }
    }

    /// Waits until the writer answers `done` (or drops it), or holds.
    fn unless_held(&self, done: &mut oneshot::Receiver<Answer>) -> Result<(), FlushError> {
        let mut waiting = self.waiting.lock();
        loop {
            match done.try_recv() {
                Ok(result) => return result.map_err(FlushError::from),
                Err(TryRecvError::Closed) => return Err(stopped()),
                Err(TryRecvError::Empty) if self.is_held() => return Err(FlushError::Held),
                Err(TryRecvError::Empty) => {
                    *waiting += 1;
                    self.changed.wait(&mut waiting);
                    *waiting -= 1;
                }
            }
        }
    }

    #[cfg(test)]
    fn waiters(&self) -> usize {
        *self.waiting.lock()
    }
}

/// The writer's answer to a flush. Sent, or dropped unsent (the writer stopped), it
/// wakes a flush waiting with [`Mode::UnlessHeld`].
#[derive(Debug)]
pub(crate) struct FlushReply {
    reply: Option<oneshot::Sender<Answer>>,
    hold: Arc<HoldState>,
}

impl FlushReply {
    /// Answers the flush; `Err(result)` if nobody waits for it any more.
    pub(crate) fn send(mut self, result: Answer) -> Result<(), Answer> {
        match self.reply.take() {
            Some(reply) => reply.send(result),
            None => Err(result),
        }
    }
}

impl Drop for FlushReply {
    fn drop(&mut self) {
        self.reply = None;
        self.hold.wake();
    }
}

/// How a flush treats a writer that holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Waits as long as the writer holds.
    Wait,
    /// Gives up ([`FlushError::Held`]) once the writer holds or its queue is full.
    UnlessHeld,
    /// The writer appends what is queued before the flush through a hold.
    ThroughHold,
}

/// Why a flush did not end with everything appended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FlushError {
    #[error("this node's stream writer holds back for a slow reader elsewhere")]
    Held,
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

fn stopped() -> FlushError {
    FlushError::Fabric(FabricError::Unavailable("stopped".into()))
}

/// Waits until the writer behind `writer` appended everything handed to it so far.
pub(crate) fn flush(
    writer: &SyncSender<Command>,
    hold: &Arc<HoldState>,
    mode: Mode,
) -> Result<(), FlushError> {
    let (reply, mut done) = oneshot::channel();
    let command = Command::Flush {
        reply: FlushReply {
            reply: Some(reply),
            hold: hold.clone(),
        },
        through_hold: mode == Mode::ThroughHold,
    };
    match mode {
        Mode::Wait => writer.send(command).map_err(|_| stopped())?,
        Mode::ThroughHold => {
            // Counted first, so that a writer holding now stops holding to reach it.
            hold.through.fetch_add(1, Ordering::SeqCst);
            if writer.send(command).is_err() {
                hold.served();
                return Err(stopped());
            }
        }
        Mode::UnlessHeld => match writer.try_send(command) {
            Ok(()) => return hold.unless_held(&mut done),
            Err(TrySendError::Full(_)) => return Err(FlushError::Held),
            Err(TrySendError::Disconnected(_)) => return Err(stopped()),
        },
    }
    match done.blocking_recv() {
        Ok(result) => result.map_err(FlushError::from),
        Err(_) => Err(stopped()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, sync_channel, Receiver};
    use std::time::Duration;

    use super::*;

    /// Far longer than any wake-up takes, even on a loaded machine: a waiter that is not
    /// woken waits for ever.
    const BOUND: Duration = Duration::from_secs(30);

    /// A writer that takes one command, then does `then` with it and the hold.
    fn writer(
        hold: &Arc<HoldState>,
        then: impl FnOnce(Command, &HoldState) + Send + 'static,
    ) -> (SyncSender<Command>, std::thread::JoinHandle<()>) {
        let (tx, rx) = sync_channel(1);
        let hold = hold.clone();
        let thread = std::thread::spawn(move || {
            if let Ok(command) = rx.recv() {
                then(command, &hold);
            }
        });
        (tx, thread)
    }

    #[test]
    fn a_flush_that_gives_up_on_a_hold_returns_once_the_writer_holds() {
        let hold = Arc::new(HoldState::default());
        let (kept, keep) = sync_channel(1);
        let (tx, thread) = writer(&hold, move |command, hold| {
            hold.set_held(true);
            // Never answered while held.
            let _ = kept.send(command);
        });
        let flushed = flush(&tx, &hold, Mode::UnlessHeld);
        assert!(matches!(flushed, Err(FlushError::Held)), "{flushed:?}");
        thread.join().unwrap();
        drop(keep);
    }

    #[test]
    fn a_flush_that_gives_up_on_a_hold_does_not_wait_for_room_in_the_queue() {
        let hold = Arc::new(HoldState::default());
        let (tx, _rx) = sync_channel(1);
        tx.send(Command::Groups).unwrap();
        let flushed = flush(&tx, &hold, Mode::UnlessHeld);
        assert!(matches!(flushed, Err(FlushError::Held)), "{flushed:?}");
    }

    /// Runs a flush that gives up on a hold on its own thread; its result comes on the
    /// returned channel.
    fn waiting_flush(
        tx: SyncSender<Command>,
        hold: &Arc<HoldState>,
    ) -> Receiver<Result<(), FlushError>> {
        let (result, done) = channel();
        let hold = hold.clone();
        std::thread::spawn(move || {
            let _ = result.send(flush(&tx, &hold, Mode::UnlessHeld));
        });
        done
    }

    /// A writer that keeps the flush it takes, and hands it to the test once the flush
    /// waits for it (nothing more will change unless the test does something).
    fn kept_until_waiting(hold: &Arc<HoldState>) -> (SyncSender<Command>, Receiver<Command>) {
        let (kept, keep) = channel();
        let (tx, _thread) = writer(hold, move |command, hold| {
            while hold.waiters() == 0 {
                std::thread::yield_now();
            }
            let _ = kept.send(command);
        });
        (tx, keep)
    }

    #[test]
    fn a_waiting_flush_is_woken_once_the_writer_holds() {
        let hold = Arc::new(HoldState::default());
        let (tx, keep) = kept_until_waiting(&hold);
        let done = waiting_flush(tx, &hold);
        let _command = keep.recv().unwrap();
        assert!(done.try_recv().is_err(), "still waiting");
        hold.set_held(true);
        let flushed = done
            .recv_timeout(BOUND)
            .expect("woken when the writer holds");
        assert!(matches!(flushed, Err(FlushError::Held)), "{flushed:?}");
    }

    #[test]
    fn a_waiting_flush_is_woken_once_the_writer_answers() {
        let hold = Arc::new(HoldState::default());
        let (tx, keep) = kept_until_waiting(&hold);
        let done = waiting_flush(tx, &hold);
        let Command::Flush { reply, .. } = keep.recv().unwrap() else {
            panic!("expected a flush");
        };
        assert!(done.try_recv().is_err(), "still waiting");
        reply.send(Ok(())).unwrap();
        let flushed = done.recv_timeout(BOUND).expect("woken by the answer");
        assert!(flushed.is_ok(), "{flushed:?}");
    }

    #[test]
    fn a_waiting_flush_is_woken_when_the_writer_drops_it() {
        let hold = Arc::new(HoldState::default());
        let (tx, keep) = kept_until_waiting(&hold);
        let done = waiting_flush(tx, &hold);
        drop(keep.recv().unwrap());
        let flushed = done.recv_timeout(BOUND).expect("woken by the drop");
        assert!(matches!(flushed, Err(FlushError::Fabric(_))), "{flushed:?}");
    }

    #[test]
    fn a_flush_through_a_hold_is_urgent_until_the_writer_served_it() {
        let hold = Arc::new(HoldState::default());
        let (tx, thread) = writer(&hold, |command, hold| {
            assert!(hold.urgent(), "a holding writer stops holding to reach it");
            let Command::Flush {
                reply,
                through_hold: true,
            } = command
            else {
                panic!("expected a flush through the hold, got {command:?}");
            };
            let _ = reply.send(Ok(()));
            hold.served();
        });
        flush(&tx, &hold, Mode::ThroughHold).unwrap();
        thread.join().unwrap();
        assert!(!hold.urgent());
    }
}
