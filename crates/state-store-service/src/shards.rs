//! The store's machines: one for an embedded engine, one per Redis connection with
//! `--redis` (`[state_store] network_threads`), each behind its own lock.
//!
//! Why several: a machine calls its engine synchronously under its lock, so one machine
//! makes one Redis round trip at a time, and a node's store would serve no faster than
//! one connection's latency allows. Machines on connections of their own make their
//! round trips at the same time. Each client's requests always go to the same machine
//! ([`Shards::index_of`]), which keeps what a machine holds per client consistent with
//! one machine: its requests run and are answered in the order the broker handed them
//! over, its KEYNOTIFY observations and its cached replies live in that machine alone.
//! What spans clients lives in Redis (keys, versions from the shared clock, fencing,
//! expiry) and is atomic there whichever connection a script comes on. See
//! `docs/decisions/0006-state-store-round-trips-in-parallel.md`.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};

use parking_lot::{Mutex, MutexGuard};
use statehub_state_store::{Authorizer, Counts, Engine, Machine, Stats, COMMANDS, RESULTS};

use crate::cache::ResponseCache;
use crate::{Settings, State};

/// The machines, each with its own state (see the module docs).
#[derive(Debug)]
pub(crate) struct Shards<E, A> {
    shards: Box<[Mutex<State<E, A>>]>,
    /// Each machine's counts, copied out after each of its calls, so that the metrics
    /// endpoint never waits for a lock held across a round trip.
    tallies: Box<[Mutex<Tally>]>,
    /// The store's size as last read where engine calls are made.
    stats: Mutex<Stats>,
}

/// What one machine counted (see [`Shards::run`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tally {
    pub(crate) counts: Counts,
    pub(crate) observations: u64,
}

impl<E, A> Shards<E, A> {
    /// One shard per machine, `first` being the one that runs expiry; the response
    /// cache's bounds are shared among them, so they stay the configured totals.
    pub(crate) fn new(first: Machine<E, A>, rest: Vec<Machine<E, A>>, settings: &Settings) -> Self {
        let count = rest.len() + 1;
        let share = |total: usize| total.div_ceil(count);
        let shards = std::iter::once(first)
            .chain(rest)
            .map(|machine| {
                Mutex::new(State {
                    machine,
                    cache: ResponseCache::new(
                        share(settings.response_cache_entries),
                        share(settings.response_cache_in_flight),
                    ),
                    failed: false,
                })
            })
            .collect();
        Self {
            shards,
            tallies: (0..count).map(|_| Mutex::default()).collect(),
            stats: Mutex::default(),
        }
    }

    /// How many there are (at least one).
    pub(crate) fn len(&self) -> usize {
        self.shards.len()
    }

    /// The shard that serves `client_id`: always the same one for a client id.
    pub(crate) fn index_of(&self, client_id: &str) -> usize {
        if self.shards.len() == 1 {
            return 0;
        }
        // Fixed keys, so a client's shard does not change while it is connected; a
        // client that picks ids to crowd one shard only queues behind itself and its
        // neighbours, as every client did behind one thread.
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(client_id);
        usize::try_from(hash % self.shards.len() as u64).unwrap_or(0)
    }

    /// Locks shard `index` (the first if out of range).
    pub(crate) fn lock(&self, index: usize) -> MutexGuard<'_, State<E, A>> {
        self.shards.get(index).unwrap_or(&self.shards[0]).lock()
    }

    /// Every shard, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Mutex<State<E, A>>> {
        self.shards.iter()
    }

    /// Every machine's counts summed, as of its last call.
    pub(crate) fn tally(&self) -> Tally {
        self.tallies.iter().fold(Tally::default(), |total, tally| {
            let tally = *tally.lock();
            Tally {
                counts: add(total.counts, &tally.counts),
                observations: total.observations + tally.observations,
            }
        })
    }

    /// The store's size as last noted ([`Shards::note_stats`]).
    pub(crate) fn last_stats(&self) -> Stats {
        *self.stats.lock()
    }

    /// Notes the store's size, read where engine calls are made.
    pub(crate) fn note_stats(&self, stats: Stats) {
        *self.stats.lock() = stats;
    }
}

impl<E: Engine, A: Authorizer> Shards<E, A> {
    /// Runs `f` on shard `index` under its lock, then copies its counts out.
    pub(crate) fn run<T>(&self, index: usize, f: impl FnOnce(&mut State<E, A>) -> T) -> T {
        let index = if index < self.shards.len() { index } else { 0 };
        let mut state = self.shards[index].lock();
        let out = f(&mut state);
        *self.tallies[index].lock() = Tally {
            counts: state.machine.counts(),
            observations: state.machine.observations() as u64,
        };
        out
    }
}

/// The sum of several machines' counts.
pub(crate) fn add(mut total: Counts, more: &Counts) -> Counts {
    for command in 0..COMMANDS.len() {
        for result in 0..RESULTS.len() {
            total.requests[command][result] += more.requests[command][result];
        }
    }
    total.notifications += more.notifications;
    total
}
