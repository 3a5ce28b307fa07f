//! The committer: one thread per store that turns submitted batches into durable writes.
//!
//! Submitters push batches onto a queue under a short mutex and get consecutive
//! sequence numbers. The committer sleeps until the queue is non-empty, takes
//! *everything* queued (group commit: whatever arrived while the previous write and sync
//! ran goes into the next one), writes it as one atomic batch, syncs per policy, and then
//! publishes the new durable watermark: the last sequence number it took. Waiters compare
//! their sequence number with the watermark, so completing a group costs one store and
//! one wake-up broadcast, however many tickets it completes.
//!
//! The queue is bounded in bytes by [`Shared::admit`] (see the crate docs for why
//! `submit` itself does not block). A failed write or sync sets the failure once; the
//! thread then stops and every waiter and later submitter sees the failure.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use tokio::sync::Notify;

use crate::batch::Batch;
use crate::error::StorageError;
use crate::options::SyncPolicy;
use crate::relay;

/// Where the committer writes: the journal (`journal.rs`), or a test double that fails
/// on cue.
pub(crate) trait Backend: Send + 'static {
    /// Writes the operations of `batches`, in order, as one atomic batch; when `sync`,
    /// makes it durable (fdatasync) before returning, otherwise hands it at least to the
    /// operating system.
    fn commit(&mut self, batches: Vec<Batch>, sync: bool) -> Result<(), BackendError>;
    /// Makes everything committed so far durable.
    fn sync(&mut self) -> Result<(), BackendError>;
    /// Has everything committed so far made durable soon (the interval policy's
    /// periodic sync): a backend that can sync on another thread returns at once.
    fn sync_soon(&mut self) -> Result<(), BackendError> {
        self.sync()
    }
}

/// A failure of the backend; fatal for the store.
pub(crate) type BackendError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Default)]
struct Queue {
    batches: Vec<Batch>,
    /// Sequence number of the last batch submitted (0: none yet).
    last_seq: u64,
    closing: bool,
}

/// State shared by submitters, waiters and the committer thread.
#[derive(Debug)]
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    wake_committer: Condvar,
    /// Highest sequence number whose batch (and every earlier one) is durable.
    durable: AtomicU64,
    /// Bytes submitted and not yet committed.
    pending_bytes: AtomicUsize,
    max_pending_bytes: usize,
    failure: OnceLock<StorageError>,
    /// Set once the committer has stopped after a close.
    closed: AtomicBool,
    /// Taken by the committer between changing progress and waking waiters, so a
    /// blocking waiter cannot miss a wake-up between its check and its wait.
    progress_lock: Mutex<()>,
    progress_cv: Condvar,
    progress: Notify,
}

impl Shared {
    /// Shared state of a store whose last batch (recovered at open) was `last_seq`: the
    /// next batch submitted gets `last_seq + 1`.
    pub(crate) fn new(max_pending_bytes: usize, last_seq: u64) -> Self {
        Self {
            queue: Mutex::new(Queue {
                last_seq,
                ..Queue::default()
            }),
            wake_committer: Condvar::new(),
            durable: AtomicU64::new(last_seq),
            pending_bytes: AtomicUsize::new(0),
            max_pending_bytes,
            failure: OnceLock::new(),
            closed: AtomicBool::new(false),
            progress_lock: Mutex::new(()),
            progress_cv: Condvar::new(),
            progress: Notify::new(),
        }
    }

    /// Queues `batch`; returns its sequence number. Never blocks on I/O.
    pub(crate) fn submit(&self, batch: Batch) -> Result<u64, StorageError> {
        let mut queue = self.queue.lock();
        if let Some(failure) = self.failure.get() {
            return Err(failure.clone());
        }
        if queue.closing {
            return Err(StorageError::Closed);
        }
        queue.last_seq += 1;
        let seq = queue.last_seq;
        self.pending_bytes
            .fetch_add(batch.bytes(), Ordering::Relaxed);
        let was_empty = queue.batches.is_empty();
        queue.batches.push(batch);
        drop(queue);
        if was_empty {
            self.wake_committer.notify_one();
        }
        Ok(seq)
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.queue.lock().last_seq
    }

    pub(crate) fn durable_seq(&self) -> u64 {
        self.durable.load(Ordering::Acquire)
    }

    pub(crate) fn failure(&self) -> Option<StorageError> {
        self.failure.get().cloned()
    }

    /// `Some` once `seq` is durable, the store failed or it closed without reaching it.
    fn poll(&self, seq: u64) -> Option<Result<(), StorageError>> {
        if self.durable_seq() >= seq {
            return Some(Ok(()));
        }
        if let Some(failure) = self.failure.get() {
            return Some(Err(failure.clone()));
        }
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(StorageError::Closed));
        }
        None
    }

    /// The `Notify` the committer wakes on progress (see `relay.rs` for who waits on it).
    pub(crate) fn progress(&self) -> &Notify {
        &self.progress
    }

    /// Whether the committer has stopped for good (failed or closed): no more progress.
    pub(crate) fn stopped(&self) -> bool {
        self.failure.get().is_some() || self.closed.load(Ordering::Acquire)
    }

    pub(crate) async fn wait(self: &Arc<Self>, seq: u64) -> Result<(), StorageError> {
        self.until(|| self.poll(seq)).await
    }

    /// Re-checks `ready` on every progress of the committer until it gives `Some`. The
    /// wake-ups come through this thread's relay (`relay.rs`), registered before each
    /// check so none is missed.
    async fn until<T>(self: &Arc<Self>, mut ready: impl FnMut() -> Option<T>) -> T {
        // Most calls find it ready (admit, nearly always): no relay, no registration.
        if let Some(value) = ready() {
            return value;
        }
        let relay = relay::local(self);
        let notify = relay.as_deref().unwrap_or(&self.progress);
        loop {
            let mut notified = pin!(notify.notified());
            notified.as_mut().enable();
            if let Some(value) = ready() {
                return value;
            }
            notified.await;
        }
    }

    pub(crate) fn wait_blocking(&self, seq: u64) -> Result<(), StorageError> {
        let mut guard = self.progress_lock.lock();
        loop {
            if let Some(result) = self.poll(seq) {
                return result;
            }
            self.progress_cv.wait(&mut guard);
        }
    }

    pub(crate) async fn admit(self: &Arc<Self>) {
        self.until(|| {
            let full = self.pending_bytes.load(Ordering::Relaxed) > self.max_pending_bytes;
            (!full || self.poll(u64::MAX).is_some()).then_some(())
        })
        .await;
    }

    /// Tells the committer to finish what is queued and stop.
    pub(crate) fn request_close(&self) {
        self.queue.lock().closing = true;
        self.wake_committer.notify_one();
    }

    /// Wakes every waiter after progress changed (durable watermark, failure, close).
    fn publish(&self, change: impl FnOnce()) {
        {
            let _guard = self.progress_lock.lock();
            change();
        }
        self.progress_cv.notify_all();
        self.progress.notify_waiters();
    }

    pub(crate) fn fail(&self, error: BackendError) {
        tracing::error!(error = %error, "storage commit failed; the store accepts no more writes");
        let failure = StorageError::Failed(Arc::from(error));
        self.publish(|| {
            let _ = self.failure.set(failure);
        });
    }
}

/// Below this many queued batches the committer yields once before committing.
const YIELD_BELOW: usize = 64;

/// The committer thread's body.
pub(crate) fn run(shared: Arc<Shared>, mut backend: impl Backend, policy: SyncPolicy) {
    let interval = match policy {
        SyncPolicy::Always => None,
        SyncPolicy::Interval(d) => Some(d),
    };
    // When the oldest commit not yet synced was made (interval policy only).
    let mut unsynced_since: Option<Instant> = None;
    loop {
        let (batches, last_seq, closing) = {
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
                // Woken by the first submit, the committer would often run before the
                // threads handling other requests hand over theirs (on a shared core it
                // preempts them): one commit (and one fsync) per request, and two
                // context switches each. Yielding once lets them join this commit.
                MutexGuard::unlocked(&mut queue, std::thread::yield_now);
            }
            (
                std::mem::take(&mut queue.batches),
                queue.last_seq,
                queue.closing,
            )
        };
        if !batches.is_empty() {
            let bytes: usize = batches.iter().map(Batch::bytes).sum();
            if let Err(e) = backend.commit(batches, interval.is_none()) {
                shared.fail(e);
                return;
            }
            if interval.is_some() && unsynced_since.is_none() {
                unsynced_since = Some(Instant::now());
            }
            shared.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
            shared.publish(|| shared.durable.store(last_seq, Ordering::Release));
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
                shared.fail(e);
                return;
            }
            unsynced_since = None;
        }
        if closing && shared.queue.lock().batches.is_empty() {
            shared.publish(|| shared.closed.store(true, Ordering::Release));
            return;
        }
    }
}

fn sync_deadline(interval: Option<Duration>, unsynced_since: Option<Instant>) -> Option<Instant> {
    Some(unsynced_since? + interval?)
}

#[cfg(test)]
#[path = "committer_test.rs"]
mod tests;
