//! The operations as they travel between nodes: their encoding, and how a node applies
//! another node's operation to its own sessions (or, in a takeover, to one session).

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use super::{Question, SentSelection, To};
use crate::filter::Filter;
use crate::hub::admin::{Permission, Selection, Target};
use crate::hub::{Hub, Session};
use crate::mirror::{with_provenance, Provenance};
use crate::protocol::data::DataType;
use crate::protocol::json::{DataMessageRef, MessageSource, StreamInfo};
use crate::protocol::Payload;

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
        /// A fragment of a client's stream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamInfo>,
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
    /// A question for every other node, answered under `id` (see `ask.rs`).
    Ask {
        hub: String,
        id: String,
        question: Question,
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
            stream: None,
        }
    }

    pub(super) fn hub(&self) -> &str {
        match self {
            Operation::Send { hub, .. }
            | Operation::Join { hub, .. }
            | Operation::Leave { hub, .. }
            | Operation::Groups { hub, .. }
            | Operation::Claimed { hub, .. }
            | Operation::Ask { hub, .. }
            | Operation::Permission { hub, .. }
            | Operation::Close { hub, .. } => hub,
        }
    }

    /// Applies an operation from another node to this node's sessions of `hub`.
    pub(super) fn apply(self, hub: &Hub) {
        match self {
            Operation::Send {
                to,
                excluded,
                filter,
                data_type,
                data,
                ttl_ms,
                from_user,
                stream,
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
                let msg = sent_message(&to, from_user.as_deref(), &payload, stream.as_ref());
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
            // Answered before a hub is looked up (see `apply_remote`).
            Operation::Ask { .. } => {}
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
        Operation::Permission {
            hub: hub.name().to_owned(),
            connection: connection.to_owned(),
            permission: permission.name().to_owned(),
            group,
            allowed,
        }
    }
}

fn set_permission(session: &Session, permission: &str, group: Option<&str>, allowed: bool) {
    if let Some(p) = Permission::parse(permission) {
        session.set_permission(p, group, allowed);
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
            stream,
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
            let msg = sent_message(&to, from_user.as_deref(), &payload, stream.as_ref());
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
        Operation::Groups { .. } | Operation::Claimed { .. } | Operation::Ask { .. } => {}
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
    stream: Option<&'a StreamInfo>,
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
        stream,
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
                stream: Some(StreamInfo {
                    stream_id: "s".into(),
                    stream_sequence_id: 2,
                    end_of_stream: false,
                    error: None,
                }),
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
