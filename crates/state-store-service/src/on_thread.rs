//! The service's side of its own thread (`offload.rs`): starting it, and running a
//! request, an expiry run or a closed connection's observations there.

use std::fmt::Debug;
use std::sync::Arc;

use statehub_broker::codec::Publish;
use statehub_broker::{BoxFuture, Broker, ClientInfo};
use statehub_state_store::WriteSeq;
use std::time::Instant;
use tokio::sync::oneshot;

use crate::batch::Queued;
use crate::durable::Tracker;
use crate::offload::{Busy, Offload};
use crate::{refuse, Authorizer, Engine, StateStoreService};

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// Makes every engine call that may block on the network (requests, expiry, a
    /// closed connection's observations) on threads of the store's own, one per shard
    /// (`shards.rs`), each with at most `capacity` waiting (`offload.rs`), instead of on
    /// the broker's threads. For an engine shared by several nodes (Redis); call it
    /// once, before requests arrive.
    pub fn run_engine_on_own_thread(self: &Arc<Self>, capacity: usize) -> std::io::Result<()> {
        let offloads = (0..self.shards.len())
            .map(|shard| Offload::start(Arc::downgrade(self), capacity, shard))
            .collect::<std::io::Result<Box<[_]>>>()?;
        if self.offload.set(offloads).is_err() {
            tracing::warn!("the state store already has its own threads");
        }
        Ok(())
    }

    /// Requests refused so far because a thread of the store's own had too many waiting.
    pub fn busy_refusals(&self) -> u64 {
        self.offload
            .get()
            .map_or(0, |offloads| offloads.iter().map(Offload::refused).sum())
    }

    /// Runs `f` where the first shard's engine calls are made (expiry runs there): on
    /// its own thread when it has one, else here. `Err` when that thread's queue is full.
    pub(crate) async fn on_engine_thread<T: Send + 'static>(
        &self,
        f: fn(&Self) -> T,
    ) -> Result<T, Busy> {
        match self.offload.get().and_then(|o| o.first()) {
            None => Ok(f(self)),
            Some(offload) => offload.run(f)?.await.map_err(|_| Busy),
        }
    }

    /// [`StateStoreService::handle`] on the thread of the requester's shard; a request
    /// it has no room for is answered 503 at once.
    pub(crate) async fn handle_on_thread(
        &self,
        offloads: &[Offload<Self, Queued>],
        shard: usize,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<(WriteSeq, Instant)> {
        let handled = self.queue_request(offloads, shard, broker, from, publish)?;
        // No answer only if the thread ended, with the service.
        handled.await.ok().flatten()
    }

    /// Queues [`StateStoreService::handle`] on the thread of the requester's shard,
    /// behind the client's earlier requests; `None` when it had no room (the request
    /// was answered 503 at once).
    fn queue_request(
        &self,
        offloads: &[Offload<Self, Queued>],
        shard: usize,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<oneshot::Receiver<Option<(WriteSeq, Instant)>>> {
        let (answer, handled) = oneshot::channel();
        let item = Queued {
            shard,
            broker: broker.clone(),
            from: from.clone(),
            publish: publish.clone(),
            answer,
        };
        match offloads.get(shard).ok_or(Busy).and_then(|o| o.submit(item)) {
            Ok(()) => Some(handled),
            Err(Busy) => {
                refuse::busy(broker, from, publish);
                None
            }
        }
    }

    /// [`Service::start_publish`](statehub_broker::Service::start_publish) for a store
    /// whose replies wait for something (the change feed, the disk): the request is
    /// taken now, in the order the connection received it, and the future waits for
    /// its answer and what it waits for, as [`StateStoreService::on_publish`] does. On
    /// threads of its own (Redis) it is queued on its client's thread; on a data
    /// directory it runs here, at once, if the store admits it without waiting (a
    /// request whose admission must wait is awaited in place: the connection is then
    /// not read, which is the admission's back-pressure). `None` for the embedded
    /// store, which answers in place.
    pub(crate) fn start_on_thread(
        self: Arc<Self>,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<BoxFuture<'static, ()>> {
        let received = Instant::now();
        let shard = self.shards.index_of(&from.client_id);
        let taken = match (self.durability.as_ref()?.progress(), self.offload.get()) {
            (Tracker::Feed(_), Some(offloads)) => {
                let handled = self.queue_request(offloads, shard, broker, from, publish);
                Taken::Queued(handled)
            }
            (Tracker::Storage(progress), None) if progress.admits() => {
                Taken::Handled(self.handle(shard, broker, from, publish))
            }
            _ => return None,
        };
        let broker = broker.clone();
        Some(Box::pin(async move {
            let held = match taken {
                Taken::Queued(Some(handled)) => handled.await.ok().flatten(),
                Taken::Queued(None) => None,
                Taken::Handled(held) => held,
            };
            if let (Some((seq, deadline)), Some(durability)) = (held, &self.durability) {
                self.finish(&broker, durability, seq, Some(deadline)).await;
            }
            self.latency.record(received.elapsed());
        }))
    }

    /// Drops a closed connection's observations (the engine is told which keys lost
    /// their last observer here).
    pub(crate) fn drop_observations(&self, shard: usize, client_id: &str) {
        let dropped = self
            .shards
            .run(shard, |state| state.machine.client_disconnected(client_id));
        if let Err(e) = dropped {
            tracing::warn!(client = client_id, error = %e, "observations dropped, engine not told");
        }
    }
}

/// A request [`StateStoreService::start_on_thread`] took.
enum Taken {
    /// Queued on its thread (`None`: refused, the queue full), its answer to come.
    Queued(Option<oneshot::Receiver<Option<(WriteSeq, Instant)>>>),
    /// Handled here: what its answer waits for, if anything.
    Handled(Option<(WriteSeq, Instant)>),
}
