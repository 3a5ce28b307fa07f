//! Sessions taken over from another node and handed over to one (see `mirror.rs`).

use std::sync::Arc;

use super::{lock, Hub, NewSession, Session, TooManyGroups, CLOSE_NORMAL, CLOSE_SERVICE_RESTART};
use crate::mirror::Restored;

impl Hub {
    /// Takes over a session from another node (`mirror.rs`): rebuilt from `r` with the
    /// client's `token`, `replay` applied to it alone, then put in the hub with its
    /// user and groups, while no send is between its broadcast and its delivery.
    pub(crate) fn adopt(
        &self,
        r: Restored,
        token: String,
        protocol: crate::protocol::Subprotocol,
        replay: impl FnOnce(&Arc<Session>),
    ) -> Arc<Session> {
        let new = NewSession {
            connection_id: Some(r.id.clone()),
            claims: crate::token::ClientClaims {
                user_id: r.user.clone(),
                roles: r.roles.clone(),
                groups: Vec::new(),
            },
            protocol,
            subprotocol: protocol.name().map(str::to_owned),
            connection_state: r.connection_state.clone(),
        };
        let env = (Arc::clone(&self.name), Arc::clone(&self.stats));
        let mut session = Session::new(r.id.clone(), new, &self.limits, env);
        session.restore(&r, token, self.mirror());
        let session = Arc::new(session);
        let _order = self.order.write();
        replay(&session);
        let mut hub = lock(&self.state);
        self.insert(&mut hub, &session);
        for group in session.groups() {
            let members = hub.groups.entry(group.clone()).or_default();
            members.insert(session.id().to_owned());
        }
        session
    }

    /// Joins a session to a group, whether or not it is in the hub yet (a session
    /// being taken over).
    pub(crate) fn join_adopted(&self, session: &Session, group: &str) -> Result<(), TooManyGroups> {
        let max = self.limits.max_groups_per_connection;
        let mut hub = lock(&self.state);
        if hub.sessions.contains_key(session.id()) {
            return self.join_locked(&mut hub, session, group);
        }
        drop(hub);
        if session.joined(group, max) {
            Ok(())
        } else {
            Err(TooManyGroups(max))
        }
    }

    /// Another node took the session over: it is forgotten here without ending (no
    /// `disconnected` event, the mirror kept, its client streams not ended), then its
    /// socket, if any, closed. In that order: a socket that closes first would find the
    /// session still here and end it.
    pub(crate) fn hand_over(&self, id: &str) {
        if let Some(session) = self.session(id) {
            self.remove_with(id, false);
            session.shut(
                CLOSE_NORMAL,
                "Connection replaced by a recovered connection",
            );
        }
    }

    /// At a shutdown that hands them to other nodes: the mirrored sessions are forgotten
    /// here without ending (no `disconnected`, the mirror kept), while no send is
    /// between its broadcast and its delivery, so each send either reached them and
    /// is queued for their mirror, or did not and is replayed by their next node.
    /// Their sockets stay open until [`Hub::release`] closes them, once the mirror is
    /// written.
    pub(crate) fn release_mirrored(&self) -> Vec<Arc<Session>> {
        let _order = self.order.write();
        let mirrored: Vec<Arc<Session>> = (lock(&self.state).sessions.values())
            .filter(|s| s.is_mirrored())
            .cloned()
            .collect();
        for session in &mirrored {
            self.remove_with(session.id(), false);
        }
        mirrored
    }

    /// Closes a released session's socket with 1012: its client recovers it, on
    /// another node.
    pub(crate) fn release(session: &Session) {
        session.shut(
            CLOSE_SERVICE_RESTART,
            "The server is shutting down: recover the session on another node",
        );
    }
}
