//! The client protocols: what travels in WebSocket frames, with no I/O.
//!
//! - [`data`]: the payload a publisher sends, decoded once and re-encoded per subscriber.
//! - [`json`]: the JSON subprotocols (text frames).
//! - [`proto`]: the protobuf subprotocols' messages (binary frames).
//! - [`codec`]: frames in and out per subprotocol, and the protocol-neutral request.
//! - `frames`: one data message's frames, encoded once per subprotocol for a fan-out.
//! - [`Subprotocol`]: which of them a connection negotiated.

pub(crate) mod codec;
pub(crate) mod data;
pub(crate) mod frames;
pub(crate) mod json;
pub mod proto;

pub(crate) use data::Payload;

/// Hub names as the REST API's pattern `^[A-Za-z][A-Za-z0-9_`,.[\]]{0,127}$` allows them,
/// for the client endpoint too.
pub(crate) fn valid_hub_name(name: &str) -> bool {
    name.len() <= 128
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_`,.[]".contains(c))
}

/// Why a frame could not be decoded. The connection layer turns these into a failed ack
/// (when the frame carried an `ackId`) or a `disconnected` message and a close.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProtocolError {
    /// The frame is not JSON at all.
    #[error("invalid JSON: {0}")]
    Json(String),
    /// The frame is JSON but not an object.
    #[error("a message must be a JSON object")]
    NotAnObject,
    /// The object is not a valid message (missing or mistyped field).
    #[error("invalid message: {reason}")]
    Invalid { ack_id: Option<u64>, reason: String },
    /// `data` of this `dataType` must be a string.
    #[error("data of dataType {0} must be a string")]
    DataNotString(&'static str),
    /// `data` of this `dataType` must be base64.
    #[error("data of dataType {0} must be base64")]
    BadBase64(&'static str),
    /// A protobuf frame failed to decode.
    #[error("invalid protobuf: {0}")]
    Protobuf(String),
    /// A protobuf `MessageData` with no data set.
    #[error("message data is empty")]
    MissingData,
}

/// The negotiated WebSocket subprotocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Subprotocol {
    /// No subprotocol: frames are bare data.
    Raw,
    /// `json.webpubsub.azure.v1`.
    Json,
    /// `json.reliable.webpubsub.azure.v1`.
    JsonReliable,
    /// `protobuf.webpubsub.azure.v1`.
    Protobuf,
    /// `protobuf.reliable.webpubsub.azure.v1`.
    ProtobufReliable,
}

impl Subprotocol {
    /// The subprotocols this service accepts, in the `Sec-WebSocket-Protocol` spelling.
    pub(crate) const OFFERED: [&'static str; 4] = [
        "json.webpubsub.azure.v1",
        "json.reliable.webpubsub.azure.v1",
        "protobuf.webpubsub.azure.v1",
        "protobuf.reliable.webpubsub.azure.v1",
    ];

    /// Parses one offered name.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name.trim() {
            "json.webpubsub.azure.v1" => Some(Self::Json),
            "json.reliable.webpubsub.azure.v1" => Some(Self::JsonReliable),
            "protobuf.webpubsub.azure.v1" => Some(Self::Protobuf),
            "protobuf.reliable.webpubsub.azure.v1" => Some(Self::ProtobufReliable),
            _ => None,
        }
    }

    /// The `Sec-WebSocket-Protocol` name; `None` for raw connections.
    pub(crate) fn name(self) -> Option<&'static str> {
        match self {
            Self::Raw => None,
            Self::Json => Some(Self::OFFERED[0]),
            Self::JsonReliable => Some(Self::OFFERED[1]),
            Self::Protobuf => Some(Self::OFFERED[2]),
            Self::ProtobufReliable => Some(Self::OFFERED[3]),
        }
    }

    /// Whether connections of this subprotocol keep a recoverable session.
    pub(crate) fn is_reliable(self) -> bool {
        matches!(self, Self::JsonReliable | Self::ProtobufReliable)
    }

    /// Whether frames are protobuf (binary) rather than JSON (text).
    pub(crate) fn is_protobuf(self) -> bool {
        matches!(self, Self::Protobuf | Self::ProtobufReliable)
    }
}
