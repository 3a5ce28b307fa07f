//! The protobuf subprotocols' messages (`webpubsub.client.proto`, package
//! `azure.webpubsub`), written by hand with prost's derive macros so the build needs no
//! `protoc`. Field numbers are the spec's; tests pin a few encodings byte for byte.

use prost::Message as _;

use super::data::Payload;
use super::ProtocolError;

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `MessageData`: exactly one kind of data.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MessageData {
    #[prost(oneof = "Data", tags = "1, 2, 3, 4")]
    pub data: Option<Data>,
}

/// The `data` oneof of [`MessageData`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Data {
    #[prost(string, tag = "1")]
    Text(String),
    #[prost(bytes = "vec", tag = "2")]
    Binary(Vec<u8>),
    #[prost(message, tag = "3")]
    Protobuf(Any),
    /// Serialized JSON text.
    #[prost(string, tag = "4")]
    Json(String),
}

impl MessageData {
    /// Converts to a payload; JSON data must parse, an empty `MessageData` is refused.
    pub(crate) fn into_payload(self) -> Result<Payload, ProtocolError> {
        match self.data {
            Some(Data::Text(s)) => Ok(Payload::Text(s)),
            Some(Data::Binary(b)) => Ok(Payload::Binary(b)),
            Some(Data::Protobuf(any)) => Ok(Payload::Protobuf(any.encode_to_vec())),
            Some(Data::Json(s)) => serde_json::from_str(&s)
                .map(Payload::Json)
                .map_err(|e| ProtocolError::Json(e.to_string())),
            None => Err(ProtocolError::MissingData),
        }
    }

    /// Converts from a payload; protobuf payloads must hold a serialized `Any`.
    pub(crate) fn from_payload(payload: &Payload) -> Result<Self, ProtocolError> {
        let data = match payload {
            Payload::Text(s) => Data::Text(s.clone()),
            Payload::Binary(b) => Data::Binary(b.clone()),
            Payload::Protobuf(b) => Data::Protobuf(
                Any::decode(b.as_slice()).map_err(|e| ProtocolError::Protobuf(e.to_string()))?,
            ),
            Payload::Json(v) => Data::Json(v.to_string()),
        };
        Ok(Self { data: Some(data) })
    }
}

/// `UpstreamMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpstreamMessage {
    #[prost(oneof = "Upstream", tags = "1, 5, 6, 7, 8, 9")]
    pub message: Option<Upstream>,
}

/// The `message` oneof of [`UpstreamMessage`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Upstream {
    #[prost(message, tag = "1")]
    SendToGroup(SendToGroupMessage),
    #[prost(message, tag = "5")]
    Event(EventMessage),
    #[prost(message, tag = "6")]
    JoinGroup(GroupMessage),
    #[prost(message, tag = "7")]
    LeaveGroup(GroupMessage),
    #[prost(message, tag = "8")]
    SequenceAck(SequenceAckMessage),
    #[prost(message, tag = "9")]
    Ping(Empty),
}

/// `SendToGroupMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SendToGroupMessage {
    #[prost(string, tag = "1")]
    pub group: String,
    #[prost(uint64, optional, tag = "2")]
    pub ack_id: Option<u64>,
    #[prost(message, optional, tag = "3")]
    pub data: Option<MessageData>,
    #[prost(bool, optional, tag = "4")]
    pub no_echo: Option<bool>,
}

/// `EventMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventMessage {
    #[prost(string, tag = "1")]
    pub event: String,
    #[prost(message, optional, tag = "2")]
    pub data: Option<MessageData>,
    #[prost(uint64, optional, tag = "3")]
    pub ack_id: Option<u64>,
}

/// `JoinGroupMessage` and `LeaveGroupMessage`, which share their fields.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupMessage {
    #[prost(string, tag = "1")]
    pub group: String,
    #[prost(uint64, optional, tag = "2")]
    pub ack_id: Option<u64>,
}

/// `SequenceAckMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SequenceAckMessage {
    #[prost(uint64, tag = "1")]
    pub sequence_id: u64,
}

/// `PingMessage` and `PongMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// `DownstreamMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DownstreamMessage {
    #[prost(oneof = "Downstream", tags = "1, 2, 3, 4")]
    pub message: Option<Downstream>,
}

/// The `message` oneof of [`DownstreamMessage`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Downstream {
    #[prost(message, tag = "1")]
    Ack(AckMessage),
    #[prost(message, tag = "2")]
    Data(DataMessage),
    #[prost(message, tag = "3")]
    System(SystemMessage),
    #[prost(message, tag = "4")]
    Pong(Empty),
}

/// `AckMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AckMessage {
    #[prost(uint64, tag = "1")]
    pub ack_id: u64,
    #[prost(bool, tag = "2")]
    pub success: bool,
    #[prost(message, optional, tag = "3")]
    pub error: Option<ErrorMessage>,
}

/// `AckMessage.ErrorMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ErrorMessage {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// `DataMessage`; `sequence_id` 0 means absent (non-reliable).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DataMessage {
    #[prost(string, tag = "1")]
    pub from: String,
    #[prost(string, optional, tag = "2")]
    pub group: Option<String>,
    #[prost(message, optional, tag = "3")]
    pub data: Option<MessageData>,
    #[prost(uint64, tag = "4")]
    pub sequence_id: u64,
}

/// `SystemMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SystemMessage {
    #[prost(oneof = "System", tags = "1, 2")]
    pub message: Option<System>,
}

/// The `message` oneof of [`SystemMessage`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum System {
    #[prost(message, tag = "1")]
    Connected(ConnectedMessage),
    #[prost(message, tag = "2")]
    Disconnected(DisconnectedMessage),
}

/// `SystemMessage.ConnectedMessage`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConnectedMessage {
    #[prost(string, tag = "1")]
    pub connection_id: String,
    #[prost(string, tag = "2")]
    pub user_id: String,
    #[prost(string, tag = "3")]
    pub reconnection_token: String,
}

/// `SystemMessage.DisconnectedMessage` (its one field is number 2).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DisconnectedMessage {
    #[prost(string, tag = "2")]
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn up(m: Upstream) -> UpstreamMessage {
        UpstreamMessage { message: Some(m) }
    }

    #[test]
    fn upstream_bytes_match_the_schema() {
        assert_eq!(up(Upstream::Ping(Empty {})).encode_to_vec(), [0x4a, 0x00]);
        let join = up(Upstream::JoinGroup(GroupMessage {
            group: "g".into(),
            ack_id: Some(1),
        }));
        assert_eq!(
            join.encode_to_vec(),
            [0x32, 0x05, 0x0a, 0x01, b'g', 0x10, 0x01]
        );
        let leave = up(Upstream::LeaveGroup(GroupMessage {
            group: "g".into(),
            ack_id: None,
        }));
        assert_eq!(leave.encode_to_vec(), [0x3a, 0x03, 0x0a, 0x01, b'g']);
        let ack = up(Upstream::SequenceAck(SequenceAckMessage { sequence_id: 5 }));
        assert_eq!(ack.encode_to_vec(), [0x42, 0x02, 0x08, 0x05]);
    }

    #[test]
    fn upstream_round_trips() {
        let data = MessageData::from_payload(&Payload::Json(json!({"a":1}))).unwrap();
        for m in [
            up(Upstream::SendToGroup(SendToGroupMessage {
                group: "g".into(),
                ack_id: Some(3),
                data: Some(data.clone()),
                no_echo: Some(true),
            })),
            up(Upstream::Event(EventMessage {
                event: "e".into(),
                data: Some(data),
                ack_id: None,
            })),
        ] {
            assert_eq!(
                UpstreamMessage::decode(m.encode_to_vec().as_slice()).unwrap(),
                m
            );
        }
    }

    #[test]
    fn downstream_round_trips() {
        let data = Some(MessageData {
            data: Some(Data::Binary(vec![1, 2, 3])),
        });
        for m in [
            Downstream::Ack(AckMessage {
                ack_id: 1,
                success: false,
                error: Some(ErrorMessage {
                    name: "Duplicate".into(),
                    message: "m".into(),
                }),
            }),
            Downstream::Data(DataMessage {
                from: "group".into(),
                group: Some("g".into()),
                data,
                sequence_id: 7,
            }),
            Downstream::System(SystemMessage {
                message: Some(System::Connected(ConnectedMessage {
                    connection_id: "c".into(),
                    user_id: "u".into(),
                    reconnection_token: "t".into(),
                })),
            }),
            Downstream::System(SystemMessage {
                message: Some(System::Disconnected(DisconnectedMessage {
                    reason: "r".into(),
                })),
            }),
            Downstream::Pong(Empty {}),
        ] {
            let m = DownstreamMessage { message: Some(m) };
            assert_eq!(
                DownstreamMessage::decode(m.encode_to_vec().as_slice()).unwrap(),
                m
            );
        }
        let pong = DownstreamMessage {
            message: Some(Downstream::Pong(Empty {})),
        };
        assert_eq!(pong.encode_to_vec(), [0x22, 0x00]);
    }

    #[test]
    fn payload_conversions() {
        let any = Any {
            type_url: "type.googleapis.com/x".into(),
            value: vec![8, 1],
        };
        for p in [
            Payload::Text("t".into()),
            Payload::Binary(vec![0, 255]),
            Payload::Json(json!([1, "x"])),
            Payload::Protobuf(any.encode_to_vec()),
        ] {
            assert_eq!(
                MessageData::from_payload(&p)
                    .unwrap()
                    .into_payload()
                    .unwrap(),
                p
            );
        }
        assert!(matches!(
            MessageData { data: None }.into_payload(),
            Err(ProtocolError::MissingData)
        ));
        let bad_json = MessageData {
            data: Some(Data::Json("{".into())),
        };
        assert!(matches!(
            bad_json.into_payload(),
            Err(ProtocolError::Json(_))
        ));
    }
}
