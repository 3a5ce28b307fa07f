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
use std::time::Duration;

use statehub_broker::FabricError;
use tokio::sync::oneshot::{self, error::TryRecvError};

use crate::writer::Command;

/// How often a flush that gives up on a hold looks whether the writer holds.
const LOOK: Duration = Duration::from_millis(1);

/// What the writer says of its hold, and what it must write through one.
#[derive(Debug, Default)]
pub(crate) struct HoldState {
    /// The writer holds back for a slow reader.
    held: AtomicBool,
    /// Flushes queued that the writer serves through a hold.
    through: AtomicUsize,
}

impl HoldState {
    pub(crate) fn set_held(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
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
    hold: &HoldState,
    mode: Mode,
) -> Result<(), FlushError> {
    let (reply, mut done) = oneshot::channel();
    let command = Command::Flush {
        reply,
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
            Ok(()) => loop {
                match done.try_recv() {
                    Ok(result) => return result.map_err(FlushError::from),
                    Err(TryRecvError::Closed) => return Err(stopped()),
                    Err(TryRecvError::Empty) if hold.is_held() => return Err(FlushError::Held),
                    Err(TryRecvError::Empty) => std::thread::sleep(LOOK),
                }
            },
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
    use std::sync::mpsc::sync_channel;
    use std::sync::Arc;

    use super::*;

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
        let hold = HoldState::default();
        let (tx, _rx) = sync_channel(1);
        tx.send(Command::Groups).unwrap();
        let flushed = flush(&tx, &hold, Mode::UnlessHeld);
        assert!(matches!(flushed, Err(FlushError::Held)), "{flushed:?}");
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
