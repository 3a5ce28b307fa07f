//! What can go wrong in a command, and the exit code each outcome gives a script.

use std::process::ExitCode;

use statehub_mqtt_codec::ReasonCode;

/// The documented exit codes (README, "Command-line client").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The command did what it was asked.
    Success = 0,
    /// Nothing was there: GET of a missing key, DEL or VDEL of a missing key.
    NotFound = 1,
    /// The command line (or a connection string, URL or file it names) is wrong.
    Usage = 2,
    /// The server answered and said no: a condition not met (NX, NEX, VDEL of another
    /// value), fencing, quota, authorization, a refused CONNECT, PUBLISH or SUBSCRIBE.
    Refused = 3,
    /// No connection, or it broke: refused, reset, closed, unreadable bytes.
    Transport = 4,
    /// An answer or a message did not come in time.
    Timeout = 5,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// The MQTT connection failed or the server refused an MQTT operation.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server closed the connection")]
    Closed,
    #[error("the server disconnected: {}{}", describe(*.code), reason_suffix(.reason))]
    Disconnected {
        code: ReasonCode,
        reason: Option<String>,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("the server refused the {what}: {}{}", describe(*.code), reason_suffix(.reason))]
    Refused {
        what: String,
        code: ReasonCode,
        reason: Option<String>,
    },
    #[error("the message is {size} bytes, more than the server accepts ({max})")]
    TooLarge { size: usize, max: u32 },
    #[error("timed out {0}")]
    Timeout(&'static str),
    #[error("more than {0} messages arrived while waiting for an acknowledgement")]
    Backlog(usize),
}

/// A reason code as `0x87 (not authorized)`, named when it is one a user meets.
fn describe(code: ReasonCode) -> String {
    let name = match code {
        ReasonCode::UNSPECIFIED_ERROR => "unspecified error",
        ReasonCode::MALFORMED_PACKET => "malformed packet",
        ReasonCode::PROTOCOL_ERROR => "protocol error",
        ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR => "implementation specific error",
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID => "client identifier not valid",
        ReasonCode::BAD_USER_NAME_OR_PASSWORD => "bad user name or password",
        ReasonCode::NOT_AUTHORIZED => "not authorized",
        ReasonCode::SERVER_UNAVAILABLE => "server unavailable",
        ReasonCode::SERVER_BUSY => "server busy",
        ReasonCode::BANNED => "banned",
        ReasonCode::SERVER_SHUTTING_DOWN => "server shutting down",
        ReasonCode::BAD_AUTHENTICATION_METHOD => "bad authentication method",
        ReasonCode::KEEP_ALIVE_TIMEOUT => "keep alive timeout",
        ReasonCode::SESSION_TAKEN_OVER => "session taken over",
        ReasonCode::TOPIC_FILTER_INVALID => "topic filter invalid",
        ReasonCode::TOPIC_NAME_INVALID => "topic name invalid",
        ReasonCode::PACKET_TOO_LARGE => "packet too large",
        ReasonCode::QUOTA_EXCEEDED => "quota exceeded",
        ReasonCode::ADMINISTRATIVE_ACTION => "administrative action",
        ReasonCode::RETAIN_NOT_SUPPORTED => "retain not supported",
        ReasonCode::QOS_NOT_SUPPORTED => "QoS not supported",
        ReasonCode::CONNECTION_RATE_EXCEEDED => "connection rate exceeded",
        _ => return format!("reason 0x{:02X}", code.0),
    };
    format!("reason 0x{:02X} ({name})", code.0)
}

fn reason_suffix(reason: &Option<String>) -> String {
    reason
        .as_deref()
        .map(|r| format!(": {r}"))
        .unwrap_or_default()
}

impl ClientError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::Refused { .. } | Self::TooLarge { .. } => Exit::Refused,
            Self::Timeout(_) => Exit::Timeout,
            Self::Connect { .. }
            | Self::Io(_)
            | Self::Closed
            | Self::Disconnected { .. }
            | Self::Protocol(_)
            | Self::Backlog(_) => Exit::Transport,
        }
    }
}

/// Why a command failed, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The state store answered with an error (RESP `-ERR` or an RPC fault).
    #[error("the state store refused: {0}")]
    Store(String),
    /// The state store's answer could not be read.
    #[error("unreadable state store response: {0}")]
    BadResponse(String),
    #[error("cannot write the output: {0}")]
    Output(std::io::Error),
    /// A health URL answered, with a status that is not 2xx.
    #[error("{url} answered {status}")]
    Unhealthy { url: String, status: u16 },
}

impl CliError {
    pub fn exit(&self) -> Exit {
        match self {
            Self::Usage(_) => Exit::Usage,
            Self::Client(e) => e.exit(),
            Self::Store(_) | Self::Unhealthy { .. } => Exit::Refused,
            Self::BadResponse(_) | Self::Output(_) => Exit::Transport,
        }
    }

    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::Usage(message.into())
    }
}
