//! What one client frame does to its connection, as data: the replies to queue, a
//! close, a user event to post upstream, a stream timer to start. The dispatcher and
//! the hub's stream handling produce them; the connection carries them out.

use crate::protocol::json::Downstream;
use crate::protocol::Payload;

/// Longest group name accepted.
pub(crate) const MAX_GROUP_NAME: usize = 1024;

/// Why a message with an `ackId` failed: the `error.name` the client sees.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AckFailure {
    /// The token's roles do not allow it.
    #[error("{0}")]
    Forbidden(String),
    /// The message is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// The other nodes cannot be reached; nothing was sent (a transient failure: the
    /// client may send again).
    #[error("{0}")]
    Unavailable(String),
}

impl AckFailure {
    /// The `error.name`.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Self::Forbidden(_) => "Forbidden",
            Self::BadRequest(_) => "BadRequest",
            Self::Unavailable(_) => "InternalServerError",
        }
    }
}

/// The connection must close with this code, after a `disconnected` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Close {
    /// WebSocket close code.
    pub code: u16,
    /// Reason.
    pub reason: String,
}

/// A user event for the hub's upstream handler.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct UserEvent {
    /// The event name (`message` for a raw client's frame).
    pub event: String,
    /// The data.
    pub payload: Payload,
    /// The `ackId` to answer once the upstream answered.
    pub ack_id: Option<u64>,
    /// Set for an `invoke`: the upstream's answer goes back as this invocation's
    /// `invokeResponse` instead of a server message and an ack.
    pub invocation_id: Option<String>,
}

/// A stream whose idle deadline the connection must watch (see `hub/stream.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamTimer {
    /// The stream.
    pub stream_id: String,
    /// Which opening of that stream id.
    pub epoch: u64,
}

/// The effects of one frame.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Effects {
    /// Frames to send back, in order.
    pub replies: Vec<Downstream>,
    /// Set when the connection must close (protocol violation: the session is deleted).
    pub close: Option<Close>,
    /// A user event to post upstream, after the replies.
    pub upstream: Option<UserEvent>,
    /// A stream was opened: watch its idle timeout.
    pub stream_timer: Option<StreamTimer>,
    /// A send to other nodes whose ack waits until it is written where they read it.
    pub ack_when_written: Option<WrittenAck>,
    /// The replies wait until the session's mirror write with this ticket is stored
    /// (0: they do not wait): a stream's state must be in the copy before its ack.
    pub held: u64,
}

/// An ack that waits for this node's operation `seq` to reach the other nodes
/// ([`crate::Cluster::written`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WrittenAck {
    /// The client's `ackId`.
    pub ack_id: u64,
    /// The operation's number.
    pub seq: u64,
    /// The `ackId` went to the session's copy with the operation.
    pub recorded: bool,
}

/// Checks a group name and the permission to act on it (`verb`: "join", "send to"…).
pub(crate) fn check_group(group: &str, allowed: bool, verb: &str) -> Result<(), AckFailure> {
    if group.is_empty() || group.len() > MAX_GROUP_NAME {
        return Err(AckFailure::BadRequest(format!(
            "group name must be 1 to {MAX_GROUP_NAME} bytes"
        )));
    }
    if !allowed {
        return Err(AckFailure::Forbidden(format!(
            "The connection has no permission to {verb} group '{group}'"
        )));
    }
    Ok(())
}
