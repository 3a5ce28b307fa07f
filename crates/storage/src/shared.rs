//! What submitters, waiters and the committer thread share: the queue of submitted
//! batches, the durable watermark, the bound on queued bytes, and the store's condition
//! (healthy, waiting for disk space, failed, closed).
//!
//! Waiters compare their sequence number with the watermark, so completing a group
//! costs one store and one wake-up broadcast, however many tickets it completes.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

use crate::batch::Batch;
use crate::error::StorageError;
use crate::relay;

#[derive(Debug, Default)]
pub(crate) struct Queue {
    pub(crate) batches: Vec<Batch>,
    /// Sequence number of the last batch submitted (0: none yet).
    pub(crate) last_seq: u64,
    pub(crate) closing: bool,
}

/// Why writes are waiting: the write that found no room, since when, and the group of
/// batches the committer is trying to write.
#[derive(Debug, Clone)]
struct Stall {
    since: Instant,
    cause: Arc<std::io::Error>,
    group: Arc<Vec<Batch>>,
}

/// State shared by submitters, waiters and the committer thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) queue: Mutex<Queue>,
    pub(crate) wake_committer: Condvar,
    /// Highest sequence number whose batch (and every earlier one) is durable.
    durable: AtomicU64,
    /// Bytes submitted and not yet committed.
    pending_bytes: AtomicUsize,
    max_pending_bytes: usize,
    failure: OnceLock<StorageError>,
    /// Set once the committer has stopped after a close.
    closed: AtomicBool,
    /// Whether writes wait for disk space (read on every admission: an atomic).
    stalled: AtomicBool,
    stall: Mutex<Option<Stall>>,
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
            stalled: AtomicBool::new(false),
            stall: Mutex::new(None),
            progress_lock: Mutex::new(()),
            progress_cv: Condvar::new(),
            progress: Notify::new(),
        }
    }

    /// Queues `batch`; returns its sequence number. Never blocks on I/O, and accepts
    /// batches while writes wait for disk space (they are written once there is room).
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

    /// Waits while more than the bound of bytes is queued. Returns at once if the store
    /// failed (the submit will say so) or writes wait for disk space (callers are to
    /// refuse new writes then, see [`Shared::stall_error`], and must not wait).
    pub(crate) async fn admit(self: &Arc<Self>) {
        self.until(|| self.admits().then_some(())).await;
    }

    /// Whether [`Shared::admit`] would return at once.
    pub(crate) fn admits(&self) -> bool {
        let full = self.pending_bytes.load(Ordering::Relaxed) > self.max_pending_bytes;
        !full || self.is_stalled() || self.poll(u64::MAX).is_some()
    }

    /// Whether writes wait for disk space.
    pub(crate) fn is_stalled(&self) -> bool {
        self.stalled.load(Ordering::Acquire)
    }

    /// [`StorageError::NoSpace`] while writes wait for disk space.
    pub(crate) fn stall_error(&self) -> Option<StorageError> {
        if !self.is_stalled() {
            return None;
        }
        let stall = self.stall.lock();
        let stall = stall.as_ref()?;
        Some(StorageError::NoSpace {
            waiting: stall.since.elapsed(),
            cause: stall.cause.clone(),
        })
    }

    /// While writes wait for disk space: the keys of table `table` that batches not yet
    /// durable write (the group being retried and everything queued behind it). Decodes
    /// every such batch; `None` when writes do not wait.
    pub(crate) fn pending_keys(&self, table: u16) -> Option<Vec<bytes::Bytes>> {
        let group = self.stall.lock().as_ref()?.group.clone();
        let queue = self.queue.lock();
        let keys = group
            .iter()
            .chain(queue.batches.iter())
            .flat_map(|batch| crate::format::ops(&batch.ops))
            .filter_map(Result::ok)
            .filter(|op| op.table == table)
            .map(|op| bytes::Bytes::copy_from_slice(op.key))
            .collect();
        Some(keys)
    }

    /// Resolves once writes no longer wait for disk space (or the store stopped).
    pub(crate) async fn unstalled(self: &Arc<Self>) {
        self.until(|| (!self.is_stalled() || self.stopped()).then_some(()))
            .await;
    }

    /// A commit of `group` found no room: writes wait from now on (logged once, when they
    /// start).
    pub(crate) fn stall(&self, cause: std::io::Error, group: &Arc<Vec<Batch>>) {
        let mut stall = self.stall.lock();
        if stall.is_none() {
            tracing::error!(error = %cause, "storage: no disk space; writes wait and are retried until there is room again (reads go on)");
            *stall = Some(Stall {
                since: Instant::now(),
                cause: Arc::new(cause),
                group: group.clone(),
            });
            drop(stall);
            self.publish(|| self.stalled.store(true, Ordering::Release));
        }
    }

    /// A commit succeeded: if writes were waiting for space, they go on (logged once).
    pub(crate) fn unstall(&self) {
        if !self.is_stalled() {
            return;
        }
        if let Some(stall) = self.stall.lock().take() {
            tracing::warn!(
                waited_ms = stall.since.elapsed().as_millis() as u64,
                "storage: disk space is back; writes go on"
            );
        }
        self.publish(|| self.stalled.store(false, Ordering::Release));
    }

    /// `bytes` of batches submitted earlier were committed, through batch `seq`.
    pub(crate) fn committed(&self, bytes: usize, seq: u64) {
        self.pending_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.publish(|| self.durable.store(seq, Ordering::Release));
    }

    /// Tells the committer to finish what is queued and stop.
    pub(crate) fn request_close(&self) {
        self.queue.lock().closing = true;
        self.wake_committer.notify_one();
    }

    /// Whether a close was asked for.
    pub(crate) fn closing(&self) -> bool {
        self.queue.lock().closing
    }

    /// The committer stopped after a close.
    pub(crate) fn set_closed(&self) {
        self.publish(|| self.closed.store(true, Ordering::Release));
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

    /// The store failed for good: logged once, every waiter and later submitter gets it.
    pub(crate) fn fail(&self, error: Box<dyn std::error::Error + Send + Sync>) {
        tracing::error!(error = %error, "storage commit failed; the store accepts no more writes");
        let failure = StorageError::Failed(Arc::from(error));
        self.publish(|| {
            let _ = self.failure.set(failure);
            self.stalled.store(false, Ordering::Release);
        });
    }
}
