//! The JSON subprotocols `json.webpubsub.azure.v1` and `json.reliable.webpubsub.azure.v1`:
//! one object per text frame, tagged by `type`.
//!
//! Field names are the ones the official clients index directly (see the spec notes), so
//! `type`, `from`, `dataType`, `data`, `group`, `ackId` and `success` are never omitted
//! where a shape has them; optional fields are left out rather than sent as `null`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::data::{DataType, JsonData, Payload};
use super::ProtocolError;

/// A message from a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub(crate) enum Upstream {
    /// Join a group.
    JoinGroup {
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_id: Option<u64>,
    },
    /// Leave a group.
    LeaveGroup {
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_id: Option<u64>,
    },
    /// Publish to a group; `noEcho` keeps it from the sender's own connection.
    SendToGroup {
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_id: Option<u64>,
        #[serde(default)]
        no_echo: bool,
        #[serde(default)]
        data_type: DataType,
        #[serde(default)]
        data: Value,
        /// Set on a stream start request (the documented form of `streamStart`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamStartSpec>,
    },
    /// Starts a group stream (the form `@azure/web-pubsub-client`'s streaming
    /// preview sends): `target` is `group`.
    StreamStart {
        stream_id: String,
        #[serde(default)]
        target: String,
        #[serde(default)]
        group: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idle_timeout_ms: Option<u64>,
        #[serde(default)]
        no_echo: bool,
    },
    /// One fragment of a stream; without `streamSequenceId` and `data`, a keepalive.
    StreamData {
        stream_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream_sequence_id: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data_type: Option<DataType>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
    },
    /// Ends a stream, optionally with an application error.
    StreamEnd {
        stream_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<StreamEndError>,
    },
    /// A custom event for the application server.
    Event {
        event: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ack_id: Option<u64>,
        #[serde(default)]
        data_type: DataType,
        #[serde(default)]
        data: Value,
    },
    /// The highest `sequenceId` the client has received.
    SequenceAck { sequence_id: u64 },
    /// Liveness check, answered with `pong`.
    Ping,
    /// A request answered by `invokeResponse` (`@azure/web-pubsub-client` 1.1's
    /// `invokeEvent`): `target` `event` posts the user event `event` upstream and
    /// returns the upstream's answer.
    Invoke {
        invocation_id: String,
        #[serde(default)]
        target: String,
        #[serde(default)]
        event: String,
        #[serde(default)]
        data_type: DataType,
        #[serde(default)]
        data: Value,
    },
    /// Any other `type`: ignored, as the spec asks.
    #[serde(other)]
    Unknown,
}

/// The `stream` of a `sendToGroup` that starts a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamStartSpec {
    pub stream_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
}

/// The application error of a `streamEnd`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamEndError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_error_code: Option<String>,
}

/// The `stream` of a group message that belongs to a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamInfo {
    pub stream_id: String,
    pub stream_sequence_id: u64,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end_of_stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StreamError>,
}

/// Why a stream ended: `IdleTimeout`, `Forbidden`, `Cancelled`, `UserError`, ...
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StreamError {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Only for `UserError`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_error_code: Option<String>,
}

/// Decodes one text frame. A frame that is JSON but not a valid message keeps its
/// `ackId` in the error so the client can still be answered.
pub(crate) fn decode_upstream(text: &str) -> Result<Upstream, ProtocolError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ProtocolError::Json(e.to_string()))?;
    let ack_id = value.get("ackId").and_then(Value::as_u64);
    if !value.is_object() {
        return Err(ProtocolError::NotAnObject);
    }
    Upstream::deserialize(value).map_err(|e| ProtocolError::Invalid {
        ack_id,
        reason: e.to_string(),
    })
}

/// Where a data message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum MessageSource {
    /// Published to a group.
    Group,
    /// Sent by the application server.
    Server,
}

/// The error of a failed ack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AckError {
    /// `Forbidden`, `Duplicate`, `BadRequest`, `InternalServerError`.
    pub name: String,
    /// Human-readable details.
    pub message: String,
}

/// A message to a client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub(crate) enum Downstream {
    /// The answer to a message that carried an `ackId`.
    Ack {
        ack_id: u64,
        success: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<AckError>,
    },
    /// Data from a group or the server.
    Message {
        from: MessageSource,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        group: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from_user_id: Option<String>,
        data_type: DataType,
        data: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sequence_id: Option<u64>,
    },
    /// `connected` / `disconnected`.
    System(SystemEvent),
    /// The answer to `ping`.
    Pong,
    /// Stream data accepted (or a stream started): the next `streamSequenceId` expected.
    StreamAck {
        stream_id: String,
        expected_sequence_id: u64,
    },
    /// A retriable stream error (`InvalidSequenceId`).
    StreamNack {
        stream_id: String,
        expected_sequence_id: u64,
        name: String,
        message: String,
    },
    /// The publisher's stream is closed; `error` is absent on a normal end.
    StreamClosed {
        stream_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<AckError>,
    },
    /// The answer to `invoke`: the upstream's data, or an error.
    InvokeResponse {
        invocation_id: String,
        success: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data_type: Option<DataType>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<AckError>,
    },
}

/// The `event` of a `system` message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "event",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub(crate) enum SystemEvent {
    /// First frame of every connection.
    Connected {
        connection_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_id: Option<String>,
        /// Only on reliable subprotocols: clients attempt recovery only when it is present.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reconnection_token: Option<String>,
    },
    /// Sent just before the service closes the connection.
    Disconnected { message: String },
}

impl Downstream {
    /// A successful ack.
    pub(crate) fn ack_ok(ack_id: u64) -> Self {
        Self::Ack {
            ack_id,
            success: true,
            error: None,
        }
    }

    /// A failed ack.
    pub(crate) fn ack_err(ack_id: u64, name: &str, message: impl Into<String>) -> Self {
        Self::Ack {
            ack_id,
            success: false,
            error: Some(AckError {
                name: name.to_owned(),
                message: message.into(),
            }),
        }
    }

    /// A failed invocation.
    pub(crate) fn invoke_err(
        invocation_id: String,
        name: &str,
        message: impl Into<String>,
    ) -> Self {
        Self::InvokeResponse {
            invocation_id,
            success: false,
            data_type: None,
            data: None,
            error: Some(AckError {
                name: name.to_owned(),
                message: message.into(),
            }),
        }
    }

    /// Serializes to the text of one frame.
    pub(crate) fn to_text(&self) -> String {
        // Every field is a string, number, bool or a `Value`: serialization cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The fields of a data message, borrowed so a publish is encoded per subscriber without
/// copying the payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DataMessageRef<'a> {
    /// Group or server.
    pub from: MessageSource,
    /// The group, when from a group.
    pub group: Option<&'a str>,
    /// The publisher's user id, when it has one.
    pub from_user_id: Option<&'a str>,
    /// The data.
    pub payload: &'a Payload,
    /// Set when the message is a fragment (or the end) of a stream.
    pub stream: Option<&'a StreamInfo>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DataMessageOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    from: MessageSource,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from_user_id: Option<&'a str>,
    data_type: DataType,
    data: JsonData<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<&'a StreamInfo>,
    /// Last: `frames.rs` appends it to a shared prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    sequence_id: Option<u64>,
}

/// Encodes a `message` frame; `sequence_id` is set on reliable subprotocols only.
pub(crate) fn encode_data_message(msg: &DataMessageRef<'_>, sequence_id: Option<u64>) -> String {
    let out = DataMessageOut {
        kind: "message",
        from: msg.from,
        group: msg.group,
        from_user_id: msg.from_user_id,
        data_type: msg.payload.data_type(),
        data: msg.payload.json_data(),
        stream: msg.stream,
        sequence_id,
    };
    serde_json::to_string(&out).unwrap_or_default()
}

#[cfg(test)]
#[path = "json_test.rs"]
mod tests;
