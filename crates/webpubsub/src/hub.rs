//! Hubs, groups and connection sessions.
//!
//! A [`Session`] is what a client's connection id names. On reliable subprotocols it
//! outlives its socket: when the socket drops the session is kept for the retention
//! window with its groups, processed ackIds and unacknowledged messages, and a socket
//! presenting the connection id and reconnection token takes it over, unless its
//! replay buffer no longer holds every message the client has not acknowledged (see
//! `reliable`): then the session ends at once, and the recovery is told why. On the
//! other subprotocols the session ends with its socket.
//!
//! The hub also indexes sessions by user id, keeps group members ordered (so listing a
//! group pages stably), and reports sessions' starts and ends to its upstream (the
//! `disconnected` event) through its [`Events`]. [`Session`] (in `session.rs`) owns a
//! session's state; the REST API's operations on connections, users, groups and
//! permissions live in [`admin`]; client streams in [`stream`].
//!
//! Locking: `std::sync::Mutex` everywhere, held for short sections with no `.await`
//! inside (an async mutex would only add cost). Order is hub, then session, then a
//! session's permissions; a session lock is never held while taking the hub lock, and
//! the lifecycle hook is called with no lock held.
//!
//! Slow consumers: nothing here ever waits for a socket. A socket whose outbound
//! queue is full is closed (1013 on reliable subprotocols, whose session stays
//! recoverable from its replay buffer; 1008 and the session deleted on the others),
//! counted in the service's `stats` and logged.

pub(crate) mod admin;
mod ended;
mod events;
mod lane;
mod order;
mod session;
pub(crate) mod stream;
mod takeover;
pub(crate) mod view;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use subtle::ConstantTimeEq as _;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::Cluster;
use crate::config::Limits;
use crate::mirror::Mirror;
use crate::protocol::frames::DataFrames;
use crate::protocol::json::DataMessageRef;
use crate::stats::Stats;
pub(crate) use events::{EventError, Events, UserEventFuture};
pub(crate) use lane::{shared, Delivery, Numbered};
pub(crate) use session::{Gone, NewSession, Session};

/// Close code: policy violation; for reliable clients it means "the session is gone".
pub(crate) const CLOSE_POLICY: u16 = 1008;
/// Close code: try again later; a reliable client recovers its session.
pub(crate) const CLOSE_TRY_AGAIN: u16 = 1013;
/// Close code: normal closure (closed through the REST API, non-reliable clients).
pub(crate) const CLOSE_NORMAL: u16 = 1000;
/// Close code: the server is going away (shutdown, non-reliable clients).
pub(crate) const CLOSE_GOING_AWAY: u16 = 1001;
/// Close code: the server restarts; a reliable client recovers its session (on
/// another node, where the session was handed over).
pub(crate) const CLOSE_SERVICE_RESTART: u16 = 1012;

/// Why a recovery is refused: the client is told with 1008 and this text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unrecoverable {
    /// No such session (or a wrong token or subprotocol), and nothing known of it.
    #[error("the session is gone")]
    Gone,
    /// It ended recently, for this reason.
    #[error("the session ended: {0}")]
    Ended(String),
}

/// A join refused: the connection is already in `max_groups_per_connection` groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection is already in {0} groups, the most a connection may be in")]
pub(crate) struct TooManyGroups(pub(crate) usize);

/// A new connection refused: the hub holds `max_connections_per_hub` sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the hub has {0} connections, the most it accepts")]
pub(crate) struct HubFull(pub(crate) usize);

/// A place for one new session, counted against `max_connections_per_hub` from the
/// handshake until the session exists (drop it after [`Hub::open`]).
#[derive(Debug)]
pub(crate) struct Slot(Arc<Hub>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.reserved.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hub: its sessions and groups.
#[derive(Debug)]
pub(crate) struct Hub {
    name: Arc<str>,
    limits: Limits,
    state: Mutex<HubState>,
    /// Handshakes between their [`Hub::reserve`] and their session's creation.
    reserved: AtomicUsize,
    events: Option<Arc<dyn Events>>,
    /// The other nodes, when there are (see `cluster.rs`).
    cluster: Option<Arc<dyn Cluster>>,
    /// Held for reading by a send from its broadcast to its local delivery, for writing
    /// while a session taken over from another node becomes reachable: so each send
    /// either reaches it here or is applied to it by the reader (`order.rs`).
    order: order::SendOrder,
    /// This node's own sends waiting for their turn to reach its members (`lane.rs`).
    lane: lane::Lane,
    /// Itself, once shared ([`shared`]).
    me: Weak<Hub>,
    shutdown: CancellationToken,
    stats: Arc<Stats>,
}

#[derive(Debug, Default)]
struct HubState {
    sessions: HashMap<String, Arc<Session>>,
    /// Members by group, ordered by connection id for stable paging.
    groups: HashMap<String, BTreeSet<String>>,
    /// Connection ids by user id.
    users: HashMap<String, HashSet<String>>,
    /// Reliable sessions deleted recently, so a recovery is told why.
    ended: ended::Ended,
}

impl HubState {
    /// Removes `id` from the group (a group without members is forgotten).
    fn leave_group(&mut self, group: &str, id: &str) {
        if let Some(members) = self.groups.get_mut(group) {
            members.remove(id);
            if members.is_empty() {
                self.groups.remove(group);
            }
        }
    }
}

/// A fresh, unguessable connection id.
pub(crate) fn new_connection_id() -> String {
    random_id(16)
}

fn random_id(bytes: usize) -> String {
    let raw: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    URL_SAFE_NO_PAD.encode(raw)
}

/// Comparison whose time does not depend on where the strings differ (their lengths
/// are public: every reconnection token has the same).
fn constant_time_eq(a: &str, b: &str) -> bool {
    bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

impl Hub {
    /// An empty hub.
    pub(crate) fn new(name: &str, limits: Limits) -> Self {
        Self {
            name: Arc::from(name),
            limits,
            state: Mutex::new(HubState::default()),
            reserved: AtomicUsize::new(0),
            events: None,
            cluster: None,
            order: order::SendOrder::default(),
            lane: lane::Lane::default(),
            me: Weak::new(),
            shutdown: CancellationToken::new(),
            stats: Arc::default(),
        }
    }

    /// The same hub, counting into the service's `stats`.
    pub(crate) fn with_stats(mut self, stats: Arc<Stats>) -> Self {
        self.stats = stats;
        self
    }

    /// The counters this hub counts into.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// (sessions, groups) now.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let hub = lock(&self.state);
        (hub.sessions.len(), hub.groups.len())
    }

    /// The same hub, with an upstream.
    pub(crate) fn with_events(mut self, events: Arc<dyn Events>) -> Self {
        self.events = Some(events);
        self
    }

    /// The same hub, spanning the nodes of `cluster`.
    pub(crate) fn with_cluster(mut self, cluster: Arc<dyn Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// The other nodes, if any.
    pub(crate) fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.cluster.as_ref()
    }

    /// The same hub, closing its connections when `shutdown` is cancelled.
    pub(crate) fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The hub's upstream, if it has one.
    pub(crate) fn events(&self) -> Option<&Arc<dyn Events>> {
        self.events.as_ref()
    }

    /// Cancelled when the server shuts down.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Reports that `session`'s first socket is up (called by the connection task).
    pub(crate) fn connected(&self, session: &Arc<Session>) {
        if let Some(e) = &self.events {
            e.connected(self, session);
        }
    }

    /// The limits it enforces.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The hub's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    #[cfg(test)]
    /// Creates a session for a validated token and joins its initial groups. Reliable
    /// sessions get an unguessable 256-bit reconnection token.
    pub(crate) fn create_session(
        &self,
        claims: &crate::token::ClientClaims,
        protocol: crate::protocol::Subprotocol,
    ) -> Arc<Session> {
        self.open(NewSession {
            connection_id: None,
            claims: claims.clone(),
            protocol,
            subprotocol: protocol.name().map(str::to_owned),
            connection_state: None,
        })
    }

    /// Puts a session in the hub, under its id and its user.
    fn insert(&self, hub: &mut HubState, session: &Arc<Session>) {
        hub.sessions
            .insert(session.id().to_owned(), session.clone());
        if let Some(user) = session.user_id() {
            let ids = hub.users.entry(user.to_owned()).or_default();
            ids.insert(session.id().to_owned());
        }
    }

    /// Creates a session and joins its initial groups.
    pub(crate) fn open(&self, new: NewSession) -> Arc<Session> {
        let id = new.connection_id.clone().unwrap_or_else(new_connection_id);
        let groups = new.claims.groups.clone();
        let env = (Arc::clone(&self.name), Arc::clone(&self.stats));
        let roles = new.claims.roles.clone();
        let mut session = Session::new(id, new, &self.limits, env);
        if let Some(mirror) = self.mirror() {
            session.mirror_to(mirror, roles);
        }
        let session = Arc::new(session);
        {
            let mut hub = lock(&self.state);
            self.insert(&mut hub, &session);
        }
        for group in &groups {
            if self.join(&session, group).is_err() {
                break;
            }
        }
        session
    }

    fn mirror(&self) -> Option<Mirror> {
        self.cluster.as_ref().map(|cluster| Mirror {
            cluster: Arc::clone(cluster),
            hub: Arc::clone(&self.name),
        })
    }

    /// Held by a send across its broadcast and its local delivery (see `order`);
    /// re-entrant on its thread: a delivery may send again (`order.rs`).
    pub(crate) fn sending(&self) -> order::Sending<'_> {
        self.order.read()
    }

    /// Reserves a place for a new connection, unless the hub already holds (or has
    /// promised) `max_connections_per_hub` sessions. Reliable sessions kept for their
    /// recovery count: they hold their memory until they expire.
    pub(crate) fn reserve(self: &Arc<Self>) -> Result<Slot, HubFull> {
        let max = self.limits.max_connections_per_hub;
        let hub = lock(&self.state);
        if hub.sessions.len() + self.reserved.load(Ordering::Relaxed) >= max {
            drop(hub);
            self.stats.hub_full(&self.name, max);
            return Err(HubFull(max));
        }
        self.reserved.fetch_add(1, Ordering::Relaxed);
        Ok(Slot(Arc::clone(self)))
    }

    /// The session a recovering socket names, if it exists and the token matches;
    /// else why not, to tell the client (with 1008).
    pub(crate) fn recover(
        &self,
        connection_id: &str,
        token: &str,
    ) -> Result<Arc<Session>, Unrecoverable> {
        let hub = lock(&self.state);
        let retention = self.limits.session_retention;
        let gone = || match hub.ended.reason(connection_id, token, retention) {
            Some(reason) => Unrecoverable::Ended(reason.to_owned()),
            None => Unrecoverable::Gone,
        };
        let Some(session) = hub.sessions.get(connection_id) else {
            return Err(gone());
        };
        match session.reconnection_token() {
            Some(expected) if constant_time_eq(expected, token) => Ok(Arc::clone(session)),
            _ => Err(gone()),
        }
    }

    /// Adds the session to a group (idempotent), unless it is already in
    /// `max_groups_per_connection` others.
    pub(crate) fn join(&self, session: &Session, group: &str) -> Result<(), TooManyGroups> {
        let mut hub = lock(&self.state);
        if !hub.sessions.contains_key(session.id()) {
            return Ok(());
        }
        self.join_locked(&mut hub, session, group)
    }

    /// Adds every one of `sessions` to a group, or none if any of them is already in
    /// `max_groups_per_connection` others. Every join holds the hub lock, so no
    /// session can fill up between the check and the joins.
    pub(crate) fn join_all(
        &self,
        sessions: &[Arc<Session>],
        group: &str,
    ) -> Result<(), TooManyGroups> {
        let max = self.limits.max_groups_per_connection;
        let mut hub = lock(&self.state);
        if let Some(full) = sessions.iter().find(|s| !s.may_join(group, max)) {
            self.stats.group_limit(&self.name, full.id(), max);
            return Err(TooManyGroups(max));
        }
        for s in sessions {
            if hub.sessions.contains_key(s.id()) {
                self.join_locked(&mut hub, s, group)?;
            }
        }
        Ok(())
    }

    fn join_locked(
        &self,
        hub: &mut HubState,
        session: &Session,
        group: &str,
    ) -> Result<(), TooManyGroups> {
        let max = self.limits.max_groups_per_connection;
        if !session.joined(group, max) {
            self.stats.group_limit(&self.name, session.id(), max);
            return Err(TooManyGroups(max));
        }
        let members = hub.groups.entry(group.to_owned()).or_default();
        members.insert(session.id().to_owned());
        Ok(())
    }

    /// Removes the session from a group (idempotent).
    pub(crate) fn leave(&self, session: &Session, group: &str) {
        lock(&self.state).leave_group(group, session.id());
        session.left(group);
    }

    /// Publishes to every member of `group` but `exclude`. Returns how many sessions it
    /// reached. Sessions that cannot keep up are disconnected, never waited on.
    pub(crate) fn send_to_group(
        &self,
        group: &str,
        msg: &DataMessageRef<'_>,
        exclude: Option<&str>,
    ) -> usize {
        let mut members = self.targets(admin::Target::Group(group));
        members.retain(|s| Some(s.id()) != exclude);
        self.fan_out(&members, msg, None)
    }

    /// Delivers one message to each of `sessions`, encoded once per subprotocol and
    /// queued without waiting (dropped unsent after `deadline`, if any). Sessions that
    /// end (a slow non-reliable consumer, a reliable session without a socket whose
    /// replay buffer overflowed) are deleted. Returns how many it reached.
    fn fan_out(
        &self,
        sessions: &[Arc<Session>],
        msg: &DataMessageRef<'_>,
        deadline: Option<Instant>,
    ) -> usize {
        let mut delivered = 0;
        let mut frames = DataFrames::new(msg);
        for session in sessions {
            match session.deliver(&mut frames, deadline) {
                Ok(()) => delivered += 1,
                Err(Gone) => self.remove(session.id()),
            }
        }
        self.stats.messages_out(delivered);
        delivered
    }

    /// Deletes a session: it leaves every group and can no longer be recovered. The
    /// lifecycle hears of it once, from whichever caller actually removed it.
    pub(crate) fn remove(&self, id: &str) {
        self.remove_with(id, true);
    }

    /// Deletes a session; `ended`: for good (else it lives on another node).
    fn remove_with(&self, id: &str, ended: bool) {
        let (session, reason) = {
            let mut hub = lock(&self.state);
            let Some(session) = hub.sessions.remove(id) else {
                return;
            };
            let (groups, reason) = session.end();
            for group in groups {
                hub.leave_group(&group, id);
            }
            if let (true, Some(token), Some(why)) = (ended, session.reconnection_token(), &reason) {
                let retention = self.limits.session_retention;
                hub.ended.record(id, token, why, retention);
            }
            if let Some(user) = session.user_id() {
                if let Some(ids) = hub.users.get_mut(user) {
                    ids.remove(id);
                    if ids.is_empty() {
                        hub.users.remove(user);
                    }
                }
            }
            (session, reason)
        };
        if !ended {
            // Handed over: its streams go on where it went.
            return stream::forget_all(&session);
        }
        stream::cancel_all(self, &session);
        session.mirror_delete();
        if let Some(e) = &self.events {
            e.disconnected(self, &session, reason.as_deref().unwrap_or_default());
        }
    }

    /// Closes a session from the server side: the client gets a `disconnected` message
    /// with `reason` and a close frame with `code`, and the session is deleted.
    pub(crate) fn close(&self, id: &str, code: u16, reason: &str) {
        let session = lock(&self.state).sessions.get(id).cloned();
        if let Some(session) = session {
            session.shut(code, reason);
            self.remove(id);
        }
    }

    /// The socket of `generation` ended. Reliable sessions are kept for the retention
    /// window (then deleted unless recovered), others are deleted now.
    pub(crate) fn socket_closed(self: &Arc<Self>, session: &Arc<Session>, generation: u64) {
        match session.detach(generation) {
            None => return,
            Some(false) => return self.remove(session.id()),
            Some(true) => {}
        }
        let hub = Arc::clone(self);
        let session = Arc::clone(session);
        let retention = self.limits.session_retention;
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            if session.expired(generation, retention) {
                hub.remove(session.id());
            }
        });
    }

    /// Number of live or retained sessions.
    pub(crate) fn session_count(&self) -> usize {
        lock(&self.state).sessions.len()
    }
}

#[cfg(test)]
#[path = "hub/hub_test.rs"]
mod tests;
