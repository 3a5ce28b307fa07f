//! The hub operations behind the REST API: messages from the application server to all,
//! a group, a user or a connection; membership of connections and users; closing
//! connections; permissions; existence checks and group listing.
//!
//! Targets are resolved under the hub lock into a list of sessions, which is then
//! filtered (`excluded`, OData `filter`) and acted upon with only session locks taken, so
//! a large fan-out never holds the hub lock while encoding.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{lock, Hub, Session, TooManyGroups, CLOSE_GOING_AWAY, CLOSE_NORMAL};
use crate::filter::{Conn, Filter};
pub(crate) use crate::permissions::Permission;
use crate::protocol::json::{DataMessageRef, MessageSource};
use crate::protocol::Payload;

/// The connection (or user) an operation names does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not found")]
pub(crate) struct NotFound;

/// Why a REST join was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JoinError {
    /// No such connection, or the user has none.
    #[error(transparent)]
    NotFound(#[from] NotFound),
    /// A connection would be in more than `max_groups_per_connection` groups.
    #[error(transparent)]
    TooManyGroups(#[from] TooManyGroups),
}

/// Whom an operation applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// Every connection of the hub.
    All,
    /// The members of a group.
    Group(&'a str),
    /// The connections of a user.
    User(&'a str),
    /// One connection.
    Connection(&'a str),
}

/// Which of the target's connections: not `excluded`, and matching `filter`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Selection<'a> {
    /// Connection ids left out.
    pub excluded: &'a [String],
    /// OData filter the connections must match.
    pub filter: Option<&'a Filter>,
}

/// One entry of a group listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// The connection id.
    pub connection_id: String,
    /// Its user id, if any.
    pub user_id: Option<String>,
}

impl Selection<'_> {
    /// Does the session match? Takes the session lock for its groups.
    fn includes(&self, session: &Session) -> bool {
        if self.excluded.iter().any(|id| id == session.id()) {
            return false;
        }
        let Some(filter) = self.filter else {
            return true;
        };
        session.with_groups(|groups| {
            filter.matches(&Conn {
                connection_id: session.id(),
                user_id: session.user_id(),
                groups,
            })
        })
    }
}

impl Hub {
    /// The sessions `target` names, live or kept for recovery.
    pub(super) fn targets(&self, target: Target<'_>) -> Vec<Arc<Session>> {
        let hub = lock(&self.state);
        let by_id = |id: &String| hub.sessions.get(id).cloned();
        match target {
            Target::All => hub.sessions.values().cloned().collect(),
            Target::Group(g) => hub
                .groups
                .get(g)
                .map(|ids| ids.iter().filter_map(by_id).collect())
                .unwrap_or_default(),
            Target::User(u) => hub
                .users
                .get(u)
                .map(|ids| ids.iter().filter_map(by_id).collect())
                .unwrap_or_default(),
            Target::Connection(c) => hub.sessions.get(c).cloned().into_iter().collect(),
        }
    }

    fn selected(&self, target: Target<'_>, sel: &Selection<'_>) -> Vec<Arc<Session>> {
        let mut sessions = self.targets(target);
        sessions.retain(|s| sel.includes(s));
        sessions
    }

    /// The session of this connection id, live or kept for recovery.
    pub(crate) fn session(&self, id: &str) -> Option<Arc<Session>> {
        lock(&self.state).sessions.get(id).cloned()
    }

    /// Sends a message from the application server. Group members see it as a message
    /// from that group, everyone else as a message from the server. A `ttl` drops it for
    /// any connection that has not been sent it in time (and keeps it from being
    /// replayed later). Returns how many sessions it reached; sessions that cannot keep
    /// up are disconnected, never waited on.
    pub(crate) fn send(
        &self,
        target: Target<'_>,
        sel: &Selection<'_>,
        payload: &Payload,
        ttl: Option<Duration>,
    ) -> usize {
        let deadline = ttl.map(|t| Instant::now() + t);
        let msg = DataMessageRef {
            from: match target {
                Target::Group(_) => MessageSource::Group,
                _ => MessageSource::Server,
            },
            group: match target {
                Target::Group(g) => Some(g),
                _ => None,
            },
            from_user_id: None,
            payload,
            stream: None,
        };
        self.deliver_local(target, sel, &msg, deadline)
    }

    /// Delivers `msg` to the selected sessions of this node (see [`Hub::send`]).
    pub(crate) fn deliver_local(
        &self,
        target: Target<'_>,
        sel: &Selection<'_>,
        msg: &DataMessageRef<'_>,
        deadline: Option<Instant>,
    ) -> usize {
        self.fan_out(&self.selected(target, sel), msg, deadline)
    }

    /// Delivers `msg` to `session` alone if `sel` includes it (a session being taken
    /// over, see `mirror.rs`).
    pub(crate) fn deliver_to(
        &self,
        session: &Arc<Session>,
        sel: &Selection<'_>,
        msg: &DataMessageRef<'_>,
        deadline: Option<Instant>,
    ) -> usize {
        if !sel.includes(session) {
            return 0;
        }
        self.fan_out(std::slice::from_ref(session), msg, deadline)
    }

    /// Adds this node's connections of a target (a connection or a user) to a group,
    /// as far as their group limits allow (for another node's REST call).
    pub(crate) fn join_local(&self, target: Target<'_>, group: &str) {
        let sessions = match target {
            Target::Connection(_) | Target::User(_) => self.targets(target),
            Target::All | Target::Group(_) => return,
        };
        for s in sessions {
            // A connection at its group limit stays out (counted and logged).
            let _ = self.join(&s, group);
        }
    }

    /// Removes this node's connections of a target from a group, or from every group.
    pub(crate) fn leave_local(&self, target: Target<'_>, group: Option<&str>) {
        for s in self.targets(target) {
            match group {
                Some(g) => self.leave(&s, g),
                None => {
                    for g in s.groups() {
                        self.leave(&s, &g);
                    }
                }
            }
        }
    }

    /// Closes the selected connections: each gets a `disconnected` message with
    /// `reason`, then a close frame (1000, or 1008 on reliable subprotocols, which tells
    /// the client the session is gone rather than inviting a recovery). Returns how many.
    pub(crate) fn close_connections(
        &self,
        target: Target<'_>,
        sel: &Selection<'_>,
        reason: &str,
    ) -> usize {
        let sessions = self.selected(target, sel);
        for s in &sessions {
            self.close(s.id(), s.close_code(CLOSE_NORMAL), reason);
        }
        sessions.len()
    }

    /// Closes every session for shutdown: 1001 (going away), or 1008 on reliable
    /// subprotocols since the session will not survive the process.
    pub(crate) fn shutdown(&self, reason: &str) {
        for s in self.targets(Target::All) {
            self.close(s.id(), s.close_code(CLOSE_GOING_AWAY), reason);
        }
    }

    /// Adds a connection to a group.
    pub(crate) fn add_connection_to_group(&self, id: &str, group: &str) -> Result<(), JoinError> {
        let session = self.session(id).ok_or(NotFound)?;
        Ok(self.join(&session, group)?)
    }

    /// Removes a connection from a group (nothing to do is not an error).
    pub(crate) fn remove_connection_from_group(&self, id: &str, group: &str) {
        if let Some(session) = self.session(id) {
            self.leave(&session, group);
        }
    }

    /// Removes a connection from every group it is in.
    pub(crate) fn remove_connection_from_all_groups(&self, id: &str) {
        if let Some(session) = self.session(id) {
            for group in session.groups() {
                self.leave(&session, &group);
            }
        }
    }

    /// Adds the user's current connections to a group; later connections of the user are
    /// not added, as in the service. A user with no connection is `NotFound`; if one of
    /// them is in `max_groups_per_connection` groups already, none joins.
    pub(crate) fn add_user_to_group(&self, user: &str, group: &str) -> Result<(), JoinError> {
        let sessions = self.targets(Target::User(user));
        if sessions.is_empty() {
            return Err(NotFound.into());
        }
        Ok(self.join_all(&sessions, group)?)
    }

    /// Removes the user's connections from a group.
    pub(crate) fn remove_user_from_group(&self, user: &str, group: &str) {
        for s in self.targets(Target::User(user)) {
            self.leave(&s, group);
        }
    }

    /// Removes the user's connections from every group.
    pub(crate) fn remove_user_from_all_groups(&self, user: &str) {
        for s in self.targets(Target::User(user)) {
            for group in s.groups() {
                self.leave(&s, &group);
            }
        }
    }

    /// Adds every connection matching `filter` (all when `None`) to each group.
    pub(crate) fn add_filtered_to_groups(&self, groups: &[String], filter: Option<&Filter>) {
        self.filtered_membership(groups, filter, true);
    }

    /// Removes every connection matching `filter` (all when `None`) from each group.
    pub(crate) fn remove_filtered_from_groups(&self, groups: &[String], filter: Option<&Filter>) {
        self.filtered_membership(groups, filter, false);
    }

    fn filtered_membership(&self, groups: &[String], filter: Option<&Filter>, join: bool) {
        let sel = Selection {
            excluded: &[],
            filter,
        };
        for s in self.selected(Target::All, &sel) {
            for g in groups {
                if join {
                    // A connection at its group limit stays out (counted and logged).
                    let _ = self.join(&s, g);
                } else {
                    self.leave(&s, g);
                }
            }
        }
    }

    /// Is there such a connection (live, or kept for recovery)?
    pub(crate) fn has_connection(&self, id: &str) -> bool {
        lock(&self.state).sessions.contains_key(id)
    }

    /// Does the group have members?
    pub(crate) fn has_group(&self, group: &str) -> bool {
        lock(&self.state).groups.contains_key(group)
    }

    /// Does the user have connections?
    pub(crate) fn has_user(&self, user: &str) -> bool {
        lock(&self.state).users.contains_key(user)
    }

    /// Grants a permission, for one group or (`None`) all groups.
    pub(crate) fn grant_permission(
        &self,
        id: &str,
        permission: Permission,
        group: Option<&str>,
    ) -> Result<(), NotFound> {
        let session = self.session(id).ok_or(NotFound)?;
        session.set_permission(permission, group, true);
        Ok(())
    }

    /// Revokes a permission, for one group or (`None`) every grant of it. A missing
    /// connection is not an error, as in the service.
    pub(crate) fn revoke_permission(&self, id: &str, permission: Permission, group: Option<&str>) {
        if let Some(session) = self.session(id) {
            session.set_permission(permission, group, false);
        }
    }

    /// Does the connection have the permission for `group` (or, with `None`, for every
    /// group)? A missing connection has none.
    pub(crate) fn check_permission(
        &self,
        id: &str,
        permission: Permission,
        group: Option<&str>,
    ) -> bool {
        self.session(id)
            .is_some_and(|s| s.permissions().has(permission, group))
    }

    /// Up to `limit` members of `group` whose connection ids sort after `after`, and
    /// whether more follow.
    pub(crate) fn list_group(
        &self,
        group: &str,
        after: Option<&str>,
        limit: usize,
    ) -> (Vec<Member>, bool) {
        let hub = lock(&self.state);
        let Some(ids) = hub.groups.get(group) else {
            return (Vec::new(), false);
        };
        let mut rest = match after {
            Some(a) => {
                ids.range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
            }
            None => ids.range::<str, _>(..),
        };
        let page: Vec<Member> = rest
            .by_ref()
            .take(limit)
            .map(|id| Member {
                connection_id: id.clone(),
                user_id: hub
                    .sessions
                    .get(id)
                    .and_then(|s| s.user_id().map(str::to_owned)),
            })
            .collect();
        let more = rest.next().is_some();
        (page, more)
    }
}

#[cfg(test)]
#[path = "admin_test.rs"]
mod tests;
