//! The service's side of its own thread (`offload.rs`): starting it, and running a
//! request, an expiry run or a closed connection's observations there.

use std::fmt::Debug;
use std::sync::Arc;

use statehub_broker::codec::Publish;
use statehub_broker::{Broker, ClientInfo};
use std::time::Instant;

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
        offloads: &[Offload<Self>],
        shard: usize,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<(statehub_state_store::WriteSeq, Instant)> {
        let job = (broker.clone(), from.clone(), publish.clone());
        let run = move |service: &Self| service.handle(shard, &job.0, &job.1, &job.2);
        let queued = offloads.get(shard).ok_or(Busy).and_then(|o| o.run(run));
        match queued {
            // No answer only if the thread ended, with the service.
            Ok(handled) => handled.await.ok().flatten(),
            Err(Busy) => {
                refuse::busy(broker, from, publish);
                None
            }
        }
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
