//! What the metrics endpoint reads of the store, without waiting for its engine.

use std::fmt::Debug;

use statehub_stats::HistogramSnapshot;

use crate::{Authorizer, Counts, Engine, StateStoreService, Stats};

/// What the metrics endpoint reads: the store's size, what its machine counted, and
/// the request latency.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Snapshot {
    /// Keys and bytes held.
    pub stats: Stats,
    /// Requests by command and result, notifications.
    pub counts: Counts,
    /// KEYNOTIFY observations now.
    pub observations: u64,
    /// Request latency.
    pub latency: HistogramSnapshot,
    /// Requests refused because the store's own thread had too many waiting.
    pub busy_refusals: u64,
}

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// How many keys and bytes the store holds.
    pub fn stats(&self) -> Stats {
        self.shards.lock(0).machine.engine().stats()
    }

    /// Everything the metrics endpoint shows, read at once.
    ///
    /// It never waits for the engine: with threads of the store's own (an engine on the
    /// network), the size is the one last read there (at most a second old, see
    /// `expiry.rs`) and the counts are those copied out after each call.
    pub fn snapshot(&self) -> Snapshot {
        let stats = match self.offload.get() {
            Some(_) => self.shards.last_stats(),
            None => self.stats(),
        };
        let tally = self.shards.tally();
        Snapshot {
            stats,
            counts: tally.counts,
            observations: tally.observations,
            latency: self.latency.snapshot(),
            busy_refusals: self.busy_refusals(),
        }
    }
}
