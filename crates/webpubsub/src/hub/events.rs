//! What a hub tells its upstream and asks of it: the [`Events`] a hub is built with.
//! The hub knows nothing of webhooks; `crate::upstream` implements this.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::{Hub, Session};
use crate::protocol::Payload;

/// Why a user event got no answer, as the client is told (the failed ack's or
/// `invokeResponse`'s `error.name` and message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EventError {
    /// The handler refused the event as malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The handler refused the event as not allowed.
    #[error("{0}")]
    Forbidden(String),
    /// The handler failed or could not be reached.
    #[error("{0}")]
    Failed(String),
}

impl EventError {
    /// The `error.name` the client sees.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "BadRequest",
            Self::Forbidden(_) => "Forbidden",
            Self::Failed(_) => "InternalServerError",
        }
    }
}

/// The answer of a user event: data to send back to the client, if any.
pub(crate) type UserEventFuture =
    Pin<Box<dyn Future<Output = Result<Option<Payload>, EventError>> + Send>>;

/// The hub's upstream: told when sessions start and end (the `connected` and
/// `disconnected` events), and asked to handle user events. The notifications are
/// called with no lock held and must not block.
pub(crate) trait Events: Send + Sync + std::fmt::Debug {
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
