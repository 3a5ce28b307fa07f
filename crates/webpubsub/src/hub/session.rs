//! One client connection session: what its connection id names, its groups, its
//! reliable-session bookkeeping and the socket attached to it, if any. Everything that
//! changes a session's state is a method here; the hub calls them under its own lock
//! where group membership must change with the hub's index.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::Message;
use tokio::time::Instant;

use super::stream::Streams;
use super::{lock, random_id, CLOSE_POLICY, CLOSE_TRY_AGAIN};
use crate::config::Limits;
use crate::outbox::{Outbox, PushError};
use crate::permissions::Permissions;
use crate::protocol::codec::encode_reply;
use crate::protocol::frames::DataFrames;
use crate::protocol::json::Downstream;
use crate::protocol::Subprotocol;
use crate::reliable::{ProcessedAcks, Sequencer};
use crate::token::ClientClaims;

/// The session was deleted: recovery must fail with 1008.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session is gone")]
pub(crate) struct Gone;

/// What a new session is made of: the validated token's claims (with any overrides from
/// the upstream `connect` event already applied) and the negotiated subprotocol.
#[derive(Debug, Clone)]
pub(crate) struct NewSession {
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
pub(crate) struct Session {
    id: String,
    user_id: Option<String>,
    protocol: Subprotocol,
    subprotocol: Option<String>,
    permissions: Mutex<Permissions>,
    reconnection_token: Option<String>,
    state: Mutex<SessionState>,
    /// Open client streams; locked alone (see [`super::stream`]).
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

impl Session {
    /// A session for `new` with no socket yet. Reliable sessions get an unguessable
    /// 256-bit reconnection token.
    pub(super) fn new(id: String, new: NewSession, limits: &Limits) -> Self {
        let protocol = new.protocol;
        Self {
            id,
            user_id: new.claims.user_id.clone(),
            protocol,
            subprotocol: new.subprotocol,
            permissions: Mutex::new(new.claims.permissions()),
            reconnection_token: protocol.is_reliable().then(|| random_id(32)),
            state: Mutex::new(SessionState {
                groups: HashSet::new(),
                sequencer: Sequencer::new(limits.max_unacked_messages, limits.max_unacked_bytes),
                acks: ProcessedAcks::new(limits.processed_ack_ids),
                link: None,
                generation: 0,
                closed: false,
                close_reason: None,
                connection_state: new.connection_state,
            }),
            streams: Mutex::new(Streams::default()),
        }
    }

    /// Records that the session joined `group` (the hub indexes it under its lock).
    pub(super) fn joined(&self, group: &str) {
        lock(&self.state).groups.insert(group.to_owned());
    }

    /// Records that the session left `group`.
    pub(super) fn left(&self, group: &str) {
        lock(&self.state).groups.remove(group);
    }

    /// Calls `f` with the session's groups, under its lock.
    pub(super) fn with_groups<R>(&self, f: impl FnOnce(&HashSet<String>) -> R) -> R {
        f(&lock(&self.state).groups)
    }

    /// Marks the session ended: returns the groups it was in, for the hub to unindex,
    /// and why it ended.
    pub(super) fn end(&self) -> (HashSet<String>, Option<String>) {
        let mut st = lock(&self.state);
        st.closed = true;
        (std::mem::take(&mut st.groups), st.close_reason.clone())
    }

    /// Marks the session closed and asks its socket, if any, to close.
    pub(super) fn shut(&self, code: u16, reason: &str) {
        lock(&self.state).shut(code, reason);
    }

    /// The socket of `generation` ended: detaches it. `None` when a newer socket is
    /// attached (nothing to do); else whether the session is kept for recovery.
    pub(super) fn detach(&self, generation: u64) -> Option<bool> {
        let mut st = lock(&self.state);
        if st.link.as_ref().map(|(g, _)| *g) != Some(generation) {
            return None;
        }
        st.link = None;
        let keep = self.protocol.is_reliable() && !st.closed;
        if !keep && st.close_reason.is_none() {
            st.close_reason = Some("The client closed the connection".into());
        }
        Some(keep)
    }

    /// The retention window after the socket of `generation` ended has passed: whether
    /// the session is still unrecovered and must be deleted.
    pub(super) fn expired(&self, generation: u64, retention: Duration) -> bool {
        let mut st = lock(&self.state);
        let expired = st.link.is_none() && st.generation == generation;
        if expired && st.close_reason.is_none() {
            st.close_reason = Some(format!(
                "The client did not reconnect within {} s",
                retention.as_secs()
            ));
        }
        expired
    }

    /// The connection id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The user id from the token's `sub` (or the upstream `connect` response).
    pub(crate) fn user_id(&self) -> Option<&str> {
        self.user_id.as_deref()
    }

    /// The negotiated subprotocol.
    pub(crate) fn protocol(&self) -> Subprotocol {
        self.protocol
    }

    /// The `Sec-WebSocket-Protocol` the client was answered with, if any.
    pub(crate) fn subprotocol(&self) -> Option<&str> {
        self.subprotocol.as_deref()
    }

    /// The permissions: the token's roles, changed by the REST API's grants and revokes.
    /// The guard is the innermost lock; drop it before taking any other.
    pub(crate) fn permissions(&self) -> MutexGuard<'_, Permissions> {
        lock(&self.permissions)
    }

    /// The upstream's opaque state for this connection (`ce-connectionState`).
    pub(crate) fn connection_state(&self) -> Option<String> {
        lock(&self.state).connection_state.clone()
    }

    /// Replaces the upstream's state (from a blocking event's `ce-connectionState`).
    pub(crate) fn set_connection_state(&self, state: String) {
        lock(&self.state).connection_state = Some(state);
    }

    /// The close code when the server ends this session: 1008 on reliable
    /// subprotocols (the session is gone, do not try to recover), else `otherwise`.
    pub(crate) fn close_code(&self, otherwise: u16) -> u16 {
        if self.protocol.is_reliable() {
            CLOSE_POLICY
        } else {
            otherwise
        }
    }

    /// The reconnection token (reliable subprotocols only).
    pub(crate) fn reconnection_token(&self) -> Option<&str> {
        self.reconnection_token.as_deref()
    }

    /// Attaches a socket's outbox, replacing (and closing) any socket still attached.
    /// Returns the socket's generation and the unacknowledged frames to replay first,
    /// taken under the same lock as the attach so no new frame slips in between.
    pub(crate) fn attach(&self, outbox: Outbox) -> Result<(u64, Vec<Message>), Gone> {
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
    pub(crate) fn sequence_ack(&self, sequence_id: u64) {
        lock(&self.state).sequencer.ack(sequence_id);
    }

    /// Was `ack_id` processed already?
    pub(crate) fn is_duplicate(&self, ack_id: u64) -> bool {
        lock(&self.state).acks.contains(ack_id)
    }

    /// Records a processed `ack_id`.
    pub(crate) fn processed(&self, ack_id: u64) {
        lock(&self.state).acks.insert(ack_id);
    }

    /// The session's open client streams.
    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        lock(&self.streams)
    }

    /// Queues a reply (e.g. a `streamClosed` from an idle timer) on the attached
    /// socket, if any; a full queue closes it as a slow consumer.
    pub(crate) fn send_reply(&self, msg: &Downstream) {
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
    pub(crate) fn groups(&self) -> Vec<String> {
        lock(&self.state).groups.iter().cloned().collect()
    }

    /// Encodes and queues one data message, dropped unsent (and not replayed) after
    /// `deadline` if it has one. `Err(Gone)` means the session must be deleted
    /// (unacknowledged limit, or a slow non-reliable consumer).
    pub(super) fn deliver(
        &self,
        frames: &mut DataFrames<'_>,
        deadline: Option<Instant>,
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
