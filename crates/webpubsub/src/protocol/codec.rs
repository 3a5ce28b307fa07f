//! Frames in and out, per subprotocol: the one place that knows JSON clients get text
//! frames, protobuf clients binary frames and raw clients bare data.
//!
//! Upstream frames of either encoding become one protocol-neutral [`Request`], so the
//! dispatcher handles both the same way. Downstream replies are built as the JSON
//! [`Downstream`] type and converted for protobuf clients here.

use axum::extract::ws::Message;
use prost::Message as _;

use super::json::{
    decode_upstream, DataMessageRef, Downstream, MessageSource, StreamEndError, SystemEvent,
    Upstream,
};
use super::proto::{self, MessageData};
use super::{Payload, ProtocolError, Subprotocol};

/// A client request, whatever encoding carried it. Data that failed to decode is kept
/// as the error so the request can still be acked as a bad request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Request {
    /// Join a group.
    JoinGroup { group: String, ack_id: Option<u64> },
    /// Leave a group.
    LeaveGroup { group: String, ack_id: Option<u64> },
    /// Publish to a group.
    SendToGroup {
        group: String,
        ack_id: Option<u64>,
        no_echo: bool,
        payload: Result<Payload, ProtocolError>,
    },
    /// A custom event.
    Event {
        event: String,
        ack_id: Option<u64>,
        payload: Result<Payload, ProtocolError>,
    },
    /// The highest sequence id received.
    SequenceAck { sequence_id: u64 },
    /// Liveness check.
    Ping,
    /// An invocation (JSON subprotocols only): answered by `invokeResponse`.
    Invoke {
        invocation_id: String,
        target: String,
        event: String,
        payload: Result<Payload, ProtocolError>,
    },
    /// Starts a group stream (JSON subprotocols only).
    StreamStart {
        stream_id: String,
        group: String,
        idle_timeout_ms: Option<u64>,
        no_echo: bool,
    },
    /// A stream fragment; `None` is a keepalive.
    StreamData {
        stream_id: String,
        fragment: Option<(u64, Result<Payload, ProtocolError>)>,
    },
    /// Ends a stream, with the publisher's error if any.
    StreamEnd {
        stream_id: String,
        error: Option<StreamEndError>,
    },
    /// A message kind this service ignores.
    Unknown,
}

impl Request {
    /// The `ackId` to answer, if any.
    pub(crate) fn ack_id(&self) -> Option<u64> {
        match self {
            Self::JoinGroup { ack_id, .. }
            | Self::LeaveGroup { ack_id, .. }
            | Self::SendToGroup { ack_id, .. }
            | Self::Event { ack_id, .. } => *ack_id,
            Self::SequenceAck { .. }
            | Self::Ping
            | Self::Invoke { .. }
            | Self::StreamStart { .. }
            | Self::StreamData { .. }
            | Self::StreamEnd { .. }
            | Self::Unknown => None,
        }
    }
}

/// Protobuf data must be a serialized `google.protobuf.Any`, so protobuf subscribers
/// can be sent it; refused at publish time rather than lost at delivery.
fn checked(payload: Result<Payload, ProtocolError>) -> Result<Payload, ProtocolError> {
    if let Ok(Payload::Protobuf(bytes)) = &payload {
        proto::Any::decode(bytes.as_slice()).map_err(|e| ProtocolError::Protobuf(e.to_string()))?;
    }
    payload
}

impl From<Upstream> for Request {
    fn from(m: Upstream) -> Self {
        match m {
            Upstream::JoinGroup { group, ack_id } => Self::JoinGroup { group, ack_id },
            Upstream::LeaveGroup { group, ack_id } => Self::LeaveGroup { group, ack_id },
            Upstream::SendToGroup {
                group,
                no_echo,
                stream: Some(stream),
                ..
            } => Self::StreamStart {
                stream_id: stream.stream_id,
                group,
                idle_timeout_ms: stream.idle_timeout_ms,
                no_echo,
            },
            Upstream::SendToGroup {
                group,
                ack_id,
                no_echo,
                data_type,
                data,
                stream: None,
            } => Self::SendToGroup {
                group,
                ack_id,
                no_echo,
                payload: checked(Payload::from_json(data_type, data)),
            },
            Upstream::Event {
                event,
                ack_id,
                data_type,
                data,
            } => Self::Event {
                event,
                ack_id,
                payload: checked(Payload::from_json(data_type, data)),
            },
            Upstream::SequenceAck { sequence_id } => Self::SequenceAck { sequence_id },
            Upstream::Ping => Self::Ping,
            Upstream::Invoke {
                invocation_id,
                target,
                event,
                data_type,
                data,
            } => Self::Invoke {
                invocation_id,
                target,
                event,
                payload: checked(Payload::from_json(data_type, data)),
            },
            m @ (Upstream::StreamStart { .. } | Upstream::StreamData { .. }) => stream_request(m),
            Upstream::StreamEnd { stream_id, error } => Self::StreamEnd { stream_id, error },
            Upstream::Unknown => Self::Unknown,
        }
    }
}

/// The JSON `streamStart` and `streamData` frames. Only `StreamStart` and `StreamData`
/// reach this function.
fn stream_request(m: Upstream) -> Request {
    match m {
        Upstream::StreamStart {
            stream_id,
            target,
            group,
            idle_timeout_ms,
            no_echo,
        } if target.is_empty() || target == "group" => Request::StreamStart {
            stream_id,
            group,
            idle_timeout_ms,
            no_echo,
        },
        // A stream to another target: refused as a stream to no group.
        Upstream::StreamStart {
            stream_id, no_echo, ..
        } => Request::StreamStart {
            stream_id,
            group: String::new(),
            idle_timeout_ms: None,
            no_echo,
        },
        Upstream::StreamData {
            stream_id,
            stream_sequence_id,
            data_type,
            data,
        } => Request::StreamData {
            stream_id,
            fragment: match (stream_sequence_id, data) {
                (Some(seq), Some(data)) => Some((
                    seq,
                    checked(Payload::from_json(data_type.unwrap_or_default(), data)),
                )),
                _ => None,
            },
        },
        _ => Request::Unknown,
    }
}

fn proto_payload(data: Option<MessageData>) -> Result<Payload, ProtocolError> {
    data.ok_or(ProtocolError::MissingData)?.into_payload()
}

impl From<proto::UpstreamMessage> for Request {
    fn from(m: proto::UpstreamMessage) -> Self {
        use proto::Upstream as U;
        match m.message {
            Some(U::SendToGroup(m)) => Self::SendToGroup {
                group: m.group,
                ack_id: m.ack_id,
                no_echo: m.no_echo.unwrap_or(false),
                payload: proto_payload(m.data),
            },
            Some(U::Event(m)) => Self::Event {
                event: m.event,
                ack_id: m.ack_id,
                payload: proto_payload(m.data),
            },
            Some(U::JoinGroup(m)) => Self::JoinGroup {
                group: m.group,
                ack_id: m.ack_id,
            },
            Some(U::LeaveGroup(m)) => Self::LeaveGroup {
                group: m.group,
                ack_id: m.ack_id,
            },
            Some(U::SequenceAck(m)) => Self::SequenceAck {
                sequence_id: m.sequence_id,
            },
            Some(U::Ping(_)) => Self::Ping,
            None => Self::Unknown,
        }
    }
}

/// Decodes a JSON text frame.
pub(crate) fn decode_text(text: &str) -> Result<Request, ProtocolError> {
    decode_upstream(text).map(Request::from)
}

/// Decodes a protobuf binary frame.
pub(crate) fn decode_binary(bytes: &[u8]) -> Result<Request, ProtocolError> {
    proto::UpstreamMessage::decode(bytes)
        .map(Request::from)
        .map_err(|e| ProtocolError::Protobuf(e.to_string()))
}

/// Encodes a reply (ack, system, pong, invoke response) for the connection's
/// subprotocol. `None` for a reply the subprotocol has no form for (an invoke
/// response on protobuf, which cannot carry an invoke in the first place).
pub(crate) fn encode_reply(protocol: Subprotocol, msg: &Downstream) -> Option<Message> {
    if !protocol.is_protobuf() {
        return Some(Message::Text(msg.to_text().into()));
    }
    use proto::Downstream as D;
    let out = match msg {
        Downstream::Ack {
            ack_id,
            success,
            error,
        } => D::Ack(proto::AckMessage {
            ack_id: *ack_id,
            success: *success,
            error: error.as_ref().map(|e| proto::ErrorMessage {
                name: e.name.clone(),
                message: e.message.clone(),
            }),
        }),
        Downstream::Message {
            from,
            group,
            data_type,
            data,
            sequence_id,
            ..
        } => D::Data(proto::DataMessage {
            from: source_name(*from).to_owned(),
            group: group.clone(),
            data: Payload::from_json(*data_type, data.clone())
                .ok()
                .and_then(|p| MessageData::from_payload(&p).ok()),
            sequence_id: sequence_id.unwrap_or(0),
        }),
        Downstream::System(event) => D::System(proto::SystemMessage {
            message: Some(match event {
                SystemEvent::Connected {
                    connection_id,
                    user_id,
                    reconnection_token,
                } => proto::System::Connected(proto::ConnectedMessage {
                    connection_id: connection_id.clone(),
                    user_id: user_id.clone().unwrap_or_default(),
                    reconnection_token: reconnection_token.clone().unwrap_or_default(),
                }),
                SystemEvent::Disconnected { message } => {
                    proto::System::Disconnected(proto::DisconnectedMessage {
                        reason: message.clone(),
                    })
                }
            }),
        }),
        Downstream::Pong => D::Pong(proto::Empty {}),
        Downstream::InvokeResponse { .. }
        | Downstream::StreamAck { .. }
        | Downstream::StreamNack { .. }
        | Downstream::StreamClosed { .. } => return None,
    };
    Some(Message::Binary(
        proto::DownstreamMessage { message: Some(out) }
            .encode_to_vec()
            .into(),
    ))
}

fn source_name(from: MessageSource) -> &'static str {
    match from {
        MessageSource::Group => "group",
        MessageSource::Server => "server",
    }
}

/// Encodes a data message for the connection's subprotocol; `sequence_id` on reliable
/// subprotocols only.
pub(crate) fn encode_data(
    protocol: Subprotocol,
    msg: &DataMessageRef<'_>,
    sequence_id: Option<u64>,
) -> Message {
    match protocol {
        Subprotocol::Raw => match msg.payload {
            Payload::Text(s) => Message::Text(s.as_str().into()),
            Payload::Json(v) => Message::Text(v.to_string().into()),
            Payload::Binary(b) | Payload::Protobuf(b) => Message::Binary(b.clone().into()),
        },
        Subprotocol::Json | Subprotocol::JsonReliable => {
            Message::Text(super::json::encode_data_message(msg, sequence_id).into())
        }
        Subprotocol::Protobuf | Subprotocol::ProtobufReliable => {
            let data = proto::DataMessage {
                from: source_name(msg.from).to_owned(),
                group: msg.group.map(str::to_owned),
                data: MessageData::from_payload(msg.payload).ok(),
                sequence_id: sequence_id.unwrap_or(0),
            };
            let out = proto::DownstreamMessage {
                message: Some(proto::Downstream::Data(data)),
            };
            Message::Binary(out.encode_to_vec().into())
        }
    }
}

#[cfg(test)]
#[path = "codec_test.rs"]
mod tests;
