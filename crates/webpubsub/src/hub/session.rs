//! One client connection session: what its connection id names, its groups, its
//! reliable-session bookkeeping and the socket attached to it, if any. Everything that
//! changes a session's state is a method here; the hub calls them under its own lock
//! where group membership must change with the hub's index.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::ws::Message;
use tokio::time::Instant;

use super::stream::Streams;
use super::{lock, random_id, CLOSE_POLICY, CLOSE_TRY_AGAIN};
use crate::config::Limits;
use crate::mirror::{frame_write, Mirror, SessionWrite};
use crate::outbox::{Outbox, PushError};
use crate::permissions::Permissions;
use crate::protocol::codec::encode_reply;
use crate::protocol::frames::DataFrames;
use crate::protocol::json::Downstream;
use crate::protocol::Subprotocol;
use crate::reliable::{ProcessedAcks, ReplayLost, Sequencer};
use crate::stats::Stats;
use crate::token::ClientClaims;

/// The session was deleted: recovery must fail with 1008.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session is gone")]
pub(crate) struct Gone;

/// Why a socket could not be attached to a session; either way the client is told
/// with 1008 and the session is deleted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AttachError {
    /// The session was deleted.
    #[error(transparent)]
    Gone(#[from] Gone),
    /// The session ended, for this reason, but is not deleted yet (a recovery that
    /// races the deletion is told why, not just that it is gone).
    #[error("the session ended: {0}")]
    Ended(String),
    /// The replay buffer no longer holds every message the client has not
    /// acknowledged.
    #[error(transparent)]
    ReplayLost(#[from] ReplayLost),
}

#[path = "session_mirror.rs"]
mod mirrored;

/// An attached socket's generation, the frames to replay to it with their sequence
/// ids, and the mirror ticket they wait for.
pub(crate) type Attached = (u64, Vec<(u64, Message)>, u64);

/// The close reason of a slow consumer, also its `disconnected` message.
pub(crate) const SLOW_CONSUMER: &str =
    "Slow consumer: the client did not read the messages sent to it";

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
    /// The hub's name, for logs.
    hub: Arc<str>,
    stats: Arc<Stats>,
    /// Where a reliable session is mirrored for other nodes (`mirror.rs`), if any.
    mirror: Option<Mirror>,
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
    /// The mirror ticket of its last sequenced frame (0: none, or not mirrored).
    mirrored: u64,
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
    /// A session for `new` with no socket yet, in hub `hub`. Reliable sessions get an
    /// unguessable 256-bit reconnection token.
    pub(super) fn new(
        id: String,
        new: NewSession,
        limits: &Limits,
        (hub, stats): (Arc<str>, Arc<Stats>),
    ) -> Self {
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
                sequencer: Sequencer::new(limits.replay_buffer_bytes, limits.replay_age_bound()),
                acks: ProcessedAcks::new(limits.processed_ack_ids),
                link: None,
                generation: 0,
                closed: false,
                close_reason: None,
                connection_state: new.connection_state,
                mirrored: 0,
            }),
            streams: Mutex::new(Streams::default()),
            hub,
            stats,
            mirror: None,
        }
    }

    /// Records that the session joined `group` (the hub indexes it under its lock),
    /// unless that would put it in more than `max` groups: then `false`, nothing joined.
    pub(super) fn joined(&self, group: &str, max: usize) -> bool {
        let mut st = lock(&self.state);
        if st.groups.contains(group) {
            return true;
        }
        if st.groups.len() >= max {
            return false;
        }
        st.groups.insert(group.to_owned());
        self.mirror_groups(&mut st);
        true
    }

    /// Whether joining `group` keeps the session within `max` groups.
    pub(super) fn may_join(&self, group: &str, max: usize) -> bool {
        let st = lock(&self.state);
        st.groups.contains(group) || st.groups.len() < max
    }

    /// Records that the session left `group`.
    pub(super) fn left(&self, group: &str) {
        let mut st = lock(&self.state);
        if st.groups.remove(group) {
            self.mirror_groups(&mut st);
        }
    }

    /// Calls `f` with the session's groups, under its lock.
    pub(crate) fn with_groups<R>(&self, f: impl FnOnce(&HashSet<String>) -> R) -> R {
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
    pub(crate) fn shut(&self, code: u16, reason: &str) {
        lock(&self.state).shut(code, reason);
    }

    /// The socket of `generation` ended: detaches it. `None` when a newer socket is
    /// attached (nothing to do); else whether the session is kept for recovery: a
    /// reliable session whose replay buffer still holds every unacknowledged message.
    pub(super) fn detach(&self, generation: u64) -> Option<bool> {
        let mut st = lock(&self.state);
        if st.link.as_ref().map(|(g, _)| *g) != Some(generation) {
            return None;
        }
        st.link = None;
        let mut keep = self.protocol.is_reliable() && !st.closed;
        if keep {
            if let Err(lost) = st.sequencer.replayable() {
                self.lose_replay(&mut st, lost);
                keep = false;
            }
        }
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

    /// Grants (`allowed`) or revokes `permission` for `group` (or every group), and
    /// mirrors the result, so that it moves with the session.
    pub(crate) fn set_permission(
        &self,
        permission: crate::permissions::Permission,
        group: Option<&str>,
        allowed: bool,
    ) {
        let mut permissions = lock(&self.permissions);
        permissions.set(permission, group, allowed);
        let mirrored = self.mirror(|| SessionWrite::Roles(permissions.mirrored()));
        drop(permissions);
        if let Err(lost) = mirrored {
            self.shut(CLOSE_POLICY, &lost.to_string());
        }
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
        let mut st = lock(&self.state);
        st.connection_state = Some(state.clone());
        if self.mirror.is_some() {
            self.mirror_or_end(&mut st, SessionWrite::State(state));
        }
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
    /// Returns the socket's generation and the unacknowledged frames to replay first
    /// with their sequence ids, taken under the same lock as the attach so no new frame
    /// slips in between. A replay that would miss frames the client has not
    /// acknowledged ends the session instead: the caller deletes it and tells the
    /// client with 1008.
    /// The replay's frames reach the socket once the mirror write of the last one
    /// sequenced, the third value, is stored.
    pub(crate) fn attach(&self, outbox: Outbox) -> Result<Attached, AttachError> {
        let mut st = lock(&self.state);
        if st.closed {
            return Err(match &st.close_reason {
                Some(reason) => AttachError::Ended(reason.clone()),
                None => Gone.into(),
            });
        }
        let replay = match st.sequencer.replay(Instant::now()) {
            Ok(replay) => replay,
            Err(lost) => {
                self.lose_replay(&mut st, lost);
                return Err(lost.into());
            }
        };
        st.generation += 1;
        let generation = st.generation;
        if let Some((_, old)) = st.link.replace((generation, outbox)) {
            old.close(1000, "Connection replaced by a recovered connection");
        }
        Ok((generation, replay, st.mirrored))
    }

    /// The replay buffer can no longer serve a recovery: the session ends (its socket,
    /// if any, is closed with 1008), counted and logged.
    fn lose_replay(&self, st: &mut SessionState, lost: ReplayLost) {
        let reason = lost.to_string();
        st.shut(CLOSE_POLICY, &reason);
        self.stats.replay_lost(&self.hub, &self.id, &reason);
    }

    /// `out`, this session's socket, did not read what was sent to it: closes it as a
    /// slow consumer (counted once per socket). A reliable session stays recoverable
    /// from its replay buffer (1013); any other ends (1008). Returns whether the
    /// session ended, for the hub to delete it.
    pub(crate) fn slow_consumer(&self, out: &Outbox) -> bool {
        self.close_slow(&mut lock(&self.state), out)
    }

    fn close_slow(&self, st: &mut SessionState, out: &Outbox) -> bool {
        let reliable = self.protocol.is_reliable();
        let code = if reliable {
            CLOSE_TRY_AGAIN
        } else {
            CLOSE_POLICY
        };
        if out.close(code, SLOW_CONSUMER) {
            self.stats.slow_consumer(&self.hub, &self.id, code);
        }
        if !reliable {
            st.shut(CLOSE_POLICY, SLOW_CONSUMER);
        }
        !reliable
    }

    /// The client has received everything up to `sequence_id`.
    pub(crate) fn sequence_ack(&self, sequence_id: u64) {
        let mut st = lock(&self.state);
        st.sequencer.ack(sequence_id);
        self.mirror_trim(&mut st);
    }

    /// Was `ack_id` processed already?
    pub(crate) fn is_duplicate(&self, ack_id: u64) -> bool {
        lock(&self.state).acks.contains(ack_id)
    }

    /// Records a processed `ack_id` (`recorded`: its copy has it already, written with
    /// the send it acknowledges, [`Session::ack_record`]).
    pub(crate) fn processed(&self, ack_id: u64, recorded: bool) {
        let mut st = lock(&self.state);
        if !st.acks.contains(ack_id) {
            st.acks.insert(ack_id);
            let keep = st.acks.capacity();
            if self.mirror.is_some() && !recorded {
                self.mirror_or_end(&mut st, SessionWrite::Ack { ack_id, keep });
            }
        }
    }

    /// The record of `ack_id` for a mirrored session's copy, to be written with the
    /// send it acknowledges, fenced as one (`None`: not mirrored).
    pub(crate) fn ack_record(&self, ack_id: u64) -> Option<SessionWrite> {
        let keep = lock(&self.state).acks.capacity();
        self.mirror
            .is_some()
            .then_some(SessionWrite::Ack { ack_id, keep })
    }

    /// The session's open client streams.
    pub(crate) fn streams(&self) -> MutexGuard<'_, Streams> {
        lock(&self.streams)
    }

    /// Queues a reply (e.g. a `streamClosed` from an idle timer) on the attached
    /// socket, if any, held until the mirror write `held` is stored (0: not held); a
    /// full queue closes it as a slow consumer. Returns whether the session ended, for
    /// the hub to delete it.
    pub(crate) fn send_reply(&self, msg: &Downstream, held: u64) -> bool {
        let Some(frame) = encode_reply(self.protocol, msg) else {
            return false;
        };
        let mut st = lock(&self.state);
        let Some((_, out)) = &st.link else {
            return false;
        };
        match out.push_held(frame, held) {
            Err(PushError::Full) => {
                let out = out.clone();
                self.close_slow(&mut st, &out)
            }
            Ok(()) | Err(PushError::Closed) => false,
        }
    }

    /// The groups the session is in.
    pub(crate) fn groups(&self) -> Vec<String> {
        lock(&self.state).groups.iter().cloned().collect()
    }

    /// Encodes and queues one data message, dropped unsent (and not replayed) after
    /// `deadline` if it has one. `Err(Gone)` means the session must be deleted (a slow
    /// non-reliable consumer, or a reliable session without a socket whose replay
    /// buffer overflowed).
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
        if self.protocol.is_reliable() {
            return self.deliver_reliable(&mut st, frames, deadline);
        }
        let frame = frames.frame(self.protocol, None);
        let Some((_, out)) = &st.link else {
            return Ok(());
        };
        match out.push_until(frame, deadline) {
            Ok(()) | Err(PushError::Closed) => Ok(()),
            Err(PushError::Full) => {
                let out = out.clone();
                self.close_slow(&mut st, &out);
                Err(Gone)
            }
        }
    }

    /// Sequences a frame into the replay buffer and queues it on the socket, if any,
    /// then bounds the buffer. Without a socket, a buffer that can no longer replay in
    /// full ends the session at once: the recovery would fail anyway.
    fn deliver_reliable(
        &self,
        st: &mut SessionState,
        frames: &mut DataFrames<'_>,
        deadline: Option<Instant>,
    ) -> Result<(), Gone> {
        let now = Instant::now();
        let protocol = self.protocol;
        let (id, frame) = st
            .sequencer
            .push(|id| frames.frame(protocol, Some(id)), deadline, now);
        let mut ticket = 0;
        if self.mirror.is_some() {
            let Some(t) = self.mirror_or_end(st, frame_write(id, &frame, deadline)) else {
                return if st.link.is_none() { Err(Gone) } else { Ok(()) };
            };
            ticket = t;
            st.mirrored = t;
        }
        let written = match &st.link {
            Some((_, out)) => {
                if let Err(PushError::Full) = out.push_sequenced(frame, deadline, (id, ticket)) {
                    let out = out.clone();
                    self.close_slow(st, &out);
                }
                st.link.as_ref().map_or(0, |(_, out)| out.written())
            }
            None => 0,
        };
        let evicted = st.sequencer.trim(written, now);
        self.stats
            .replay_evicted(evicted.written, evicted.unwritten);
        if evicted.written + evicted.unwritten > 0 {
            self.mirror_trim(st);
        }
        if st.link.is_none() {
            if let Err(lost) = st.sequencer.replayable() {
                self.lose_replay(st, lost);
                return Err(Gone);
            }
        }
        Ok(())
    }
}
