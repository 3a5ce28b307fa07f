//! rmqtt-codec `v3` types ↔ ours.
//!
//! 3.1.1 has no properties and no reason codes beyond CONNACK return codes and
//! SUBACK's granted-QoS-or-0x80, so going to 3.1.1 drops the MQTT 5 fields and maps
//! reason codes to the nearest 3.1.1 code; coming from 3.1.1 fills in defaults.

use rmqtt_codec::types::Protocol;
use rmqtt_codec::v3 as r;

use super::packet_id;
use crate::packet::*;
use crate::EncodeError;

/// CONNACK return code (3.1.1 section 3.2.2.3) → MQTT 5 reason code.
fn connack_reason(rc: r::ConnectAckReason) -> ReasonCode {
    match rc {
        r::ConnectAckReason::ConnectionAccepted => ReasonCode::SUCCESS,
        r::ConnectAckReason::UnacceptableProtocolVersion => {
            ReasonCode::UNSUPPORTED_PROTOCOL_VERSION
        }
        r::ConnectAckReason::IdentifierRejected => ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        r::ConnectAckReason::ServiceUnavailable => ReasonCode::SERVER_UNAVAILABLE,
        r::ConnectAckReason::BadUserNameOrPassword => ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        r::ConnectAckReason::NotAuthorized => ReasonCode::NOT_AUTHORIZED,
        r::ConnectAckReason::Reserved => ReasonCode::UNSPECIFIED_ERROR,
    }
}

/// MQTT 5 reason code → nearest CONNACK return code.
fn connack_return_code(rc: ReasonCode) -> r::ConnectAckReason {
    match rc {
        ReasonCode::SUCCESS => r::ConnectAckReason::ConnectionAccepted,
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION => {
            r::ConnectAckReason::UnacceptableProtocolVersion
        }
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID => r::ConnectAckReason::IdentifierRejected,
        ReasonCode::BAD_USER_NAME_OR_PASSWORD => r::ConnectAckReason::BadUserNameOrPassword,
        ReasonCode::NOT_AUTHORIZED => r::ConnectAckReason::NotAuthorized,
        _ => r::ConnectAckReason::ServiceUnavailable,
    }
}

impl From<r::Connect> for Connect {
    fn from(c: r::Connect) -> Self {
        Connect {
            protocol: ProtocolVersion::V311,
            clean_start: c.clean_session,
            keep_alive: c.keep_alive,
            client_id: c.client_id,
            username: c.username,
            password: c.password,
            will: c.last_will.map(|w| LastWill {
                qos: w.qos.into(),
                retain: w.retain,
                topic: w.topic,
                payload: w.message,
                properties: WillProperties::default(),
            }),
            properties: ConnectProperties::default(),
        }
    }
}

impl From<&Connect> for r::Connect {
    fn from(c: &Connect) -> Self {
        r::Connect {
            protocol: Protocol::default(),
            clean_session: c.clean_start,
            keep_alive: c.keep_alive,
            last_will: c.will.as_ref().map(|w| r::LastWill {
                qos: w.qos.into(),
                retain: w.retain,
                topic: w.topic.clone(),
                message: w.payload.clone(),
            }),
            client_id: c.client_id.clone(),
            username: c.username.clone(),
            password: c.password.clone(),
            cert: None,
        }
    }
}

impl From<r::ConnectAck> for ConnAck {
    fn from(a: r::ConnectAck) -> Self {
        ConnAck {
            session_present: a.session_present,
            reason_code: connack_reason(a.return_code),
            properties: ConnAckProperties::default(),
        }
    }
}

impl From<&ConnAck> for r::ConnectAck {
    fn from(a: &ConnAck) -> Self {
        r::ConnectAck {
            return_code: connack_return_code(a.reason_code),
            session_present: a.session_present,
        }
    }
}

impl From<r::Packet> for Packet {
    fn from(p: r::Packet) -> Self {
        match p {
            r::Packet::Connect(c) => Packet::Connect(Box::new((*c).into())),
            r::Packet::ConnectAck(a) => Packet::ConnAck(a.into()),
            r::Packet::Publish(p) => Packet::Publish((*p).into()),
            r::Packet::PublishAck { packet_id } => Packet::PubAck(PubResponse::ok(packet_id.get())),
            r::Packet::PublishReceived { packet_id } => {
                Packet::PubRec(PubResponse::ok(packet_id.get()))
            }
            r::Packet::PublishRelease { packet_id } => {
                Packet::PubRel(PubResponse::ok(packet_id.get()))
            }
            r::Packet::PublishComplete { packet_id } => {
                Packet::PubComp(PubResponse::ok(packet_id.get()))
            }
            r::Packet::Subscribe {
                packet_id,
                topic_filters,
            } => Packet::Subscribe(Subscribe {
                packet_id: packet_id.get(),
                subscription_identifier: None,
                user_properties: Vec::new(),
                filters: topic_filters
                    .into_iter()
                    .map(|(f, qos)| {
                        (
                            f,
                            SubscriptionOptions {
                                qos: qos.into(),
                                ..Default::default()
                            },
                        )
                    })
                    .collect(),
            }),
            r::Packet::SubscribeAck { packet_id, status } => Packet::SubAck(SubAck {
                packet_id: packet_id.get(),
                reason_codes: status
                    .into_iter()
                    .map(|s| match s {
                        r::SubscribeReturnCode::Success(q) => ReasonCode(q.value()),
                        r::SubscribeReturnCode::Failure => ReasonCode::UNSPECIFIED_ERROR,
                    })
                    .collect(),
                ..Default::default()
            }),
            r::Packet::Unsubscribe {
                packet_id,
                topic_filters,
            } => Packet::Unsubscribe(Unsubscribe {
                packet_id: packet_id.get(),
                user_properties: Vec::new(),
                filters: topic_filters,
            }),
            r::Packet::UnsubscribeAck { packet_id } => Packet::UnsubAck(UnsubAck {
                packet_id: packet_id.get(),
                ..Default::default()
            }),
            r::Packet::PingRequest => Packet::PingReq,
            r::Packet::PingResponse => Packet::PingResp,
            r::Packet::Disconnect => Packet::Disconnect(Disconnect::default()),
        }
    }
}

/// Every packet but PUBLISH (encoded by `crate::publish`) and AUTH (not in 3.1.1).
impl TryFrom<&Packet> for r::Packet {
    type Error = EncodeError;
    fn try_from(p: &Packet) -> Result<Self, EncodeError> {
        Ok(match p {
            Packet::Connect(c) => r::Packet::Connect(Box::new(c.as_ref().into())),
            Packet::ConnAck(a) => r::Packet::ConnectAck(a.into()),
            Packet::Publish(_) => {
                return Err(EncodeError::Invalid(
                    "PUBLISH is encoded by statehub's own encoder",
                ))
            }
            Packet::PubAck(a) => r::Packet::PublishAck {
                packet_id: packet_id(a.packet_id)?,
            },
            Packet::PubRec(a) => r::Packet::PublishReceived {
                packet_id: packet_id(a.packet_id)?,
            },
            Packet::PubRel(a) => r::Packet::PublishRelease {
                packet_id: packet_id(a.packet_id)?,
            },
            Packet::PubComp(a) => r::Packet::PublishComplete {
                packet_id: packet_id(a.packet_id)?,
            },
            Packet::Subscribe(s) => r::Packet::Subscribe {
                packet_id: packet_id(s.packet_id)?,
                topic_filters: s
                    .filters
                    .iter()
                    .map(|(f, o)| (f.clone(), o.qos.into()))
                    .collect(),
            },
            Packet::SubAck(a) => r::Packet::SubscribeAck {
                packet_id: packet_id(a.packet_id)?,
                status: a
                    .reason_codes
                    .iter()
                    .map(|c| match QoS::from_u8(c.0) {
                        Some(q) => r::SubscribeReturnCode::Success(q.into()),
                        None => r::SubscribeReturnCode::Failure,
                    })
                    .collect(),
            },
            Packet::Unsubscribe(u) => r::Packet::Unsubscribe {
                packet_id: packet_id(u.packet_id)?,
                topic_filters: u.filters.clone(),
            },
            Packet::UnsubAck(a) => r::Packet::UnsubscribeAck {
                packet_id: packet_id(a.packet_id)?,
            },
            Packet::PingReq => r::Packet::PingRequest,
            Packet::PingResp => r::Packet::PingResponse,
            Packet::Disconnect(_) => r::Packet::Disconnect,
            Packet::Auth(_) => return Err(EncodeError::NotInV311),
        })
    }
}
