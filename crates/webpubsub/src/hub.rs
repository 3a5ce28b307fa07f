//! Hubs, groups and connection sessions.
//!
//! A [`Session`] is what a client's connection id names. On reliable subprotocols it
//! outlives its socket: when the socket drops the session is kept for the retention
//! window with its groups, processed ackIds and unacknowledged messages, and a socket
//! presenting the connection id and reconnection token takes it over. On the other
//! subprotocols the session ends with its socket.
//!
//! The hub also indexes sessions by user id, keeps group members ordered (so listing a
//! group pages stably), and reports sessions' starts and ends to its upstream (the
//! `disconnected` event) through its [`Events`]. The REST API's operations on connections, users, groups and
//! permissions live in [`admin`].
//!
//! Locking: `std::sync::Mutex` everywhere, held for short sections with no `.await`
//! inside (an async mutex would only add cost). Order is hub, then session, then a
//! session's permissions; a session lock is never held while taking the hub lock, and
//! the lifecycle hook is called with no lock held.

pub mod admin;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::ws::Message;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use subtle::ConstantTimeEq as _;

use crate::config::Limits;
use crate::outbox::{Outbox, PushError};
use crate::permissions::Permissions;
use crate::protocol::codec::encode_reply;
use crate::protocol::frames::DataFrames;
use crate::protocol::json::{DataMessageRef, Downstream};
use crate::protocol::{Payload, Subprotocol};
use crate::reliable::{ProcessedAcks, Sequencer};
use crate::stream::Streams;
use crate::token::ClientClaims;
use crate::upstream::cloudevents::UpstreamError;
use tokio_util::sync::CancellationToken;

/// Close code: policy violation; for reliable clients it means "the session is gone".
pub const CLOSE_POLICY: u16 = 1008;
/// Close code: try again later; a reliable client recovers its session.
pub const CLOSE_TRY_AGAIN: u16 = 1013;
/// Close code: normal closure (closed through the REST API, non-reliable clients).
pub const CLOSE_NORMAL: u16 = 1000;
/// Close code: the server is going away (shutdown, non-reliable clients).
pub const CLOSE_GOING_AWAY: u16 = 1001;

/// The answer of a user event: data to send back to the client, if any.
pub type UserEventFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Option<Payload>, UpstreamError>> + Send>,
>;

/// The hub's upstream: told when sessions start and end (the `connected` and
/// `disconnected` events), and asked to handle user events. The notifications are
/// called with no lock held and must not block.
pub trait Events: Send + Sync + std::fmt::Debug {
    /// A session's first socket is attached and its `connected` message queued.
    fn connected(&self, hub: &Hub, session: &Arc<Session>);
    /// A session ended: it left every group and can no longer be recovered.
    fn disconnected(&self, hub: &Hub, session: &Arc<Session>, reason: &str);
    /// Is there a handler for this user event?
    fn takes_user_event(&self, event: &str) -> bool;
    /// Posts a user event; the future resolves to the handler's answer.
    fn user_event(
        &self,
        hub: &Hub,
        session: &Arc<Session>,
        event: &str,
        payload: &Payload,
    ) -> UserEventFuture;
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hub: its sessions and groups.
#[derive(Debug)]
pub struct Hub {
    name: String,
    limits: Limits,
    state: Mutex<HubState>,
    events: Option<Arc<dyn Events>>,
    shutdown: CancellationToken,
}

#[derive(Debug, Default)]
struct HubState {
    sessions: HashMap<String, Arc<Session>>,
    /// Members by group, ordered by connection id for stable paging.
    groups: HashMap<String, BTreeSet<String>>,
    /// Connection ids by user id.
    users: HashMap<String, HashSet<String>>,
}

impl HubState {
    fn leave_group(&mut self, group: &str, id: &str) {
        if let Some(members) = self.groups.get_mut(group) {
            members.remove(id);
            if members.is_empty() {
                self.groups.remove(group);
            }
        }
    }
}

/// The session was deleted: recovery must fail with 1008.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session is gone")]
pub struct Gone;

/// What a new session is made of: the validated token's claims (with any overrides from
/// the upstream `connect` event already applied) and the negotiated subprotocol.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The connection id, when chosen before the session exists (the `connect` event
    /// names it); a fresh random one otherwise.
    pub connection_id: Option<String>,
    /// User id, roles, initial groups.
    pub claims: ClientClaims,
    /// How frames are encoded.
    pub protocol: Subprotocol,
    /// The `Sec-WebSocket-Protocol` echoed to the client, if any (a custom one chosen by
    /// the upstream `connect` handler for a raw client, or the protocol's own name).
    pub subprotocol: Option<String>,
    /// The upstream's `ce-connectionState` from the `connect` event.
    pub connection_state: Option<String>,
}

/// One client connection session.
#[derive(Debug)]
pub struct Session {
    id: String,
    user_id: Option<String>,
    protocol: Subprotocol,
    subprotocol: Option<String>,
    permissions: Mutex<Permissions>,
    reconnection_token: Option<String>,
    state: Mutex<SessionState>,
    /// Open client streams; locked alone (see [`crate::stream`]).
    streams: Mutex<Streams>,
}

#[derive(Debug)]
struct SessionState {
    groups: HashSet<String>,
    sequencer: Sequencer,
    acks: ProcessedAcks,
    link: Option<(u64, Outbox)>,
    generation: u64,
    closed: bool,
    /// Why the session ends, for the `disconnected` event; the first reason wins.
    close_reason: Option<String>,
    /// The upstream's opaque per-connection state (`ce-connectionState`).
    connection_state: Option<String>,
}

impl SessionState {
    /// Marks the session closed and asks its socket, if any, to close.
    fn shut(&mut self, code: u16, reason: &str) {
        self.closed = true;
        if self.close_reason.is_none() {
            self.close_reason = Some(reason.to_owned());
        }
        if let Some((_, out)) = &self.link {
            out.close(code, reason);
        }
    }
}

/// Hub names as the REST API's pattern `^[A-Za-z][A-Za-z0-9_`,.[\]]{0,127}$` allows them,
/// for the client endpoint too.
pub fn valid_hub_name(name: &str) -> bool {
    name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_`,.[]".contains(c))
}

/// A fresh, unguessable connection id.
pub fn new_connection_id() -> String {
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
    pub fn new(name: &str, limits: Limits) -> Self {
        Self {
            name: name.to_owned(),
            limits,
            state: Mutex::new(HubState::default()),
            events: None,
            shutdown: CancellationToken::new(),
        }
    }

    /// The same hub, with an upstream.
    pub fn with_events(mut self, events: Arc<dyn Events>) -> Self {
        self.events = Some(events);
        self
    }

    /// The same hub, closing its connections when `shutdown` is cancelled.
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The hub's upstream, if it has one.
    pub fn events(&self) -> Option<&Arc<dyn Events>> {
        self.events.as_ref()
    }

    /// Cancelled when the server shuts down.
    pub fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// The hub's limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Reports that `session`'s first socket is up (called by the connection task).
    pub fn connected(&self, session: &Arc<Session>) {
        if let Some(e) = &self.events {
            e.connected(self, session);
        }
    }

    /// The hub's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates a session for a validated token and joins its initial groups. Reliable
    /// sessions get an unguessable 256-bit reconnection token.
    pub fn create_session(&self, claims: &ClientClaims, protocol: Subprotocol) -> Arc<Session> {
        self.open(NewSession {
            connection_id: None,
            claims: claims.clone(),
            protocol,
            subprotocol: protocol.name().map(str::to_owned),
            connection_state: None,
        })
    }

    /// Creates a session and joins its initial groups.
    pub fn open(&self, new: NewSession) -> Arc<Session> {
        let NewSession {
            connection_id,
            claims,
            protocol,
            subprotocol,
            connection_state,
        } = new;
        let session = Arc::new(Session {
            id: connection_id.unwrap_or_else(new_connection_id),
            user_id: claims.user_id.clone(),
            protocol,
            subprotocol,
            permissions: Mutex::new(claims.permissions()),
            reconnection_token: protocol.is_reliable().then(|| random_id(32)),
            state: Mutex::new(SessionState {
                groups: HashSet::new(),
                sequencer: Sequencer::new(
                    self.limits.max_unacked_messages,
                    self.limits.max_unacked_bytes,
                ),
                acks: ProcessedAcks::new(self.limits.processed_ack_ids),
                link: None,
                generation: 0,
                closed: false,
                close_reason: None,
                connection_state,
            }),
            streams: Mutex::new(Streams::default()),
        });
        {
            let mut hub = lock(&self.state);
            hub.sessions.insert(session.id.clone(), session.clone());
            if let Some(user) = &session.user_id {
                hub.users
                    .entry(user.clone())
                    .or_default()
                    .insert(session.id.clone());
            }
        }
        for group in &claims.groups {
            self.join(&session, group);
        }
        session
    }

    /// The session a recovering socket names, if it exists and the token matches.
    pub fn recover(&self, connection_id: &str, token: &str) -> Result<Arc<Session>, Gone> {
        let session = lock(&self.state)
            .sessions
            .get(connection_id)
            .cloned()
            .ok_or(Gone)?;
        match &session.reconnection_token {
            Some(expected) if constant_time_eq(expected, token) => Ok(session),
            _ => Err(Gone),
        }
    }

    /// Adds the session to a group (idempotent).
    pub fn join(&self, session: &Session, group: &str) {
        let mut hub = lock(&self.state);
        if !hub.sessions.contains_key(&session.id) {
            return;
        }
        hub.groups
            .entry(group.to_owned())
            .or_default()
            .insert(session.id.clone());
        lock(&session.state).groups.insert(group.to_owned());
    }

    /// Removes the session from a group (idempotent).
    pub fn leave(&self, session: &Session, group: &str) {
        let mut hub = lock(&self.state);
        hub.leave_group(group, &session.id);
        lock(&session.state).groups.remove(group);
    }

    /// Publishes to every member of `group` but `exclude`. Returns how many sessions it
    /// reached. Sessions that overflow or cannot keep up are disconnected, never waited on.
    pub fn send_to_group(
        &self,
        group: &str,
        msg: &DataMessageRef<'_>,
        exclude: Option<&str>,
    ) -> usize {
        let members: Vec<Arc<Session>> = {
            let hub = lock(&self.state);
            let Some(ids) = hub.groups.get(group) else {
                return 0;
            };
            ids.iter()
                .filter(|id| Some(id.as_str()) != exclude)
                .filter_map(|id| hub.sessions.get(id).cloned())
                .collect()
        };
        let mut delivered = 0;
        let mut frames = DataFrames::new(msg);
        for session in &members {
            match session.deliver(&mut frames) {
                Ok(()) => delivered += 1,
                Err(Gone) => self.remove(&session.id),
            }
        }
        delivered
    }

    /// Deletes a session: it leaves every group and can no longer be recovered. The
    /// lifecycle hears of it once, from whichever caller actually removed it.
    pub fn remove(&self, id: &str) {
        let (session, reason) = {
            let mut hub = lock(&self.state);
            let Some(session) = hub.sessions.remove(id) else {
                return;
            };
            let (groups, reason) = {
                let mut st = lock(&session.state);
                st.closed = true;
                (std::mem::take(&mut st.groups), st.close_reason.clone())
            };
            for group in groups {
                hub.leave_group(&group, id);
            }
            if let Some(user) = &session.user_id {
                if let Some(ids) = hub.users.get_mut(user) {
                    ids.remove(id);
                    if ids.is_empty() {
                        hub.users.remove(user);
                    }
                }
            }
            (session, reason)
        };
        crate::stream::cancel_all(self, &session);
        if let Some(e) = &self.events {
            e.disconnected(self, &session, reason.as_deref().unwrap_or_default());
        }
    }

    /// Closes a session from the server side: the client gets a `disconnected` message
    /// with `reason` and a close frame with `code`, and the session is deleted.
    pub fn close(&self, id: &str, code: u16, reason: &str) {
        let session = lock(&self.state).sessions.get(id).cloned();
        if let Some(session) = session {
            lock(&session.state).shut(code, reason);
            self.remove(id);
        }
    }

    /// The socket of `generation` ended. Reliable sessions are kept for the retention
    /// window (then deleted unless recovered), others are deleted now.
    pub fn socket_closed(self: &Arc<Self>, session: &Arc<Session>, generation: u64) {
        let keep = {
            let mut st = lock(&session.state);
            if st.link.as_ref().map(|(g, _)| *g) != Some(generation) {
                return;
            }
            st.link = None;
            let keep = session.protocol.is_reliable() && !st.closed;
            if !keep && st.close_reason.is_none() {
                st.close_reason = Some("The client closed the connection".into());
            }
            keep
        };
        if !keep {
            self.remove(&session.id);
            return;
        }
        let hub = Arc::clone(self);
        let session = Arc::clone(session);
        let retention = self.limits.session_retention;
        tokio::spawn(async move {
            tokio::time::sleep(retention).await;
            let expired = {
                let mut st = lock(&session.state);
                let expired = st.link.is_none() && st.generation == generation;
                if expired && st.close_reason.is_none() {
                    st.close_reason = Some(format!(
                        "The client did not reconnect within {} s",
                        retention.as_secs()
                    ));
                }
                expired
            };
            if expired {
                hub.remove(&session.id);
            }
        });
    }

    /// Number of live or retained sessions.
    pub fn session_count(&self) -> usize {
        lock(&self.state).sessions.len()
    }
}

impl Session {
    /// The connection id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The user id from the token's `sub` (or the upstream `connect` response).
    pub fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// The negotiated subprotocol.
    pub fn protocol(&self) -> Subprotocol {
        self.protocol
    }

    /// The `Sec-WebSocket-Protocol` the client was answered with, if any.
    pub fn subprotocol(&self) -> Option<&str> {
        self.subprotocol.as_deref()
    }

    /// The permissions: the token's roles, changed by the REST API's grants and revokes.
    /// The guard is the innermost lock; drop it before taking any other.
    pub fn permissions(&self) -> MutexGuard<'_, Permissions> {
        lock(&self.permissions)
    }

    /// The upstream's opaque state for this connection (`ce-connectionState`).
    pub fn connection_state(&self) -> Option<String> {
        lock(&self.state).connection_state.clone()
    }

    /// Replaces the upstream's state (from a blocking event's `ce-connectionState`).
    pub fn set_connection_state(&self, state: String) {
        lock(&self.state).connection_state = Some(state);
    }

    /// The close code when the server ends this session: 1008 on reliable
    /// subprotocols (the session is gone, do not try to recover), else `otherwise`.
    pub fn close_code(&self, otherwise: u16) -> u16 {
        if self.protocol.is_reliable() {
            CLOSE_POLICY
        } else {
            otherwise
        }
    }

    /// The reconnection token (reliable subprotocols only).
    pub fn reconnection_token(&self) -> Option<&str> {
        self.reconnection_token.as_deref()
    }

    /// Attaches a socket's outbox, replacing (and closing) any socket still attached.
    /// Returns the socket's generation and the unacknowledged frames to replay first,
    /// taken under the same lock as the attach so no new frame slips in between.
    pub fn attach(&self, outbox: Outbox) -> Result<(u64, Vec<Message>), Gone> {
        let mut st = lock(&self.state);
        if st.closed {
            return Err(Gone);
        }
        st.generation += 1;
        let generation = st.generation;
        if let Some((_, old)) = st.link.replace((generation, outbox)) {
            old.close(1000, "Connection replaced by a recovered connection");
        }
        Ok((generation, st.sequencer.pending().cloned().collect()))
    }

    /// The client has received everything up to `sequence_id`.
    pub fn sequence_ack(&self, sequence_id: u64) {
        lock(&self.state).sequencer.ack(sequence_id);
    }

    /// Was `ack_id` processed already?
    pub fn is_duplicate(&self, ack_id: u64) -> bool {
        lock(&self.state).acks.contains(ack_id)
    }

    /// Records a processed `ack_id`.
    pub fn processed(&self, ack_id: u64) {
        lock(&self.state).acks.insert(ack_id);
    }

    /// The session's open client streams.
    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        lock(&self.streams)
    }

    /// Queues a reply (e.g. a `streamClosed` from an idle timer) on the attached
    /// socket, if any; a full queue closes it as a slow consumer.
    pub fn send_reply(&self, msg: &Downstream) {
        let Some(frame) = encode_reply(self.protocol, msg) else {
            return;
        };
        let st = lock(&self.state);
        if let Some((_, out)) = &st.link {
            if let Err(PushError::Full) = out.push(frame) {
                out.close(CLOSE_POLICY, "Slow consumer");
            }
        }
    }

    /// The groups the session is in.
    pub fn groups(&self) -> Vec<String> {
        lock(&self.state).groups.iter().cloned().collect()
    }

    /// Encodes and queues one data message. `Err(Gone)` means the session must be
    /// deleted (unacknowledged limit, or a slow non-reliable consumer).
    fn deliver(&self, frames: &mut DataFrames<'_>) -> Result<(), Gone> {
        self.deliver_until(frames, None)
    }

    /// Same, for a message dropped unsent (and not replayed) after `deadline`.
    fn deliver_until(
        &self,
        frames: &mut DataFrames<'_>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), Gone> {
        if self.protocol == Subprotocol::Raw && frames.is_bare_stream_end() {
            return Ok(());
        }
        let mut st = lock(&self.state);
        if st.closed {
            return Ok(());
        }
        let protocol = self.protocol;
        let frame = if protocol.is_reliable() {
            match st
                .sequencer
                .push_until(|id| frames.frame(protocol, Some(id)), deadline)
            {
                Ok(frame) => frame,
                Err(overflow) => {
                    st.shut(CLOSE_POLICY, &overflow.to_string());
                    return Err(Gone);
                }
            }
        } else {
            frames.frame(protocol, None)
        };
        let Some((_, out)) = &st.link else {
            return Ok(());
        };
        match out.push_until(frame, deadline) {
            Ok(()) | Err(PushError::Closed) => Ok(()),
            Err(PushError::Full) if self.protocol.is_reliable() => {
                // The frame is kept unacknowledged: the client recovers and gets it.
                out.close(CLOSE_TRY_AGAIN, "Slow consumer");
                Ok(())
            }
            Err(PushError::Full) => {
                st.shut(CLOSE_POLICY, "Slow consumer");
                Err(Gone)
            }
        }
    }
}

#[cfg(test)]
#[path = "hub_test.rs"]
mod tests;
