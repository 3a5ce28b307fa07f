//! Questions to the other nodes: does a connection, a user or a group exist, may a
//! connection do something, who is in a group.
//!
//! A question travels as an operation ([`Operation::Ask`]), so each node, the asker
//! included, answers it once it has applied every operation before it in the
//! cluster's order: a REST change any node acknowledged (it answers once its operation
//! is in that order) and a client's join acknowledged by its own node (applied there
//! before the ack) are both seen. The asker waits for every node that was alive when it
//! asked, unless one answer decides; a node that stays alive without answering makes
//! the question fail (503), never answer "no". On a single node nothing is asked.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{ClusterError, Operation};
use crate::hub::admin::{Member, Permission};
use crate::hub::Hub;

/// What one node asks the others about their sessions of a hub.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "q", rename_all = "camelCase")]
pub(crate) enum Question {
    /// Is there such a connection (live, or kept for recovery)?
    Connection { id: String },
    /// Does the user have a connection?
    User { id: String },
    /// Does the group have a member?
    Group { name: String },
    /// Does the connection have the permission (`null` from nodes not holding it)?
    #[serde(rename_all = "camelCase")]
    Permission {
        connection: String,
        permission: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<String>,
    },
    /// Up to `limit` members of the group whose ids sort after `after`.
    Members {
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        limit: usize,
    },
}

impl Question {
    /// This node's answer, from its sessions of the hub (`None`: it has none).
    pub(crate) fn answer(&self, hub: Option<&Hub>) -> Vec<u8> {
        let value = match (self, hub) {
            (Question::Members { .. }, None) => json!({"members": [], "more": false}),
            (Question::Permission { .. }, None) => Value::Null,
            (_, None) => Value::Bool(false),
            (Question::Connection { id }, Some(h)) => Value::Bool(h.has_connection(id)),
            (Question::User { id }, Some(h)) => Value::Bool(h.has_user(id)),
            (Question::Group { name }, Some(h)) => Value::Bool(h.has_group(name)),
            (
                Question::Permission {
                    connection,
                    permission,
                    group,
                },
                Some(h),
            ) => match Permission::parse(permission) {
                Some(p) if h.has_connection(connection) => {
                    Value::Bool(h.check_permission(connection, p, group.as_deref()))
                }
                _ => Value::Null,
            },
            (
                Question::Members {
                    group,
                    after,
                    limit,
                },
                Some(h),
            ) => {
                let (members, more) = h.list_group(group, after.as_deref(), *limit);
                let members: Vec<_> = members
                    .into_iter()
                    .map(|m| (m.connection_id, m.user_id))
                    .collect();
                json!({"members": members, "more": more})
            }
        };
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// Whether one node's `answer` decides the question (no need to hear the others).
    fn settles(&self, answer: &Value) -> bool {
        match self {
            Question::Connection { .. } | Question::User { .. } | Question::Group { .. } => {
                answer == &Value::Bool(true)
            }
            Question::Permission { .. } => !answer.is_null(),
            Question::Members { .. } => false,
        }
    }
}

/// The other nodes' page of a group's members, as [`Question::Members`] is answered.
#[derive(Debug, Default, Deserialize)]
struct Page {
    members: Vec<(String, Option<String>)>,
    more: bool,
}

impl Hub {
    /// Asks every node `question`; their answers (none on a single node).
    async fn ask(&self, question: Question) -> Result<Vec<Value>, ClusterError> {
        let Some(cluster) = self.cluster().cloned() else {
            return Ok(Vec::new());
        };
        let id = format!("{:032x}", rand::random::<u128>());
        let op = Operation::Ask {
            hub: self.name().to_owned(),
            id: id.clone(),
            question: question.clone(),
        };
        let bytes = serde_json::to_vec(&op).map_err(|e| ClusterError::Unavailable(Box::new(e)))?;
        let ask = move || {
            let settles =
                |a: &[u8]| serde_json::from_slice::<Value>(a).is_ok_and(|v| question.settles(&v));
            cluster.ask(&id, bytes, &settles)
        };
        let answers = tokio::task::spawn_blocking(ask)
            .await
            .map_err(|e| ClusterError::Unavailable(Box::new(e)))??;
        Ok(answers
            .iter()
            .filter_map(|a| serde_json::from_slice(a).ok())
            .collect())
    }

    /// Whether any node holds what `question` asks about (`here`: whether this one
    /// does, the answer on a single node).
    pub(crate) async fn exists_anywhere(
        self: &Arc<Self>,
        question: Question,
        here: bool,
    ) -> Result<bool, ClusterError> {
        if self.cluster().is_none() {
            return Ok(here);
        }
        let answers = self.ask(question).await?;
        Ok(answers.contains(&Value::Bool(true)))
    }

    /// Whether connection `id`, wherever it is, has `permission` for `group` (or for
    /// every group).
    pub(crate) async fn check_permission_anywhere(
        self: &Arc<Self>,
        id: &str,
        permission: Permission,
        group: Option<&str>,
    ) -> Result<bool, ClusterError> {
        if self.cluster().is_none() {
            return Ok(self.check_permission(id, permission, group));
        }
        let question = Question::Permission {
            connection: id.to_owned(),
            permission: permission.name().to_owned(),
            group: group.map(str::to_owned),
        };
        let answers = self.ask(question).await?;
        Ok(answers.contains(&Value::Bool(true)))
    }

    /// [`Hub::list_group`] over every node's members.
    pub(crate) async fn list_group_anywhere(
        self: &Arc<Self>,
        group: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Member>, bool), ClusterError> {
        if self.cluster().is_none() {
            return Ok(self.list_group(group, after, limit));
        }
        let (mut members, mut more) = (Vec::new(), false);
        let question = Question::Members {
            group: group.to_owned(),
            after: after.map(str::to_owned),
            limit,
        };
        for answer in self.ask(question).await? {
            let page: Page = serde_json::from_value(answer).unwrap_or_default();
            more |= page.more;
            members.extend(
                page.members
                    .into_iter()
                    .map(|(connection_id, user_id)| Member {
                        connection_id,
                        user_id,
                    }),
            );
        }
        members.sort_by(|a, b| a.connection_id.cmp(&b.connection_id));
        members.dedup_by(|a, b| a.connection_id == b.connection_id);
        if members.len() > limit {
            members.truncate(limit);
            more = true;
        }
        Ok((members, more))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_survives_its_encoding_and_settles_as_it_should() {
        let permission = Question::Permission {
            connection: "c".into(),
            permission: "sendToGroup".into(),
            group: Some("g".into()),
        };
        let op = Operation::Ask {
            hub: "h".into(),
            id: "1".into(),
            question: permission.clone(),
        };
        let bytes = serde_json::to_vec(&op).expect("encodes");
        assert!(
            bytes.starts_with(br#"{"op":"ask""#),
            "what answer_own looks for"
        );
        assert_eq!(
            serde_json::from_slice::<Operation>(&bytes).expect("decodes"),
            op
        );
        assert!(
            permission.settles(&Value::Bool(false)),
            "its holder said no"
        );
        assert!(!permission.settles(&Value::Null), "not its holder");
        let group = Question::Group { name: "g".into() };
        assert!(group.settles(&Value::Bool(true)));
        assert!(
            !group.settles(&Value::Bool(false)),
            "another node may have it"
        );
        assert_eq!(group.answer(None), b"false");
        assert_eq!(permission.answer(None), b"null");
    }
}
