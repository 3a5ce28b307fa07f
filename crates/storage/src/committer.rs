//! The committer: one thread per store that turns submitted batches into durable writes.
//!
//! Submitters push batches onto a queue (`shared.rs`) under a short mutex and get
//! consecutive sequence numbers. The committer sleeps until the queue is non-empty, takes
//! *everything* queued (group commit: whatever arrived while the previous write and sync
//! ran goes into the next one), writes it as one atomic batch, syncs per policy, and then
//! publishes the new durable watermark: the last sequence number it took.
//!
//! The queue is bounded in bytes by [`Shared::admit`] (see the crate docs for why
//! `submit` itself does not block).
//!
//! # Failures: which are retried
//!
//! * A **write that finds no room** (`ENOSPC`, or `EDQUOT` for a quota) is retried, with
//!   a backoff from [`FIRST_RETRY`] doubling to [`LAST_RETRY`], until it succeeds: the
//!   committer holds the group it took, and every retry writes the same bytes at the same
//!   offset (`pwrite`), so whatever part the failed write left behind is overwritten,
//!   and nothing was reported durable. Meanwhile batches keep queueing (bounded by
//!   admission), the store reports itself stalled ([`Shared::stall_error`]), and the
//!   first successful commit ends the stall. Starting a segment (creating its file,
//!   writing its header, the manifest) is retried the same way; it is written so that
//!   doing it twice is harmless.
//! * A **failed sync** (`fsync`, `fdatasync`) is never retried, whatever its error: after
//!   one, Linux may have marked the dirty pages clean (and, on some file systems,
//!   dropped them), so a second sync can return success with the data not on disk; a
//!   retry would acknowledge writes that may be lost (PostgreSQL's "fsyncgate", 2018,
//!   ended the same way: panic and recover from the journal). Nor is any other write
//!   error (`EIO`: the device failed). Either makes the store *failed*: set once, the
//!   thread stops, every waiter and later submitter sees the failure, and only a restart
//!   (which recovers from what is on disk) brings the store back.
//! * Closing while writes wait for room makes one last attempt and then fails the store
//!   with the cause: what it held was never acknowledged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::MutexGuard;

use crate::batch::Batch;
use crate::options::SyncPolicy;
use crate::shared::Shared;

/// Where the committer writes: the journal (`journal.rs`), or a test double that fails
/// on cue.
pub(crate) trait Backend: Send + 'static {
    /// Writes the operations of `batches`, in order, as one atomic batch; when `sync`,
    /// makes it durable (fdatasync) before returning, otherwise hands it at least to the
    /// operating system. After [`BackendError::NoSpace`] the committer calls it again
    /// with the same batches.
    fn commit(&mut self, batches: &[Batch], sync: bool) -> Result<(), BackendError>;
    /// Makes everything committed so far durable.
    fn sync(&mut self) -> Result<(), BackendError>;
    /// Has everything committed so far made durable soon (the interval policy's
    /// periodic sync): a backend that can sync on another thread returns at once.
    fn sync_soon(&mut self) -> Result<(), BackendError> {
        self.sync()
    }
    /// Waits, before a commit, while the backend holds more than it may (the journal's
    /// bound, see `journal.rs`), unless `give_up` says to stop waiting.
    fn wait_for_room(&mut self, give_up: &dyn Fn() -> bool) {
        let _ = give_up;
    }
}

/// A failure of the backend.
#[derive(Debug)]
pub(crate) enum BackendError {
    /// A write found no room (`ENOSPC`, `EDQUOT`): the commit wrote nothing that trying
    /// it again does not overwrite, so the committer tries again once there is room.
    NoSpace(std::io::Error),
    /// Anything else, a failed sync first of all: fatal for the store.
    Fatal(Box<dyn std::error::Error + Send + Sync>),
}

impl From<&'static str> for BackendError {
    fn from(error: &'static str) -> Self {
        Self::Fatal(error.into())
    }
}

impl BackendError {
    /// A failed write: [`BackendError::NoSpace`] if it found no room, else fatal.
    pub(crate) fn write(error: std::io::Error) -> Self {
        if crate::files::no_space(&error) {
            Self::NoSpace(error)
        } else {
            Self::Fatal(Box::new(error))
        }
    }

    /// A failed sync: always fatal.
    pub(crate) fn sync(error: std::io::Error) -> Self {
        Self::Fatal(Box::new(crate::files::WriteError::Sync(error)))
    }
}

impl From<crate::files::WriteError> for BackendError {
    fn from(error: crate::files::WriteError) -> Self {
        match error {
            crate::files::WriteError::Write(e) => Self::write(e),
            crate::files::WriteError::Sync(e) => Self::sync(e),
        }
    }
}

/// Below this many queued batches the committer yields once before committing.
const YIELD_BELOW: usize = 64;
/// The first wait before a write that found no room is tried again.
pub(crate) const FIRST_RETRY: Duration = Duration::from_millis(10);
/// The longest: once space is back, writes go on within about this.
pub(crate) const LAST_RETRY: Duration = Duration::from_secs(1);

/// The committer thread's body.
pub(crate) fn run(shared: Arc<Shared>, mut backend: impl Backend, policy: SyncPolicy) {
    let interval = match policy {
        SyncPolicy::Always => None,
        SyncPolicy::Interval(d) => Some(d),
    };
    // When the oldest commit not yet synced was made (interval policy only).
    let mut unsynced_since: Option<Instant> = None;
    loop {
        let (batches, last_seq, closing) = take(&shared, interval, unsynced_since);
        if !batches.is_empty() {
            backend.wait_for_room(&|| shared.closing());
            let bytes: usize = batches.iter().map(Batch::bytes).sum();
            if let Err(e) = commit(&shared, &mut backend, batches, interval.is_none()) {
                shared.fail(e);
                return;
            }
            if interval.is_some() && unsynced_since.is_none() {
                unsynced_since = Some(Instant::now());
            }
            // Before the watermark moves: whoever sees these batches durable sees writes
            // taken again.
            shared.unstall();
            shared.committed(bytes, last_seq);
        }
        let sync_due = sync_deadline(interval, unsynced_since)
            .is_some_and(|deadline| closing || deadline <= Instant::now());
        if sync_due {
            // Closing, the sync must be done before the store says it closed.
            let synced = if closing {
                backend.sync()
            } else {
                backend.sync_soon()
            };
            if let Err(e) = synced {
                shared.fail(fatal(e));
                return;
            }
            unsynced_since = None;
        }
        if closing && shared.queue.lock().batches.is_empty() {
            shared.set_closed();
            return;
        }
    }
}

/// Waits for batches (or for the interval's sync to be due, or a close) and takes every
/// batch queued: the group, the last sequence number in it, and whether closing.
fn take(
    shared: &Shared,
    interval: Option<Duration>,
    unsynced_since: Option<Instant>,
) -> (Vec<Batch>, u64, bool) {
    let mut queue = shared.queue.lock();
    while queue.batches.is_empty() && !queue.closing {
        match sync_deadline(interval, unsynced_since) {
            Some(deadline) if deadline <= Instant::now() => break,
            Some(deadline) => {
                shared.wake_committer.wait_until(&mut queue, deadline);
            }
            None => shared.wake_committer.wait(&mut queue),
        }
    }
    if !queue.batches.is_empty() && queue.batches.len() < YIELD_BELOW && !queue.closing {
        // Woken by the first submit, the committer would often run before the threads
        // handling other requests hand over theirs (on a shared core it preempts them):
        // one commit (and one fsync) per request, and two context switches each.
        // Yielding once lets them join this commit.
        MutexGuard::unlocked(&mut queue, std::thread::yield_now);
    }
    (
        std::mem::take(&mut queue.batches),
        queue.last_seq,
        queue.closing,
    )
}

/// Commits `batches`, trying again while a write finds no room (see the module docs);
/// `Err` is fatal for the store.
fn commit(
    shared: &Shared,
    backend: &mut impl Backend,
    batches: Vec<Batch>,
    sync: bool,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let first = backend.commit(&batches, sync);
    if !matches!(first, Err(BackendError::NoSpace(_))) {
        return first.map_err(fatal);
    }
    // Shared while it waits, so that callers can tell which keys wait with it.
    let batches = Arc::new(batches);
    let mut attempt = first;
    let mut delay = FIRST_RETRY;
    loop {
        let closing = shared.closing();
        match attempt {
            Ok(()) => return Ok(()),
            Err(BackendError::NoSpace(e)) if closing => return Err(Box::new(e)),
            Err(BackendError::NoSpace(e)) => shared.stall(e, &batches),
            Err(BackendError::Fatal(e)) => return Err(e),
        }
        let deadline = Instant::now() + delay;
        let mut queue = shared.queue.lock();
        while !queue.closing && Instant::now() < deadline {
            shared.wake_committer.wait_until(&mut queue, deadline);
        }
        drop(queue);
        delay = (delay * 2).min(LAST_RETRY);
        attempt = backend.commit(&batches, sync);
    }
}

fn fatal(error: BackendError) -> Box<dyn std::error::Error + Send + Sync> {
    match error {
        BackendError::NoSpace(e) => Box::new(e),
        BackendError::Fatal(e) => e,
    }
}

fn sync_deadline(interval: Option<Duration>, unsynced_since: Option<Instant>) -> Option<Instant> {
    Some(unsynced_since? + interval?)
}

#[cfg(test)]
#[path = "committer_test.rs"]
mod tests;
