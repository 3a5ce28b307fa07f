//! The state store's own thread, for an engine that blocks on the network (Redis).
//!
//! Such an engine answers a call only after a round trip, and the store's lock is held
//! across it. Run where the request arrives, that would stall the MQTT worker thread
//! (every client on it, pub/sub ones included) and, through the lock, the other workers
//! that receive state store requests, for up to the engine's timeout when its server
//! stalls. So every call that may reach the network (requests, expiry, a closed
//! connection's observations) is a job on this one thread, in a bounded FIFO queue;
//! the caller awaits the job's result. One FIFO thread keeps the order in which the
//! broker handed requests over (a client's requests are handed over one at a time, its
//! PUBACK after each answer). The embedded engines never come here: their calls are
//! short and local, and a thread hop would only add latency.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Weak;

use statehub_broker::LogLimit;
use tokio::sync::oneshot;

/// A job run on the thread, with the service.
type Job<S> = Box<dyn FnOnce(&S) + Send>;

/// The queue of the state store's thread: full, a job is refused ([`Busy`]).
pub(crate) struct Offload<S> {
    jobs: SyncSender<Job<S>>,
    /// Jobs refused because the queue was full.
    refused: AtomicU64,
}

impl<S> fmt::Debug for Offload<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Offload")
            .field("refused", &self.refused.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The thread's queue is full (or the thread is gone with its service).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the state store's queue of requests is full")]
pub(crate) struct Busy;

impl<S: Send + Sync + 'static> Offload<S> {
    /// Starts the thread; it holds the service weakly and ends with it (its queue's
    /// sender lives in the service).
    pub(crate) fn start(service: Weak<S>, capacity: usize) -> std::io::Result<Self> {
        let (jobs, queue) = sync_channel::<Job<S>>(capacity.max(1));
        std::thread::Builder::new()
            .name("state-store".into())
            .spawn(move || {
                while let Ok(job) = queue.recv() {
                    let Some(service) = service.upgrade() else {
                        return;
                    };
                    job(&service);
                }
            })?;
        Ok(Self {
            jobs,
            refused: AtomicU64::new(0),
        })
    }

    /// Queues `f`; its result arrives on the receiver. A full queue is refused,
    /// counted and logged (at most once every ten seconds).
    pub(crate) fn run<T, F>(&self, f: F) -> Result<oneshot::Receiver<T>, Busy>
    where
        T: Send + 'static,
        F: FnOnce(&S) -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job<S> = Box::new(move |service| {
            // The caller may have gone (its connection closed): nothing to tell.
            let _ = tx.send(f(service));
        });
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => {
                let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                static LOG: LogLimit = LogLimit::per_secs(10);
                if let Some(left_out) = LOG.allow() {
                    tracing::warn!(
                        refused,
                        left_out,
                        "state store queue full (state_store.network_queue); request answered 503"
                    );
                }
                Err(Busy)
            }
            Err(TrySendError::Disconnected(_)) => Err(Busy),
        }
    }

    /// Jobs refused so far because the queue was full.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc, Mutex};

    use super::*;

    #[tokio::test]
    async fn a_full_queue_refuses_and_counts_and_jobs_run_in_order() {
        let service = Arc::new(Mutex::new(Vec::new()));
        let offload = Offload::start(Arc::downgrade(&service), 1).unwrap();
        let (release, hold) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        // The thread takes this job and waits in it; the queue then holds one more.
        let first = offload
            .run(move |s: &Mutex<Vec<u32>>| {
                started_tx.send(()).unwrap();
                hold.recv().unwrap();
                s.lock().unwrap().push(1);
            })
            .unwrap();
        started.recv().unwrap();
        let second = offload
            .run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(2))
            .unwrap();
        assert_eq!(
            offload
                .run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(3))
                .err(),
            Some(Busy)
        );
        assert_eq!(offload.refused(), 1);
        release.send(()).unwrap();
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(*service.lock().unwrap(), [1, 2]);
    }
}
