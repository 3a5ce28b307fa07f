//! Errors, one enum per layer.
//!
//! A [`Refusal`] is the store saying "no" to one request: it travels back to the client as
//! `-ERR <text>\r\n` and the store carries on. Its `Display` texts are matched byte for
//! byte by the SDK clients, so they must never change. A [`FatalError`] means the node
//! itself is broken (the storage engine failed): the shell must not answer as if the
//! request had been processed.

/// A request the store refuses; `Display` is the exact text after `-ERR `.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Refusal {
    /// The request `__ts` is more than the allowed skew ahead of the server clock.
    #[error("the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized")]
    TimestampSkew,
    /// The key is fenced and the request carries no `__ft`.
    #[error("a fencing token is required for this request")]
    FencingTokenRequired,
    /// The request `__ft` is more than the allowed skew ahead of the server clock.
    #[error("the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized")]
    FencingTokenSkew,
    /// The request `__ft` is older than the key's fencing token.
    #[error("the request fencing token is a lower version than the fencing token protecting the resource")]
    FencingTokenLowerVersion,
    /// The key-count or byte quota would be exceeded.
    #[error("the quota has been exceeded")]
    QuotaExceeded,
    /// The payload is not a RESP array of bulk strings, or an option is malformed.
    #[error("syntax error")]
    Syntax,
    /// The authorizer denied the operation on the key.
    #[error("not authorized")]
    NotAuthorized,
    /// The verb is not one the store knows.
    #[error("unknown command")]
    UnknownCommand,
    /// The verb got too few or too many arguments.
    #[error("wrong number of arguments")]
    WrongNumberOfArguments,
    /// A SET without a `__ts` user property.
    #[error("missing timestamp")]
    MissingTimestamp,
    /// A `__ts` or `__ft` that is not an HLC.
    #[error("malformed timestamp")]
    MalformedTimestamp,
    /// An empty key.
    #[error("the key length is zero")]
    KeyLengthZero,
}

/// A storage engine failure; engines map their own errors into it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Reading or writing the storage failed.
    #[error("storage I/O failed")]
    Io(#[from] std::io::Error),
    /// A backend-specific failure (a corrupt record...).
    #[error("storage backend failed")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The storage cannot be reached now (a networked engine's server is down or
    /// refused the command): this call failed, and a write it made may or may not have
    /// happened, as after any lost reply. Only an engine that keeps no state of its own
    /// between calls returns it, so the node's state stays whole: the shell refuses this
    /// request and goes on, and later calls succeed once the storage is back.
    #[error("storage unavailable")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// The node cannot go on serving the state store.
#[derive(Debug, thiserror::Error)]
pub enum FatalError {
    /// The storage engine failed; the store's state is unknown.
    #[error("the state store engine failed")]
    Engine(#[from] EngineError),
}

impl FatalError {
    /// Whether this is [`EngineError::Unavailable`]: the request fails, the node goes on.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Self::Engine(EngineError::Unavailable(_)))
    }
}
