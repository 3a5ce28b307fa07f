//! A session's mirror in the cluster's store (`crate::mirror`): what it writes there
//! and what a session taken over from another node is rebuilt from. A write that
//! cannot be queued ends the session, since nothing sent to it after could be numbered
//! the same way by the node that would take it over.

use tokio::time::Instant;

use super::{Session, SessionState};
use crate::hub::{lock, CLOSE_POLICY};
use crate::mirror::{stored_frame, token_digest, Mirror, Restored, SessionWrite};
use crate::permissions::Permissions;

/// A reliable session's change could not be queued for the cluster's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the session's changes did not fit the queue to the cluster's store, so it cannot be \
     recovered"
)]
pub(crate) struct MirrorLost;

impl Session {
    /// Mirrors the session (a reliable one) through `mirror` from now on, starting with
    /// its creation. If that cannot be queued it is not mirrored: the store has no copy,
    /// so no other node can take it over.
    pub(in crate::hub) fn mirror_to(&mut self, mirror: Mirror, roles: Vec<String>) {
        if let Some(token) = &self.reconnection_token {
            let open = mirror.write(
                &self.id,
                SessionWrite::Open {
                    token: token_digest(token),
                    protocol: self.protocol.name().unwrap_or_default().to_owned(),
                    user: self.user_id.clone(),
                    roles,
                },
            );
            let state = self
                .state
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .connection_state
                .clone();
            let state = match state {
                Some(state) if open.is_ok() => mirror.write(&self.id, SessionWrite::State(state)),
                _ => open,
            };
            if state.is_ok() {
                self.mirror = Some(mirror);
            }
        }
    }

    /// A session taken over from another node (`mirror.rs`): the client's token, the
    /// stored groups, processed ackIds and replay buffer; mirrored through `mirror`.
    pub(in crate::hub) fn restore(&mut self, r: &Restored, token: String, mirror: Option<Mirror>) {
        self.reconnection_token = Some(token);
        self.mirror = mirror;
        *lock(&self.permissions) = Permissions::from_mirrored(&r.roles);
        let st = self
            .state
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.groups = r.groups.iter().cloned().collect();
        // Its first socket was on another node: attaching here is a recovery.
        st.generation = 1;
        for ack in &r.acks {
            st.acks.insert(*ack);
        }
        let frames = r
            .frames
            .iter()
            .cloned()
            .filter_map(|f| stored_frame(self.protocol, f))
            .collect();
        st.sequencer
            .restore((r.next, r.acked, r.evicted_through), frames, Instant::now());
        self.streams
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .restore(&r.streams, Instant::now());
    }

    /// Queues `write` for the mirror, if the session has one: its ticket (0: none).
    pub(super) fn mirror(&self, write: impl FnOnce() -> SessionWrite) -> Result<u64, MirrorLost> {
        match &self.mirror {
            Some(m) => m.write(&self.id, write()).map_err(|_| MirrorLost),
            None => Ok(0),
        }
    }

    /// [`Session::mirror`] under the session's lock: a write that cannot be queued
    /// ends the session (its copy is lost, and nothing it is sent after could be
    /// numbered the same way by another node).
    pub(super) fn mirror_or_end(&self, st: &mut SessionState, write: SessionWrite) -> Option<u64> {
        match self.mirror(|| write) {
            Ok(ticket) => Some(ticket),
            Err(lost) => {
                st.shut(CLOSE_POLICY, &lost.to_string());
                None
            }
        }
    }

    /// Queues a change of one of its client streams (`hub/stream.rs`): the ticket its
    /// replies wait for (0: not mirrored). Not under the stream table's lock: a write
    /// that cannot be queued ends the session, under its own lock.
    pub(in crate::hub) fn mirror_stream(&self, write: impl FnOnce() -> SessionWrite) -> u64 {
        match self.mirror(write) {
            Ok(ticket) => ticket,
            Err(lost) => {
                lock(&self.state).shut(CLOSE_POLICY, &lost.to_string());
                0
            }
        }
    }

    pub(super) fn mirror_groups(&self, st: &mut SessionState) {
        if self.mirror.is_some() {
            let groups = SessionWrite::Groups(st.groups.iter().cloned().collect());
            self.mirror_or_end(st, groups);
        }
    }

    pub(super) fn mirror_trim(&self, st: &mut SessionState) {
        if self.mirror.is_some() {
            let (first, acked, evicted_through) = st.sequencer.window();
            let trim = SessionWrite::Trim {
                first,
                acked,
                evicted_through,
            };
            self.mirror_or_end(st, trim);
        }
    }

    /// What the socket's outbound queue waits on before a frame whose mirror write is
    /// not stored yet (`None`: not mirrored, nothing waits).
    pub(crate) fn gate(&self) -> Option<crate::outbox::Gate> {
        self.mirror.as_ref().map(Mirror::gate)
    }

    /// Whether the session is mirrored into the cluster (recoverable on another node).
    pub(crate) fn is_mirrored(&self) -> bool {
        self.mirror.is_some()
    }

    /// The session ended here for good: the mirror forgets it.
    pub(in crate::hub) fn mirror_delete(&self) {
        // Not queued: the copy is marked lost, so no other node serves it either.
        let _ = self.mirror(|| SessionWrite::Delete);
    }
}

#[cfg(test)]
#[path = "session_mirror_test.rs"]
mod tests;
