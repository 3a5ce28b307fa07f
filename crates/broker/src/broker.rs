//! The shared broker state and the publish path.
//!
//! [`Broker`] is a cheap handle (`Arc` inside) given to every connection task and
//! service. Who owns what:
//! * the session table (`DashMap`, sharded locks) maps client ids to sessions;
//! * the subscription trie sits behind a `RwLock`: publishes take it shared, only
//!   (un)subscribes and session ends take it exclusively;
//! * retained messages sit behind their own `RwLock`;
//! * each session's queue has its own short mutex (see `session/mod.rs`).
//!
//! No lock is held across an `.await`. The lock order is the client id's stripe
//! (`session_table.rs`), then the table's shard or the trie (never both), then a
//! session, then the session store: the publish path takes the trie, then each
//! session, so it cannot deadlock (ARCHITECTURE.md has the whole order). A PUBLISH
//! that may be refused (`queue_full_policy = "refuse"`) takes the retained lock
//! inside the trie's, once no session could refuse it; nothing takes the trie's
//! inside the retained lock.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use parking_lot::RwLock;
use smallvec::SmallVec;
use statehub_mqtt_codec::{Publish, QoS, ReasonCode};
use tokio_util::sync::CancellationToken;

use crate::admin::Taps;
use crate::auth::{AllowAll, Authenticator};
use crate::authz::Rules;
use crate::clock::Clock;
use crate::config::BrokerConfig;
use crate::fabric::{Fabric, FabricError, Remote, SharedPicks};
use crate::message::{Delivery, Message, SharedVia};
use crate::metrics::Metrics;
use crate::rate::ConnectRate;
use crate::retain_store::{RetainStore, RetainStoreError};
use crate::retained::RetainedIndex;
use crate::service::BoxFuture;
use crate::service::Service;
use crate::session::{Enqueued, QueueLimits, Session, Ticket};
use crate::session_store::Gate;
use crate::session_table::Sessions;
use crate::topic;
use crate::trie::{SubEntry, SubscriptionTrie};

mod blockers;
mod index;
mod queue_full;
mod targets;

pub(crate) use blockers::Blockers;

/// Handle to the broker. Clone freely.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: BrokerConfig,
    limits: QueueLimits,
    clock: Clock,
    sessions: Sessions,
    trie: RwLock<SubscriptionTrie>,
    retained: RwLock<RetainedIndex>,
    retain_store: RwLock<Option<Arc<dyn RetainStore>>>,
    services: RwLock<Vec<(String, Arc<dyn Service>)>>,
    authenticator: RwLock<Arc<dyn Authenticator>>,
    rules: Rules,
    connect_rate: ConnectRate,
    metrics: Metrics,
    generation: AtomicU64,
    connections: AtomicUsize,
    shutdown: CancellationToken,
    taps: Taps,
    fabric: OnceLock<Arc<dyn Fabric>>,
    /// Held (read) while a local message is routed here and handed to the fabric, so
    /// that a session adopted from another node joins between two such messages (see
    /// [`Broker::adopt_session`]).
    forwarding: RwLock<()>,
}

/// Why [`Broker::deliver_to`] could not deliver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliverError {
    #[error("no session for client {0}")]
    NoSession(String),
    #[error("session queue of {0} is full")]
    QueueFull(String),
}

impl Broker {
    pub fn new(config: BrokerConfig) -> Broker {
        Broker::with_clock(config, Clock::system())
    }

    /// A broker on `clock` (a test's [`ManualClock`](crate::ManualClock)) instead of
    /// the system's.
    pub fn with_clock(config: BrokerConfig, clock: Clock) -> Broker {
        let sessions = Sessions::new(&config);
        let connect_rate = ConnectRate::new(
            config.connect_rate_per_address,
            config.connect_burst_per_address,
        );
        let limits = QueueLimits {
            max_messages: config.max_queued_messages,
            max_bytes: config.max_queued_bytes,
            high_messages: config
                .backpressure_high_water
                .min(config.max_queued_messages),
            high_bytes: config
                .backpressure_high_water_bytes
                .min(config.max_queued_bytes),
            queue_qos0_offline: config.queue_qos0_offline,
            policy: config.queue_full_policy,
        };
        Broker {
            inner: Arc::new(Inner {
                config,
                limits,
                clock,
                sessions,
                trie: RwLock::new(SubscriptionTrie::default()),
                retained: RwLock::new(RetainedIndex::default()),
                retain_store: RwLock::new(None),
                services: RwLock::new(Vec::new()),
                authenticator: RwLock::new(Arc::new(AllowAll)),
                rules: Rules::default(),
                connect_rate,
                metrics: Metrics::default(),
                generation: AtomicU64::new(1),
                connections: AtomicUsize::new(0),
                shutdown: CancellationToken::new(),
                taps: Taps::default(),
                fabric: OnceLock::new(),
                forwarding: RwLock::new(()),
            }),
        }
    }

    /// Whether one more connection from `ip` is within `connect_rate_per_address`.
    pub(crate) fn connect_rate_admits(&self, ip: std::net::IpAddr) -> bool {
        self.inner.connect_rate.admit(ip, self.now())
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The broker's clock.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }

    /// Now, on the broker's clock (see [`Broker::clock`]).
    pub fn now(&self) -> Instant {
        self.inner.clock.now()
    }

    /// The token that, once cancelled, makes every connection send DISCONNECT 0x8B
    /// and close. Cancel it to shut the broker down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Number of open client connections.
    pub fn connection_count(&self) -> usize {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// Counts a connection as open until the returned guard drops.
    pub(crate) fn open_connection(&self) -> OpenConnection {
        self.inner.connections.fetch_add(1, Ordering::Relaxed);
        self.inner
            .metrics
            .connections_total
            .fetch_add(1, Ordering::Relaxed);
        OpenConnection(self.clone())
    }

    /// The bounds of a session queue.
    pub(crate) fn queue_limits(&self) -> QueueLimits {
        self.inner.limits
    }

    /// Runs `f` while no local message is being routed and forwarded (see
    /// [`Broker::adopt_session`]).
    pub(crate) fn with_forwarding_paused<R>(&self, f: impl FnOnce() -> R) -> R {
        let _paused = self.inner.forwarding.write();
        f()
    }

    /// Where the fabric is kept (see `fabric.rs`).
    pub(crate) fn fabric_cell(&self) -> &OnceLock<Arc<dyn Fabric>> {
        &self.inner.fabric
    }

    /// The admin view's taps (`admin.rs`).
    pub(crate) fn inner_taps(&self) -> &Taps {
        &self.inner.taps
    }

    /// The session table.
    pub(crate) fn sessions(&self) -> &Sessions {
        &self.inner.sessions
    }

    /// Whether the shutdown token was cancelled.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// The authentication hook installed now.
    pub(crate) fn authenticator(&self) -> Arc<dyn Authenticator> {
        self.inner.authenticator.read().clone()
    }

    /// The authorization rules (see `authz.rs`).
    pub(crate) fn rules(&self) -> &Rules {
        &self.inner.rules
    }

    /// Number of subscriptions in the index (a shared-group member counts as one).
    pub fn subscription_count(&self) -> usize {
        self.inner.trie.read().len()
    }

    /// Installs the authentication hook (replacing the allow-all default).
    pub fn set_authenticator(&self, auth: Arc<dyn Authenticator>) {
        *self.inner.authenticator.write() = auth;
    }

    /// Gives `filter`'s topics to a built-in service (see `service.rs`).
    pub fn register_service(&self, filter: &str, service: Arc<dyn Service>) {
        self.inner
            .services
            .write()
            .push((filter.to_owned(), service));
    }

    pub(crate) fn service_for(&self, topic_name: &str) -> Option<Arc<dyn Service>> {
        let services = self.inner.services.read();
        // Every PUBLISH asks: a filter without wildcards (the state store's) is compared
        // whole, not split level by level.
        let hit =
            |f: &str| f == topic_name || (topic::has_wildcard(f) && topic::matches(f, topic_name));
        services
            .iter()
            .find(|(f, _)| hit(f))
            .map(|(_, s)| s.clone())
    }

    pub(crate) fn notify_services_closed(&self, client_id: &str) {
        let services: Vec<_> = self
            .inner
            .services
            .read()
            .iter()
            .map(|(_, s)| s.clone())
            .collect();
        for s in services {
            s.on_connection_closed(self, client_id);
        }
    }

    /// Publishes into one client's session, with or without a matching subscription
    /// (the service answer path). The message is delivered once. Taps on its topic
    /// see it too, session or not: an in-process observer (the dashboard's watch of a
    /// key) has no session and reads its notifications from a tap.
    pub fn deliver_to(&self, client_id: &str, publish: Publish) -> Result<(), DeliverError> {
        let msg = Arc::new(Message::from_publish(publish, None, self.now()));
        self.inner.taps.feed(&msg);
        let session = self
            .session(client_id)
            .ok_or_else(|| DeliverError::NoSession(client_id.to_owned()))?;
        let d = Delivery::new(msg.clone(), msg.qos, msg.retain, Vec::new());
        let outcome = session.enqueue(d, &self.inner.limits, self.now());
        self.count(&session, outcome);
        match outcome {
            Enqueued::Queued { .. }
            | Enqueued::EvictedOldest { .. }
            | Enqueued::SlowConsumer { .. } => Ok(()),
            Enqueued::SkippedOffline
            | Enqueued::DroppedNewest(_)
            | Enqueued::DroppedQoS0(_)
            | Enqueued::Ended => Err(DeliverError::QueueFull(client_id.to_owned())),
        }
    }

    /// Asks every connected client's connection to close with `reason`.
    pub(crate) fn close_all(&self, reason: ReasonCode) {
        self.inner.sessions.for_each(|session| {
            session.kick(reason);
        });
    }

    /// Asks a client's connection to close with `reason`. False if not connected.
    pub fn disconnect_client(&self, client_id: &str, reason: ReasonCode) -> bool {
        self.session(client_id).is_some_and(|s| s.kick(reason))
    }

    /// Publishes a message as if a client had (retained handling included) and
    /// returns how many sessions it was delivered to. A message already behind an `Arc`
    /// (a service's cached reply) is routed without a copy.
    pub fn publish(&self, msg: impl Into<Arc<Message>>) -> usize {
        let msg = msg.into();
        if msg.retain {
            // A broker-made message is not acknowledged to anyone: nothing waits.
            drop(self.store_retained(&msg));
        }
        // Nobody waits for a broker-made message to reach the other nodes.
        self.route(&msg, None).sessions
    }

    /// Makes `msg` its topic's retained message (an empty payload clears it). With a
    /// [`RetainStore`], returns the future that resolves once the change is durable.
    pub(crate) fn store_retained(
        &self,
        msg: &Arc<Message>,
    ) -> Option<BoxFuture<'static, Result<(), RetainStoreError>>> {
        // Copied outside the lock; kept compacted (see `Message::compacted`).
        let keep = (!msg.payload.is_empty()).then(|| Arc::new(msg.compacted()));
        let mut retained = self.inner.retained.write();
        match keep {
            Some(keep) => retained.insert(keep),
            None => {
                retained.remove(&msg.topic);
            }
        }
        // `$SYS` values are remade by the running broker: never kept on disk.
        if crate::sys::is_sys(&msg.topic) {
            return None;
        }
        let store = self.inner.retain_store.read();
        store.as_ref().map(|s| s.record(msg, self.now()))
    }

    /// Makes `msg` its topic's retained message (an empty payload clears it) in memory
    /// only, telling no [`RetainStore`]: another node of a cluster stored it.
    pub fn apply_retained(&self, msg: &Arc<Message>) {
        self.apply_retained_unless(msg, |_| false);
    }

    /// [`Broker::apply_retained`] unless `skip(topic)`, asked under the lock that every
    /// change of the retained messages takes (a [`RetainStore`] is told of this node's
    /// own changes under it too).
    pub fn apply_retained_unless(&self, msg: &Arc<Message>, skip: impl FnOnce(&str) -> bool) {
        let mut retained = self.inner.retained.write();
        if skip(&msg.topic) {
            return;
        }
        if msg.payload.is_empty() {
            retained.remove(&msg.topic);
        } else {
            retained.insert(Arc::new(msg.compacted()));
        }
    }

    /// Clears every retained message whose topic `keep` refuses, `$SYS` ones aside,
    /// under the lock every change takes: a node that reloaded another store's whole
    /// view drops what that view no longer holds. Returns how many it cleared.
    pub fn retain_only(&self, keep: impl Fn(&str) -> bool) -> usize {
        let mut retained = self.inner.retained.write();
        let gone: Vec<_> = (retained.topics().into_iter())
            .filter(|t| !crate::sys::is_sys(t) && !keep(t))
            .collect();
        for topic in &gone {
            retained.remove(topic);
        }
        gone.len()
    }

    /// Keeps retained messages in `store` from now on, starting from `loaded` (what it
    /// held at start-up). Call before accepting connections.
    pub fn set_retain_store(&self, store: Arc<dyn RetainStore>, loaded: Vec<Message>) {
        let mut retained = self.inner.retained.write();
        for msg in loaded {
            if !msg.payload.is_empty() {
                retained.insert(Arc::new(msg));
            }
        }
        *self.inner.retain_store.write() = Some(store);
    }

    /// Number of retained messages held (expired ones included until replaced).
    pub fn retained_count(&self) -> usize {
        self.inner.retained.read().len()
    }

    /// Appends the retained messages matching `filter` to `out`, in no particular
    /// order; returns the index nodes visited (the work done).
    pub(crate) fn retained_into(
        &self,
        filter: &str,
        now: Instant,
        out: &mut Vec<Arc<Message>>,
    ) -> usize {
        self.inner.retained.read().matching(filter, now, out)
    }

    /// Delivers `msg` to every matching subscription; says how many sessions it went
    /// to and whether any stored it. Overlapping subscriptions of one client produce
    /// one copy with the highest QoS and every subscription identifier; each shared
    /// group gets one copy.
    ///
    /// With a `gate`, the QoS 2 copies that persistent sessions store wait behind it
    /// (the caller opens it once the message is durable).
    pub(crate) fn route(&self, msg: &Arc<Message>, gate: Option<&Arc<Gate>>) -> Routed {
        self.route_with(msg, gate, false, None, || {})
    }

    /// [`Broker::route`] for a client's PUBLISH. With `all_or_nothing` (the refuse
    /// policy, for a publisher that can be told), a message that some offline
    /// session's full queue would have to take goes to nobody (`Routed::refused`).
    /// `accepted` runs once the message is not refused, before any session gets it
    /// (to make it the retained message: a concurrent subscriber then gets it either
    /// live or retained). With `blockers`, the connected sessions past their
    /// high-water mark that got a QoS 1/2 copy are collected there.
    pub(crate) fn route_with(
        &self,
        msg: &Arc<Message>,
        gate: Option<&Arc<Gate>>,
        all_or_nothing: bool,
        blockers: Option<&mut Blockers<'_>>,
        accepted: impl FnOnce(),
    ) -> Routed {
        // A message for one recipient (a service's answer) is this node's business.
        let Some(fabric) = self.fabric().filter(|_| msg.recipient.is_none()) else {
            return self.route_local(msg, gate, all_or_nothing, blockers, accepted, None);
        };
        let _forwarding = self.inner.forwarding.read();
        let picks = fabric.shared_picks(&msg.topic);
        let remote = Remote::picked(&picks);
        let mut routed =
            self.route_local(msg, gate, all_or_nothing, blockers, accepted, Some(remote));
        if !routed.refused {
            routed.forwarded = Some(fabric.forward(msg, picks));
        }
        routed
    }

    /// A remote message's routing: this node's subscribers, shared groups as
    /// the publisher's node picked them.
    pub(crate) fn route_picked(&self, msg: &Arc<Message>, picks: &SharedPicks) -> usize {
        let remote = Remote::picked(picks);
        self.route_local(msg, None, false, None, || {}, Some(remote))
            .sessions
    }

    /// [`Broker::route_remote_gated`]'s routing.
    pub(crate) fn route_local_gated(
        &self,
        msg: &Arc<Message>,
        gate: &Arc<Gate>,
        remote: Remote<'_>,
    ) -> usize {
        self.route_local(msg, Some(gate), false, None, || {}, Some(remote))
            .sessions
    }

    /// Routes to this node's sessions; with `remote`, a shared group gets the message
    /// only if it was picked for this node, and the sessions it names get nothing.
    fn route_local(
        &self,
        msg: &Arc<Message>,
        gate: Option<&Arc<Gate>>,
        all_or_nothing: bool,
        mut blockers: Option<&mut Blockers<'_>>,
        accepted: impl FnOnce(),
        remote: Option<Remote<'_>>,
    ) -> Routed {
        let accepted = if all_or_nothing {
            Some(accepted)
        } else {
            accepted();
            None
        };
        let metrics = &self.inner.metrics;
        metrics.messages_in.fetch_add(1, Ordering::Relaxed);
        let trie = self.inner.trie.read();
        let matches = trie.matches(&msg.topic);
        let mut targets = self.targets(&matches, msg, gate, remote.map(|r| r.picks));
        if let Some(held_by) = remote.map(|r| r.held_by).filter(|h| !h.is_empty()) {
            // A shared group's copy is not one they held: the publisher's node picked
            // this node for that group.
            let held = |e: &SubEntry| held_by.iter().any(|c| **c == *e.session.client_id());
            targets.retain(|(entry, d)| d.shared.is_some() || !held(entry));
        }
        if let Some(only) = remote.and_then(|r| r.only) {
            let named = |e: &SubEntry| only.iter().any(|c| **c == *e.session.client_id());
            targets.retain(|(entry, d)| d.shared.is_none() && named(entry));
        }
        let sessions = targets.len();
        let mut tickets = SmallVec::<[Option<Ticket>; 4]>::new();
        if all_or_nothing {
            if !self.reserve_all(&targets, &mut tickets) {
                return Routed {
                    sessions,
                    stored: false,
                    refused: true,
                    forwarded: None,
                };
            }
            if let Some(accepted) = accepted {
                accepted();
            }
        }
        let mut tickets = tickets.into_iter();
        let mut stored = false;
        for (entry, d) in targets {
            // A shared group's member holds the publisher only if it was past its mark
            // already when picked, i.e. every connected member was (see
            // `SharedGroup::pick`): else the next message goes to one with room.
            let pausable =
                d.qos != QoS::AtMostOnce && (d.shared.is_none() || entry.session.is_pressed());
            stored |= match tickets.next().flatten() {
                Some(ticket) => self.offer_reserved(&entry.session, d, ticket),
                None => self.offer(&entry.session, d),
            };
            if let Some(b) = blockers.as_deref_mut().filter(|_| pausable) {
                b.note(&entry.session);
            }
        }
        self.inner.taps.feed(msg);
        Routed {
            sessions,
            stored,
            refused: false,
            forwarded: None,
        }
    }

    /// Enqueues one delivery and counts what the queue bounds did to it. True if it
    /// was recorded in the session store (see [`Enqueued::stored`]).
    pub(crate) fn offer(&self, session: &Arc<Session>, d: Delivery) -> bool {
        let outcome = session.enqueue(d, &self.inner.limits, self.now());
        self.count(session, outcome);
        outcome.stored()
    }

    /// Hands a delivery that came through a shared group to another member, if any
    /// other member exists; returns false when it should stay where it is.
    pub(crate) fn reroute_shared(&self, d: &Delivery, via: &SharedVia, from_client: &str) -> bool {
        let trie = self.inner.trie.read();
        let Some(group) = trie.shared_group(&via.filter, &via.group) else {
            return false;
        };
        let Some(entry) = group.pick(Some(from_client)) else {
            return false;
        };
        let mut d = d.clone();
        d.qos = d.msg.qos.min(entry.options.qos);
        // Nobody waits for the hand-over to be durable: the message was acknowledged
        // when it was first stored, and this session's record of it stays until the
        // other session's is written (same store, same order).
        self.offer(&entry.session, d);
        true
    }

    pub(crate) fn next_generation(&self) -> u64 {
        self.inner.generation.fetch_add(1, Ordering::Relaxed)
    }
}

/// An open connection, counted until it drops.
#[derive(Debug)]
pub(crate) struct OpenConnection(Broker);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.inner.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Each session a message goes to, with its copy.
type Targets<'t> = SmallVec<[(&'t SubEntry, Delivery); 4]>;

/// Where a routed message went.
pub(crate) struct Routed {
    pub sessions: usize,
    /// Some persistent session stored it: await the session store's barrier before
    /// acknowledging the PUBLISH.
    pub stored: bool,
    /// Refused (all or nothing, see [`Broker::route_with`]): no session got it.
    pub refused: bool,
    /// Handed to the other nodes (see `fabric.rs`): resolves once they will get it.
    pub forwarded: Option<BoxFuture<'static, Result<(), FabricError>>>,
}

/// Splits `$share/{group}/{filter}` into its group and filter.
pub(crate) fn split_shared(filter: &str) -> (Option<&str>, &str) {
    if let Some(rest) = filter.strip_prefix("$share/") {
        if let Some((group, f)) = rest.split_once('/') {
            return (Some(group), f);
        }
    }
    (None, filter)
}
