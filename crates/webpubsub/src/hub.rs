//! Hubs, groups and connection sessions.
//!
//! A [`Session`] is what a client's connection id names. On reliable subprotocols it
//! outlives its socket: when the socket drops the session is kept for the retention
//! window with its groups, processed ackIds and unacknowledged messages, and a socket
//! presenting the connection id and reconnection token takes it over. On the other
//! subprotocols the session ends with its socket.
//!
//! Locking: `std::sync::Mutex` everywhere, held for short sections with no `.await`
//! inside (an async mutex would only add cost). Order is hub, then session; a session
//! lock is never held while taking the hub lock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::ws::Message;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

use crate::config::Limits;
use crate::outbox::{Outbox, PushError};
use crate::permissions::Permissions;
use crate::protocol::codec::encode_data;
use crate::protocol::json::DataMessageRef;
use crate::protocol::Subprotocol;
use crate::session::{ProcessedAcks, Sequencer};
use crate::token::ClientClaims;

/// Close code: policy violation; for reliable clients it means "the session is gone".
pub const CLOSE_POLICY: u16 = 1008;
/// Close code: try again later; a reliable client recovers its session.
pub const CLOSE_TRY_AGAIN: u16 = 1013;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A hub: its sessions and groups.
#[derive(Debug)]
pub struct Hub {
    name: String,
    limits: Limits,
    state: Mutex<HubState>,
}

#[derive(Debug, Default)]
struct HubState {
    sessions: HashMap<String, Arc<Session>>,
    groups: HashMap<String, HashSet<String>>,
}

/// The session was deleted: recovery must fail with 1008.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session is gone")]
pub struct Gone;

/// One client connection session.
#[derive(Debug)]
pub struct Session {
    id: String,
    user_id: Option<String>,
    protocol: Subprotocol,
    permissions: Permissions,
    reconnection_token: Option<String>,
    state: Mutex<SessionState>,
}

#[derive(Debug)]
struct SessionState {
    groups: HashSet<String>,
    sequencer: Sequencer,
    acks: ProcessedAcks,
    link: Option<(u64, Outbox)>,
    generation: u64,
    closed: bool,
}

fn random_id(bytes: usize) -> String {
    let raw: Vec<u8> = (0..bytes).map(|_| rand::random::<u8>()).collect();
    URL_SAFE_NO_PAD.encode(raw)
}

/// Comparison whose time does not depend on where the strings differ.
fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Hub {
    /// An empty hub.
    pub fn new(name: &str, limits: Limits) -> Self {
        Self {
            name: name.to_owned(),
            limits,
            state: Mutex::new(HubState::default()),
        }
    }

    /// The hub's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Creates a session for a validated token and joins its initial groups. Reliable
    /// sessions get an unguessable 256-bit reconnection token.
    pub fn create_session(&self, claims: &ClientClaims, protocol: Subprotocol) -> Arc<Session> {
        let session = Arc::new(Session {
            id: random_id(16),
            user_id: claims.user_id.clone(),
            protocol,
            permissions: claims.permissions(),
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
            }),
        });
        lock(&self.state)
            .sessions
            .insert(session.id.clone(), session.clone());
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
        if let Some(members) = hub.groups.get_mut(group) {
            members.remove(&session.id);
            if members.is_empty() {
                hub.groups.remove(group);
            }
        }
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
        for session in &members {
            match session.deliver(msg) {
                Ok(()) => delivered += 1,
                Err(Gone) => self.remove(&session.id),
            }
        }
        delivered
    }

    /// Deletes a session: it leaves every group and can no longer be recovered.
    pub fn remove(&self, id: &str) {
        let mut hub = lock(&self.state);
        let Some(session) = hub.sessions.remove(id) else {
            return;
        };
        let groups = {
            let mut st = lock(&session.state);
            st.closed = true;
            std::mem::take(&mut st.groups)
        };
        for group in groups {
            if let Some(members) = hub.groups.get_mut(&group) {
                members.remove(id);
                if members.is_empty() {
                    hub.groups.remove(&group);
                }
            }
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
            session.protocol.is_reliable() && !st.closed
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
                let st = lock(&session.state);
                st.link.is_none() && st.generation == generation
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

    /// The user id from the token's `sub`.
    pub fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// The negotiated subprotocol.
    pub fn protocol(&self) -> Subprotocol {
        self.protocol
    }

    /// The token's permissions.
    pub fn permissions(&self) -> &Permissions {
        &self.permissions
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

    /// The groups the session is in.
    pub fn groups(&self) -> Vec<String> {
        lock(&self.state).groups.iter().cloned().collect()
    }

    /// Encodes and queues one data message. `Err(Gone)` means the session must be
    /// deleted (unacknowledged limit, or a slow non-reliable consumer).
    fn deliver(&self, msg: &DataMessageRef<'_>) -> Result<(), Gone> {
        let mut st = lock(&self.state);
        if st.closed {
            return Ok(());
        }
        let protocol = self.protocol;
        let frame = if protocol.is_reliable() {
            match st.sequencer.push(|id| encode_data(protocol, msg, Some(id))) {
                Ok(frame) => frame,
                Err(overflow) => {
                    st.closed = true;
                    if let Some((_, out)) = &st.link {
                        out.close(CLOSE_POLICY, overflow.to_string());
                    }
                    return Err(Gone);
                }
            }
        } else {
            encode_data(protocol, msg, None)
        };
        let Some((_, out)) = &st.link else {
            return Ok(());
        };
        match out.push(frame) {
            Ok(()) | Err(PushError::Closed) => Ok(()),
            Err(PushError::Full) if self.protocol.is_reliable() => {
                // The frame is kept unacknowledged: the client recovers and gets it.
                out.close(CLOSE_TRY_AGAIN, "Slow consumer");
                Ok(())
            }
            Err(PushError::Full) => {
                out.close(CLOSE_POLICY, "Slow consumer");
                st.closed = true;
                Err(Gone)
            }
        }
    }
}

#[cfg(test)]
#[path = "hub_test.rs"]
mod tests;
