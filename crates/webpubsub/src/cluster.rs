//! Web PubSub across several statehub nodes: the seam.
//!
//! A hub's sessions live on the node their socket reached; groups and users span nodes.
//! What one node's REST API or clients do to connections elsewhere travels as an
//! [`Operation`]: encoded here, handed to the [`Cluster`] (which carries it to every other
//! node, in the order this node handed them over), and applied there by
//! [`crate::WebPubSub::apply_remote`] to that node's own sessions. The origin applies it to
//! its own sessions directly. So a send reaches every member once: its own node's
//! members from the origin, every other node's from that node.
//!
//! Which node holds a connection, a user or a group is kept in an index the hubs update
//! when one appears on or leaves this node ([`Cluster::index`]); the REST API's existence
//! checks and joins of connections on other nodes ask it ([`Cluster::exists`]).
//!
//! Without a cluster (a single node, the default) a hub has no [`Cluster`] and nothing
//! here runs: every check is one `Option` test.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;
use std::{future::Future, pin::Pin};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use crate::filter::Filter;
use crate::hub::admin::{Permission, Selection, Target};
use crate::hub::{Hub, Session};
use crate::mirror::{with_provenance, ClaimError, Provenance, SessionWrite};
use crate::protocol::data::DataType;
use crate::protocol::json::{DataMessageRef, MessageSource};
use crate::protocol::Payload;

/// Carries operations to the other nodes and keeps the index of who holds what.
/// Implemented over Redis by `statehub-webpubsub-redis`.
pub trait Cluster: Send + Sync + Debug {
    /// Hands an encoded operation to every other node, after every one handed over
    /// before. Must not block: it queues. An `Err` means the other nodes will not get
    /// it (the caller refuses the request).
    /// Returns the operation's number among this node's (from 1, in the order handed
    /// over).
    fn broadcast(&self, operation: Vec<u8>) -> Result<u64, ClusterError>;
    /// Resolves once this node's operations up to `seq` are where the other nodes read
    /// them (they survive this process); `Err` if that cannot be known in time.
    fn written(&self, seq: u64) -> Written;
    /// Records that this node now holds (`present`) or no longer holds `item` of `hub`.
    /// Must not block (called under the hub's lock).
    fn index(&self, hub: &str, item: Item<'_>, present: bool);
    /// Whether a live node other than this one holds `item` of `hub`. May block (called
    /// on a blocking thread).
    fn exists(&self, hub: &str, item: Item<'_>) -> Result<bool, ClusterError>;
    /// Mirrors a change of a reliable session this node holds (see `mirror.rs`), after
    /// every write and operation handed over before. Must not block (called under the
    /// session's lock); a write that cannot be queued makes the mirror refuse the
    /// session's recovery elsewhere rather than serve it incomplete.
    fn session(&self, hub: &str, id: &str, write: SessionWrite);
    /// Takes the mirrored session `id` over for this node: checks the token's digest
    /// and subprotocol, fences its previous owner and appends `marker` (a `claimed`
    /// operation) to the operations, after every operation this node handed over
    /// before. On success this node's reader later hands the session to
    /// [`crate::WebPubSub::restore`]. May block.
    fn claim(
        &self,
        hub: &str,
        id: &str,
        token_digest: &str,
        protocol: &str,
        marker: Vec<u8>,
    ) -> Result<(), ClaimError>;
    /// This node's operations handed over since its claim numbered `claim` (not yet
    /// served by the reader), with their numbers, in order; `None` if more were handed
    /// over than it keeps.
    fn sent_after(&self, claim: u64) -> Option<Vec<(u64, Vec<u8>)>>;
}

/// What [`Cluster::written`] returns.
pub type Written = Pin<Box<dyn Future<Output = Result<(), ClusterError>> + Send>>;

/// What the index knows a node holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Item<'a> {
    /// A session (live or kept for recovery).
    Connection(&'a str),
    /// A user with at least one session.
    User(&'a str),
    /// A group with at least one member.
    Group(&'a str),
}

/// What one hub of this node holds, for the index ([`crate::WebPubSub::held`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    /// Its sessions' connection ids.
    pub connections: Vec<String>,
    /// Users with a session.
    pub users: Vec<String>,
    /// Groups with a member.
    pub groups: Vec<String>,
}

/// The other nodes cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster's store is out of reach.
    #[error("the cluster is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// More operations wait to be handed over than the queue holds.
    #[error("{0} operations already wait to reach the other nodes")]
    Backlog(usize),
}

/// Whom an operation names, as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum To {
    All,
    Group(String),
    User(String),
    Connection(String),
}

impl To {
    pub(crate) fn from(target: Target<'_>) -> Self {
        match target {
            Target::All => To::All,
            Target::Group(g) => To::Group(g.to_owned()),
            Target::User(u) => To::User(u.to_owned()),
            Target::Connection(c) => To::Connection(c.to_owned()),
        }
    }

    fn target(&self) -> Target<'_> {
        match self {
            To::All => Target::All,
            To::Group(g) => Target::Group(g),
            To::User(u) => Target::User(u),
            To::Connection(c) => Target::Connection(c),
        }
    }
}

/// What one node asks the others to do to their sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub(crate) enum Operation {
    /// A message from the application server (`from_user: None`) or a client's
    /// `sendToGroup` (the sender's user id, if any).
    #[serde(rename_all = "camelCase")]
    Send {
        hub: String,
        to: To,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        excluded: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filter: Option<String>,
        data_type: DataType,
        data: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_user: Option<String>,
    },
    /// Add a connection or a user's connections to a group.
    Join { hub: String, to: To, group: String },
    /// Remove a connection or a user's connections from a group (`None`: from all).
    Leave {
        hub: String,
        to: To,
        group: Option<String>,
    },
    /// Add (`join`) or remove the connections matching `filter` to or from `groups`.
    Groups {
        hub: String,
        groups: Vec<String>,
        filter: Option<String>,
        join: bool,
    },
    /// Grant (`allowed`) or revoke a connection's permission, for one group or all.
    #[serde(rename_all = "camelCase")]
    Permission {
        hub: String,
        connection: String,
        permission: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<String>,
        allowed: bool,
    },
    /// Another node took this reliable session over: forget it here.
    Claimed { hub: String, id: String },
    /// Close the target's connections.
    Close {
        hub: String,
        to: To,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        excluded: Vec<String>,
        reason: String,
    },
}

/// A payload as it travels: its `dataType` and its data (bytes as base64).
pub(crate) fn encode_payload(payload: &Payload) -> (DataType, Value) {
    let data = match payload {
        Payload::Json(v) => v.clone(),
        Payload::Text(s) => Value::String(s.clone()),
        Payload::Binary(b) | Payload::Protobuf(b) => Value::String(BASE64.encode(b)),
    };
    (payload.data_type(), data)
}

impl Operation {
    /// A send of `payload` to `target`, as [`Hub::send`] takes it.
    pub(crate) fn send(
        hub: &Hub,
        target: Target<'_>,
        sel: &SentSelection<'_>,
        payload: &Payload,
        ttl: Option<Duration>,
        from_user: Option<&str>,
    ) -> Self {
        let (data_type, data) = encode_payload(payload);
        Operation::Send {
            hub: hub.name().to_owned(),
            to: To::from(target),
            excluded: sel.excluded.to_vec(),
            filter: sel.filter.map(str::to_owned),
            data_type,
            data,
            ttl_ms: ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            from_user: from_user.map(str::to_owned),
        }
    }

    fn hub(&self) -> &str {
        match self {
            Operation::Send { hub, .. }
            | Operation::Join { hub, .. }
            | Operation::Leave { hub, .. }
            | Operation::Groups { hub, .. }
            | Operation::Claimed { hub, .. }
            | Operation::Permission { hub, .. }
            | Operation::Close { hub, .. } => hub,
        }
    }

    /// Applies an operation from another node to this node's sessions of `hub`.
    fn apply(self, hub: &Hub) {
        match self {
            Operation::Send {
                to,
                excluded,
                filter,
                data_type,
                data,
                ttl_ms,
                from_user,
                ..
            } => {
                let Ok(payload) = Payload::from_json(data_type, data) else {
                    tracing::warn!("web pubsub: a send from another node has invalid data");
                    return;
                };
                let filter = filter.as_deref().and_then(|f| Filter::parse(f).ok());
                let sel = Selection {
                    excluded: &excluded,
                    filter: filter.as_ref(),
                };
                let deadline = deadline(ttl_ms);
                let msg = sent_message(&to, from_user.as_deref(), &payload);
                hub.deliver_local(to.target(), &sel, &msg, deadline);
            }
            Operation::Join { to, group, .. } => hub.join_local(to.target(), &group),
            Operation::Leave { to, group, .. } => hub.leave_local(to.target(), group.as_deref()),
            Operation::Groups {
                groups,
                filter,
                join,
                ..
            } => {
                let filter = filter.as_deref().and_then(|f| Filter::parse(f).ok());
                if join {
                    hub.add_filtered_to_groups(&groups, filter.as_ref());
                } else {
                    hub.remove_filtered_from_groups(&groups, filter.as_ref());
                }
            }
            Operation::Close {
                to,
                excluded,
                reason,
                ..
            } => {
                let sel = Selection {
                    excluded: &excluded,
                    filter: None,
                };
                hub.close_connections(to.target(), &sel, &reason);
            }
            Operation::Claimed { id, .. } => hub.hand_over(&id),
            Operation::Permission {
                connection,
                permission,
                group,
                allowed,
                ..
            } => {
                if let Some(session) = hub.session(&connection) {
                    set_permission(&session, &permission, group.as_deref(), allowed);
                }
            }
        }
    }

    /// A grant or revoke of `connection`'s permission, as the REST API takes it.
    pub(crate) fn permission(
        hub: &Hub,
        connection: &str,
        permission: Permission,
        group: Option<String>,
        allowed: bool,
    ) -> Self {
        let name = match permission {
            Permission::JoinLeaveGroup => "joinLeaveGroup",
            Permission::SendToGroup => "sendToGroup",
        };
        Operation::Permission {
            hub: hub.name().to_owned(),
            connection: connection.to_owned(),
            permission: name.to_owned(),
            group,
            allowed,
        }
    }
}

fn set_permission(session: &Session, permission: &str, group: Option<&str>, allowed: bool) {
    if let Some(p) = Permission::parse(permission) {
        session.permissions().set(p, group, allowed);
    }
}

/// The `claimed` operation of session `id`, as [`Cluster::claim`] appends it.
pub(crate) fn claimed_marker(hub: &str, id: &str) -> Vec<u8> {
    let op = Operation::Claimed {
        hub: hub.to_owned(),
        id: id.to_owned(),
    };
    serde_json::to_vec(&op).unwrap_or_default()
}

/// Whether `session` is among `to`'s connections.
fn names(to: &To, session: &Session) -> bool {
    match to {
        To::All => true,
        To::Group(g) => session.with_groups(|groups| groups.contains(g)),
        To::User(u) => session.user_id() == Some(u.as_str()),
        To::Connection(c) => c == session.id(),
    }
}

/// Applies an operation to one session only (a session being taken over, see
/// `mirror.rs`), its frames marked as coming from `from`.
pub(crate) fn apply_to(hub: &Hub, session: &Arc<Session>, op: &[u8], from: Provenance) {
    let Ok(op) = serde_json::from_slice::<Operation>(op) else {
        return;
    };
    match op {
        Operation::Send {
            to,
            excluded,
            filter,
            data_type,
            data,
            ttl_ms,
            from_user,
            ..
        } => {
            if !names(&to, session) || excluded.iter().any(|e| e == session.id()) {
                return;
            }
            let Ok(payload) = Payload::from_json(data_type, data) else {
                return;
            };
            let filter = filter.as_deref().and_then(|f| Filter::parse(f).ok());
            let sel = Selection {
                excluded: &[],
                filter: filter.as_ref(),
            };
            let deadline = deadline(ttl_ms);
            let msg = sent_message(&to, from_user.as_deref(), &payload);
            with_provenance(from, || {
                hub.deliver_to(session, &sel, &msg, deadline);
            });
        }
        Operation::Join { to, group, .. } => {
            if matches!(to, To::Connection(_) | To::User(_)) && names(&to, session) {
                let _ = hub.join_adopted(session, &group);
            }
        }
        Operation::Leave { to, group, .. } => {
            if names(&to, session) {
                match group {
                    Some(g) => hub.leave(session, &g),
                    None => {
                        for g in session.groups() {
                            hub.leave(session, &g);
                        }
                    }
                }
            }
        }
        Operation::Close {
            to,
            excluded,
            reason,
            ..
        } => {
            if names(&to, session) && !excluded.iter().any(|e| e == session.id()) {
                hub.close(session.id(), session.close_code(1000), &reason);
                session.shut(session.close_code(1000), &reason);
            }
        }
        Operation::Permission {
            connection,
            permission,
            group,
            allowed,
            ..
        } => {
            if connection == session.id() {
                set_permission(session, &permission, group.as_deref(), allowed);
            }
        }
        Operation::Groups { .. } | Operation::Claimed { .. } => {}
    }
}

/// A send's selection as it travels: the filter's text, re-parsed on each node.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SentSelection<'a> {
    pub excluded: &'a [String],
    pub filter: Option<&'a str>,
}

impl crate::WebPubSub {
    /// Applies an operation another node broadcast (see [`Cluster::broadcast`]) to this
    /// node's sessions. Call it in the order the operations were broadcast, inside the
    /// Tokio runtime. An operation for a hub this node has no session of does nothing.
    /// `entry` is its place in the cluster's order, which the frames it produces for
    /// mirrored sessions record (see `mirror.rs`).
    pub fn apply_remote(&self, operation: &[u8], entry: (u64, u64)) {
        let operation: Operation = match serde_json::from_slice(operation) {
            Ok(op) => op,
            Err(error) => {
                tracing::warn!(%error, "web pubsub: an operation from another node is invalid");
                return;
            }
        };
        if let Some(hub) = self.existing_hub(operation.hub()) {
            with_provenance(Provenance::Stream(entry.0, entry.1), || {
                operation.apply(&hub)
            });
        }
    }

    /// Returns once every send of this node that was between its broadcast and its
    /// local delivery has delivered: what this node's own operations read back from the
    /// cluster produced here is then queued for the mirror, before anything the caller
    /// queues next.
    pub fn settled(&self) {
        for hub in self.hubs_now() {
            hub.settled();
        }
    }
}

impl Hub {
    /// Hands `operation` to the other nodes (nothing to do on a single node).
    /// Returns the operation's number among this node's (0 on a single node).
    pub(crate) fn broadcast(&self, operation: &Operation) -> Result<u64, ClusterError> {
        let Some(cluster) = self.cluster() else {
            return Ok(0);
        };
        let bytes =
            serde_json::to_vec(operation).map_err(|e| ClusterError::Unavailable(Box::new(e)))?;
        cluster.broadcast(bytes)
    }

    /// [`Hub::broadcast`], then [`Hub::written`]: an answer after it survives this node.
    pub(crate) async fn broadcast_written(
        &self,
        operation: &Operation,
    ) -> Result<(), ClusterError> {
        let seq = self.broadcast(operation)?;
        self.written(seq).await
    }

    /// Resolves once operation `seq` of [`Hub::broadcast`] is in Redis (single node: 0).
    pub(crate) async fn written(&self, seq: u64) -> Result<(), ClusterError> {
        match self.cluster() {
            Some(cluster) if seq > 0 => cluster.written(seq).await,
            _ => Ok(()),
        }
    }

    /// Whether this node, or else any other live node, holds `item`.
    pub(crate) async fn exists_anywhere(
        self: &Arc<Self>,
        item: Item<'_>,
        here: bool,
    ) -> Result<bool, ClusterError> {
        let Some(cluster) = self.cluster().cloned() else {
            return Ok(here);
        };
        if here {
            return Ok(true);
        }
        let hub = self.name().to_owned();
        let (kind, name) = match item {
            Item::Connection(c) => (0, c.to_owned()),
            Item::User(u) => (1, u.to_owned()),
            Item::Group(g) => (2, g.to_owned()),
        };
        let ask = move || {
            let item = match kind {
                0 => Item::Connection(&name),
                1 => Item::User(&name),
                _ => Item::Group(&name),
            };
            cluster.exists(&hub, item)
        };
        tokio::task::spawn_blocking(ask)
            .await
            .map_err(|e| ClusterError::Unavailable(Box::new(e)))?
    }
}

fn deadline(ttl_ms: Option<u64>) -> Option<Instant> {
    ttl_ms.map(|t| Instant::now() + Duration::from_millis(t))
}

/// What a send operation delivers: from its group if it went to one, else the server.
fn sent_message<'a>(
    to: &'a To,
    from_user: Option<&'a str>,
    payload: &'a Payload,
) -> DataMessageRef<'a> {
    DataMessageRef {
        from: match to {
            To::Group(_) => MessageSource::Group,
            _ => MessageSource::Server,
        },
        group: match to {
            To::Group(g) => Some(g.as_str()),
            _ => None,
        },
        from_user_id: from_user,
        payload,
        stream: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_send_survives_its_encoding() {
        for payload in [
            Payload::Json(serde_json::json!({"a": [1, 2.5, "x"]})),
            Payload::Text("héllo".into()),
            Payload::Binary(vec![0, 1, 255]),
            Payload::Protobuf(vec![10, 3, 1, 2, 3]),
        ] {
            let (data_type, data) = encode_payload(&payload);
            let op = Operation::Send {
                hub: "h".into(),
                to: To::Group("g".into()),
                excluded: vec!["c1".into()],
                filter: Some("userId eq 'u'".into()),
                data_type,
                data,
                ttl_ms: Some(5),
                from_user: Some("u".into()),
            };
            let bytes = serde_json::to_vec(&op).expect("encodes");
            let back: Operation = serde_json::from_slice(&bytes).expect("decodes");
            assert_eq!(back, op);
            let Operation::Send {
                data_type, data, ..
            } = back
            else {
                unreachable!()
            };
            assert_eq!(Payload::from_json(data_type, data).ok(), Some(payload));
        }
    }
}
