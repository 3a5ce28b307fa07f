//! Active expiry: a task that sleeps until the next key expires, removes it and sends
//! the `NOTIFY DELETE`s.
//!
//! Expiry must be active because the SDKs take leases with `SET ... PX` and wait for the
//! deletion notification when a lease lapses; waiting for the next request to notice
//! would leave observers hanging.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use statehub_broker::Broker;
use statehub_state_store::unix_ms;

use crate::durable::Next;
use crate::{Authorizer, Engine, StateStoreService};

/// How long the expiry task sleeps when no key has an expiry (a wake-up comes with the first).
const IDLE: Duration = Duration::from_secs(3600);

/// Longest sleep of the expiry task over an engine shared by several nodes: keys that
/// other nodes wrote arm no timer here, and must expire even if the node that wrote them
/// is gone. Also how soon it tries again while the engine's storage is out of reach.
const SHARED_POLL: Duration = Duration::from_secs(1);

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// Expires keys on time until the broker shuts down. Spawn it once per service.
    ///
    /// It also releases what requests stopped waiting for (see `durable.rs`).
    ///
    /// The task re-reads [`statehub_state_store::Machine::next_expiry`] whenever a request
    /// arms a new expiry (through a `Notify`, which keeps a wake-up that arrives while the
    /// task is busy), so it is never more than a timer tick late.
    pub async fn run_expiry(self: Arc<Self>, broker: Broker) {
        let shutdown = broker.shutdown_token();
        loop {
            let (next, shared) = self
                .on_engine_thread(Self::next_expiry)
                .await
                .unwrap_or((None, true));
            let wait = match next {
                Some(at) => Duration::from_millis(at.saturating_sub(unix_ms(SystemTime::now()))),
                None => IDLE,
            };
            let wait = if shared { wait.min(SHARED_POLL) } else { wait };
            let orphans = async {
                match &self.durability {
                    Some(durability) => (durability.next_orphan().await, durability),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.rearm.notified() => continue,
                (seq, durability) = orphans => {
                    self.finish(&broker, durability, seq, None).await;
                    continue;
                }
                () = tokio::time::sleep(wait) => {}
            }
            // A full queue: the next run (within `SHARED_POLL`) removes them.
            let next = self
                .on_engine_thread(Self::expire_due)
                .await
                .unwrap_or(Next::Now(None, Vec::new()));
            if let (Some(seq), Some(durability)) = (self.dispatch(&broker, next), &self.durability)
            {
                self.finish(&broker, durability, seq, None).await;
            }
        }
    }

    /// Removes the keys that are due: the outcome to send.
    fn expire_due(&self) -> Next {
        self.shards.run(0, |state| {
            let effects = if state.failed {
                Vec::new()
            } else {
                match state.machine.expire(unix_ms(SystemTime::now())) {
                    Ok(effects) => effects,
                    Err(e) if e.is_unavailable() => {
                        crate::state::log_unavailable(&e);
                        Vec::new()
                    }
                    Err(e) => {
                        state.fail(&e);
                        Vec::new()
                    }
                }
            };
            self.next(None, effects)
        })
    }

    /// When the next key expires, and whether the engine is shared with other nodes
    /// (it publishes its changes), so that the task polls it too.
    /// Also notes the store's size for [`StateStoreService::snapshot`], so that it is
    /// read here, at most a poll apart, rather than where metrics are collected.
    fn next_expiry(&self) -> (Option<u64>, bool) {
        let mut state = self.shards.lock(0);
        let shared = state.machine.engine().publishes_changes();
        if state.failed {
            return (None, shared);
        }
        self.shards.note_stats(state.machine.engine().stats());
        match state.machine.next_expiry() {
            Ok(next) => (next, shared),
            Err(e) if e.is_unavailable() => {
                crate::state::log_unavailable(&e);
                (None, true)
            }
            Err(e) => {
                state.fail(&e);
                (None, shared)
            }
        }
    }
}
