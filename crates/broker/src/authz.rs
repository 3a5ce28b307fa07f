//! Authorization in the broker: the rules installed now, and each connection's grants.
//!
//! The broker holds one [`Policy`] (or none: no rules, everything allowed but the
//! built-in protections of `statehub_authz::builtin`) and a generation number bumped
//! whenever it is replaced. A connection keeps the [`Access`] derived from the policy
//! for its principal ([`Grants`]) and re-derives it only when the generation moved, so:
//!
//! * with no rules, an operation costs one atomic load and a branch;
//! * with rules, the grants are compiled once per connection (placeholders filled in,
//!   patterns compiled), not per operation;
//! * replaced rules (SIGHUP) apply to every operation that starts after the swap,
//!   connections already open included. Subscriptions made before stay (they were
//!   allowed when made), as do messages already queued.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use statehub_authz::{Access, Policy, Principal};

use crate::Broker;

/// The rules installed now.
#[derive(Debug, Default)]
pub(crate) struct Rules {
    policy: RwLock<Option<Arc<Policy>>>,
    /// Bumped on every change; 0 until rules are first installed.
    generation: AtomicU64,
}

impl Broker {
    /// Installs authorization rules; `None` or an empty policy removes them (everything
    /// is allowed again, but for the built-in protections). Operations that start after
    /// the call are judged by the new rules.
    pub fn set_policy(&self, policy: Option<Arc<Policy>>) {
        let rules = self.rules();
        *rules.policy.write() = policy.filter(|p| !p.is_empty());
        rules.generation.fetch_add(1, Ordering::Release);
    }

    /// Whether authorization rules are installed.
    pub fn has_policy(&self) -> bool {
        self.rules().policy.read().is_some()
    }
}

/// A connection's grants: `None` while there are no rules.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    generation: u64,
    access: Option<Arc<Access>>,
}

impl Grants {
    /// The grants of `who` under the rules installed now.
    pub(crate) fn derive(broker: &Broker, who: &Principal<'_>) -> Grants {
        let rules = broker.rules();
        let generation = rules.generation.load(Ordering::Acquire);
        let access = rules
            .policy
            .read()
            .as_ref()
            .map(|p| Arc::new(p.access(who)));
        Grants { generation, access }
    }

    /// The grants now, re-derived for `who` if the rules changed since.
    pub(crate) fn current(&mut self, broker: &Broker, who: &Principal<'_>) -> Option<&Arc<Access>> {
        let generation = broker.rules().generation.load(Ordering::Acquire);
        if generation != self.generation {
            *self = Grants::derive(broker, who);
        }
        self.access.as_ref()
    }

    /// The grants as derived last.
    pub(crate) fn access(&self) -> Option<&Arc<Access>> {
        self.access.as_ref()
    }

    /// Forgets the grants (the principal changed): the next use derives them again.
    pub(crate) fn invalidate(&mut self) {
        self.generation = u64::MAX;
    }
}
