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

use crate::{Authorizer, Engine, StateStoreService};

/// How long the expiry task sleeps when no key has an expiry (a wake-up comes with the first).
const IDLE: Duration = Duration::from_secs(3600);

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
            let wait = match self.next_expiry() {
                Some(at) => Duration::from_millis(at.saturating_sub(unix_ms(SystemTime::now()))),
                None => IDLE,
            };
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
            let next = {
                let mut state = self.state.lock();
                let effects = if state.failed {
                    Vec::new()
                } else {
                    match state.machine.expire(unix_ms(SystemTime::now())) {
                        Ok(effects) => effects,
                        Err(e) => {
                            state.fail(&e);
                            Vec::new()
                        }
                    }
                };
                self.next(None, effects)
            };
            if let (Some(seq), Some(durability)) = (self.dispatch(&broker, next), &self.durability)
            {
                self.finish(&broker, durability, seq, None).await;
            }
        }
    }

    fn next_expiry(&self) -> Option<u64> {
        let mut state = self.state.lock();
        if state.failed {
            return None;
        }
        match state.machine.next_expiry() {
            Ok(next) => next,
            Err(e) => {
                state.fail(&e);
                None
            }
        }
    }
}
