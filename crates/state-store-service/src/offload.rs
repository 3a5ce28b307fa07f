//! A thread of the state store's own, for an engine that blocks on the network (Redis).
//!
//! Such an engine answers a call only after a round trip, and a machine's lock is held
//! across it. Run where the request arrives, that would stall the MQTT worker thread
//! (every client on it, pub/sub ones included) and, through the lock, the other workers
//! that receive state store requests, for up to the engine's timeout when its server
//! stalls. So every call that may reach the network (requests, expiry, a closed
//! connection's observations) is a job on a thread of the store's, in a bounded FIFO
//! queue; the caller awaits the job's result. There is one such thread per machine
//! (`shards.rs`), and a client's requests all go to its machine's: one FIFO thread per
//! client keeps the order in which the broker handed its requests over (with `--redis` a
//! connection hands each request over as it reads it, several of one client may be
//! queued at once, and they still run in that order). The embedded
//! engines never come here: their calls are short and local, and a thread hop would
//! only add latency.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use statehub_broker::LogLimit;
use tokio::sync::oneshot;

/// Most requests the thread takes together ([`Batches::run_batch`]): a pipeline to
/// Redis carries at most this many scripts.
pub(crate) const MAX_BATCH: usize = 64;

/// A service whose requests the thread takes several at a time: those queued back to
/// back, with no other job between them, up to [`MAX_BATCH`], in the order queued.
pub(crate) trait Batches<I> {
    /// Runs `items`, in order, as if one after another.
    fn run_batch(&self, items: Vec<I>);
}

/// A job run on the thread, with the service.
type Call<S> = Box<dyn FnOnce(&S) + Send>;

/// What the thread's queue holds.
enum Job<S, I> {
    /// A job of its own.
    Call(Call<S>),
    /// A request, taken with those queued right behind it.
    Item(I),
}

/// The queue of the state store's thread: full, a job is refused ([`Busy`]).
pub(crate) struct Offload<S, I> {
    jobs: SyncSender<Job<S, I>>,
    /// Jobs that must run and found the queue full ([`Offload::run_later`]), in order.
    /// While any waits here no job is queued, so none overtakes them; the thread runs
    /// them once it has run every job queued before them. Only closed connections come
    /// here, so it holds at most one job per connection.
    later: Arc<Mutex<VecDeque<Job<S, I>>>>,
    /// Jobs refused because the queue was full.
    refused: AtomicU64,
}

impl<S, I> fmt::Debug for Offload<S, I> {
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

impl<S: Batches<I> + Send + Sync + 'static, I: Send + 'static> Offload<S, I> {
    /// Starts the thread; it holds the service weakly and ends with it (its queue's
    /// sender lives in the service). `index` names the thread (one per shard).
    pub(crate) fn start(service: Weak<S>, capacity: usize, index: usize) -> std::io::Result<Self> {
        let (jobs, queue) = sync_channel::<Job<S, I>>(capacity.max(1));
        let later = Arc::new(Mutex::new(VecDeque::new()));
        std::thread::Builder::new()
            .name(format!("state-store-{index}"))
            .spawn({
                let later = later.clone();
                move || serve(&service, &queue, &later)
            })?;
        Ok(Self {
            jobs,
            later,
            refused: AtomicU64::new(0),
        })
    }

    /// Queues `f` to run on the thread, even when the queue is full: then it waits
    /// apart, after every job queued before it, and no new job is queued until it ran.
    /// Never blocks the caller.
    pub(crate) fn run_later(&self, f: impl FnOnce(&S) + Send + 'static) {
        let job = Job::Call(Box::new(f));
        let mut later = self.later.lock();
        let job = match later.is_empty() {
            true => match self.jobs.try_send(job) {
                Err(TrySendError::Full(job)) => job,
                // Queued; or the thread is gone with its service: nothing to do.
                Ok(()) | Err(TrySendError::Disconnected(_)) => return,
            },
            false => job,
        };
        later.push_back(job);
        drop(later);
        // Wakes the thread if it waits on an empty queue; a full queue has it busy,
        // and it looks here before it waits again.
        let _ = self.jobs.try_send(Job::Call(Box::new(|_| {})));
    }

    /// Queues `f`; its result arrives on the receiver. A full queue is refused,
    /// counted and logged (at most once every ten seconds).
    pub(crate) fn run<T, F>(&self, f: F) -> Result<oneshot::Receiver<T>, Busy>
    where
        T: Send + 'static,
        F: FnOnce(&S) -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Call<S> = Box::new(move |service| {
            // The caller may have gone (its connection closed): nothing to tell.
            let _ = tx.send(f(service));
        });
        self.queue(Job::Call(job))?;
        Ok(rx)
    }

    /// Queues a request, to run with those queued right behind it
    /// ([`Batches::run_batch`]). A full queue is refused, as by [`Offload::run`].
    pub(crate) fn submit(&self, item: I) -> Result<(), Busy> {
        self.queue(Job::Item(item))
    }

    fn queue(&self, job: Job<S, I>) -> Result<(), Busy> {
        let later = self.later.lock();
        let queued = match later.is_empty() {
            true => self.jobs.try_send(job),
            false => Err(TrySendError::Full(job)),
        };
        drop(later);
        match queued {
            Ok(()) => Ok(()),
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

/// The thread's loop: each job in order, a request with those queued right behind it.
fn serve<S: Batches<I>, I>(
    service: &Weak<S>,
    queue: &Receiver<Job<S, I>>,
    later: &Mutex<VecDeque<Job<S, I>>>,
) {
    let mut next = None;
    while let Some(job) = next.take().or_else(|| next_job(queue, later)) {
        let Some(service) = service.upgrade() else {
            return;
        };
        match job {
            Job::Call(call) => call(&service),
            Job::Item(item) => {
                let mut items = vec![item];
                while items.len() < MAX_BATCH {
                    match queue.try_recv() {
                        Ok(Job::Item(item)) => items.push(item),
                        Ok(call) => {
                            next = Some(call);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                service.run_batch(items);
            }
        }
    }
}

/// The thread's next job: the queue's, or once it is empty the first that waits apart
/// ([`Offload::run_later`]); `None` when the service is gone.
fn next_job<S, I>(
    queue: &Receiver<Job<S, I>>,
    later: &Mutex<VecDeque<Job<S, I>>>,
) -> Option<Job<S, I>> {
    match queue.try_recv() {
        Ok(job) => Some(job),
        Err(TryRecvError::Disconnected) => None,
        Err(TryRecvError::Empty) => {
            // Not in the match below: its lock would be held while waiting.
            let waiting = later.lock().pop_front();
            waiting.or_else(|| queue.recv().ok())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc, Mutex};

    use super::*;

    /// A batch of n items is pushed as `100 + n`, then the items.
    impl Batches<u32> for Mutex<Vec<u32>> {
        fn run_batch(&self, items: Vec<u32>) {
            let mut pushed = self.lock().unwrap();
            pushed.push(100 + items.len() as u32);
            pushed.extend(items);
        }
    }

    type Service = Arc<Mutex<Vec<u32>>>;
    type Done = oneshot::Receiver<()>;
    /// The service, its queue, the sender that lets job 1 end, and jobs 1 and 2.
    type Held = (
        Service,
        Offload<Mutex<Vec<u32>>, u32>,
        mpsc::Sender<()>,
        Done,
        Done,
    );

    /// A one-job queue whose thread is inside job 1 (it pushes 1 once `release` sends)
    /// with job 2 queued behind it: the queue is full.
    fn busy() -> Held {
        let service = Arc::new(Mutex::new(Vec::new()));
        let offload = Offload::start(Arc::downgrade(&service), 1, 0).unwrap();
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
        (service, offload, release, first, second)
    }

    #[tokio::test]
    async fn a_full_queue_refuses_and_counts_and_jobs_run_in_order() {
        let (service, offload, release, first, second) = busy();
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

    #[tokio::test]
    async fn a_job_that_must_run_waits_apart_without_blocking_and_keeps_its_place() {
        let (service, offload, release, first, second) = busy();
        // The queue is full: this returns at once and runs after the queued jobs.
        offload.run_later(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(3));
        // While it waits, nothing overtakes it.
        assert_eq!(
            offload
                .run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(4))
                .err(),
            Some(Busy)
        );
        release.send(()).unwrap();
        first.await.unwrap();
        second.await.unwrap();
        let after = loop {
            if let Ok(after) = offload.run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(5)) {
                break after;
            }
            tokio::task::yield_now().await;
        };
        after.await.unwrap();
        assert_eq!(*service.lock().unwrap(), [1, 2, 3, 5]);
    }

    #[tokio::test]
    async fn requests_queued_back_to_back_run_together_and_no_job_is_overtaken() {
        let service = Arc::new(Mutex::new(Vec::new()));
        let offload = Offload::start(Arc::downgrade(&service), 8, 0).unwrap();
        let (release, hold) = mpsc::channel::<()>();
        let (started_tx, started) = mpsc::channel::<()>();
        let first = offload
            .run(move |s: &Mutex<Vec<u32>>| {
                started_tx.send(()).unwrap();
                hold.recv().unwrap();
                s.lock().unwrap().push(1);
            })
            .unwrap();
        started.recv().unwrap();
        offload.submit(10).unwrap();
        offload.submit(11).unwrap();
        let between = offload
            .run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(20))
            .unwrap();
        offload.submit(12).unwrap();
        let last = offload
            .run(|s: &Mutex<Vec<u32>>| s.lock().unwrap().push(30))
            .unwrap();
        release.send(()).unwrap();
        first.await.unwrap();
        between.await.unwrap();
        last.await.unwrap();
        assert_eq!(*service.lock().unwrap(), [1, 102, 10, 11, 20, 101, 12, 30]);
    }
}
