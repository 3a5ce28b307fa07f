//! rmqtt-codec `v5` types ↔ ours. See the parent module for what is normalised.

use std::num::{NonZeroU16, NonZeroU32};

use rmqtt_codec::types::{Publish as RPublish, QoS as RQoS};
use rmqtt_codec::v5 as r;

use super::opt_packet_id;
use crate::packet::*;
use crate::EncodeError;

pub(super) fn code<T: TryFrom<u8>>(rc: ReasonCode) -> Result<T, EncodeError> {
    T::try_from(rc.0).map_err(|_| EncodeError::Invalid("reason code not allowed in this packet"))
}

pub(super) fn nonzero_u32(
    v: Option<u32>,
    what: &'static str,
) -> Result<Option<NonZeroU32>, EncodeError> {
    v.map(|v| NonZeroU32::new(v).ok_or(EncodeError::Invalid(what)))
        .transpose()
}

pub(super) fn nonzero_u16(
    v: Option<u16>,
    what: &'static str,
) -> Result<Option<NonZeroU16>, EncodeError> {
    v.map(|v| NonZeroU16::new(v).ok_or(EncodeError::Invalid(what)))
        .transpose()
}

/// `Some(v)` unless `v` is the spec default, which rmqtt-codec cannot tell from absence.
fn unless_default<T: PartialEq>(v: T, default: T) -> Option<T> {
    (v != default).then_some(v)
}

impl From<r::LastWill> for LastWill {
    fn from(w: r::LastWill) -> Self {
        LastWill {
            qos: w.qos.into(),
            retain: w.retain,
            topic: w.topic,
            payload: w.message,
            properties: WillProperties {
                will_delay_interval: w.will_delay_interval_sec,
                payload_format_utf8: w.is_utf8_payload.unwrap_or(false),
                message_expiry_interval: w.message_expiry_interval.map(NonZeroU32::get),
                content_type: w.content_type,
                response_topic: w.response_topic,
                correlation_data: w.correlation_data,
                user_properties: w.user_properties,
            },
        }
    }
}

impl From<r::Connect> for Connect {
    fn from(c: r::Connect) -> Self {
        Connect {
            protocol: ProtocolVersion::V5,
            clean_start: c.clean_start,
            keep_alive: c.keep_alive,
            client_id: c.client_id,
            username: c.username,
            password: c.password,
            will: c.last_will.map(LastWill::from),
            properties: ConnectProperties {
                session_expiry_interval: unless_default(c.session_expiry_interval_secs, 0),
                receive_maximum: c.receive_max.map(NonZeroU16::get),
                maximum_packet_size: c.max_packet_size.map(NonZeroU32::get),
                topic_alias_maximum: unless_default(c.topic_alias_max, 0),
                request_response_information: unless_default(c.request_response_info, false),
                request_problem_information: unless_default(c.request_problem_info, true),
                user_properties: c.user_properties,
                authentication_method: c.auth_method,
                authentication_data: c.auth_data,
            },
        }
    }
}

impl TryFrom<&Connect> for r::Connect {
    type Error = EncodeError;
    fn try_from(c: &Connect) -> Result<Self, EncodeError> {
        let p = &c.properties;
        let last_will = match &c.will {
            None => None,
            Some(w) => Some(r::LastWill {
                qos: w.qos.into(),
                retain: w.retain,
                topic: w.topic.clone(),
                message: w.payload.clone(),
                will_delay_interval_sec: w.properties.will_delay_interval,
                correlation_data: w.properties.correlation_data.clone(),
                message_expiry_interval: nonzero_u32(
                    w.properties.message_expiry_interval,
                    "will Message Expiry Interval 0 is not supported",
                )?,
                content_type: w.properties.content_type.clone(),
                user_properties: w.properties.user_properties.clone(),
                is_utf8_payload: w.properties.payload_format_utf8.then_some(true),
                response_topic: w.properties.response_topic.clone(),
            }),
        };
        Ok(r::Connect {
            clean_start: c.clean_start,
            keep_alive: c.keep_alive,
            session_expiry_interval_secs: p.session_expiry_interval.unwrap_or(0),
            auth_method: p.authentication_method.clone(),
            auth_data: p.authentication_data.clone(),
            request_problem_info: p.request_problem_information.unwrap_or(true),
            request_response_info: p.request_response_information.unwrap_or(false),
            receive_max: nonzero_u16(p.receive_maximum, "Receive Maximum 0")?,
            topic_alias_max: p.topic_alias_maximum.unwrap_or(0),
            user_properties: p.user_properties.clone(),
            max_packet_size: nonzero_u32(p.maximum_packet_size, "Maximum Packet Size 0")?,
            last_will,
            client_id: c.client_id.clone(),
            username: c.username.clone(),
            password: c.password.clone(),
            cert: None,
        })
    }
}

impl From<r::ConnectAck> for ConnAck {
    fn from(a: r::ConnectAck) -> Self {
        ConnAck {
            session_present: a.session_present,
            reason_code: ReasonCode(a.reason_code.into()),
            properties: ConnAckProperties {
                session_expiry_interval: a.session_expiry_interval_secs,
                receive_maximum: unless_default(a.receive_max.get(), u16::MAX),
                maximum_qos: unless_default(a.max_qos, RQoS::ExactlyOnce).map(QoS::from),
                retain_available: unless_default(a.retain_available, true),
                maximum_packet_size: a.max_packet_size,
                assigned_client_identifier: a.assigned_client_id,
                topic_alias_maximum: unless_default(a.topic_alias_max, 0),
                reason_string: a.reason_string,
                user_properties: a.user_properties,
                wildcard_subscription_available: unless_default(
                    a.wildcard_subscription_available,
                    true,
                ),
                subscription_identifiers_available: unless_default(
                    a.subscription_identifiers_available,
                    true,
                ),
                shared_subscription_available: unless_default(
                    a.shared_subscription_available,
                    true,
                ),
                server_keep_alive: a.server_keepalive_sec,
                response_information: a.response_info,
                server_reference: a.server_reference,
                authentication_method: a.auth_method,
                authentication_data: a.auth_data,
            },
        }
    }
}

impl TryFrom<&ConnAck> for r::ConnectAck {
    type Error = EncodeError;
    fn try_from(a: &ConnAck) -> Result<Self, EncodeError> {
        let p = &a.properties;
        let receive_max = match p.receive_maximum {
            None => NonZeroU16::MAX,
            Some(v) => NonZeroU16::new(v).ok_or(EncodeError::Invalid("Receive Maximum 0"))?,
        };
        Ok(r::ConnectAck {
            session_present: a.session_present,
            reason_code: code(a.reason_code)?,
            session_expiry_interval_secs: p.session_expiry_interval,
            receive_max,
            max_qos: p.maximum_qos.unwrap_or(QoS::ExactlyOnce).into(),
            max_packet_size: p.maximum_packet_size,
            assigned_client_id: p.assigned_client_identifier.clone(),
            topic_alias_max: p.topic_alias_maximum.unwrap_or(0),
            retain_available: p.retain_available.unwrap_or(true),
            wildcard_subscription_available: p.wildcard_subscription_available.unwrap_or(true),
            subscription_identifiers_available: p
                .subscription_identifiers_available
                .unwrap_or(true),
            shared_subscription_available: p.shared_subscription_available.unwrap_or(true),
            server_keepalive_sec: p.server_keep_alive,
            response_info: p.response_information.clone(),
            server_reference: p.server_reference.clone(),
            auth_method: p.authentication_method.clone(),
            auth_data: p.authentication_data.clone(),
            reason_string: p.reason_string.clone(),
            user_properties: p.user_properties.clone(),
        })
    }
}

/// The shared `types::Publish` (its `properties` is `None` for 3.1.1).
impl From<RPublish> for Publish {
    fn from(p: RPublish) -> Self {
        let props = p.properties.unwrap_or_default();
        Publish {
            dup: p.dup,
            qos: p.qos.into(),
            retain: p.retain,
            topic: p.topic,
            packet_id: p.packet_id.map(NonZeroU16::get),
            payload: p.payload,
            properties: PublishProperties {
                payload_format_utf8: props.is_utf8_payload,
                message_expiry_interval: props.message_expiry_interval.map(NonZeroU32::get),
                topic_alias: props.topic_alias.map(NonZeroU16::get),
                response_topic: props.response_topic,
                correlation_data: props.correlation_data,
                user_properties: props.user_properties,
                subscription_identifiers: props
                    .subscription_ids
                    .into_iter()
                    .map(NonZeroU32::get)
                    .collect(),
                content_type: props.content_type,
            },
        }
    }
}

impl From<r::Packet> for Packet {
    fn from(p: r::Packet) -> Self {
        match p {
            r::Packet::Connect(c) => Packet::Connect(Box::new((*c).into())),
            r::Packet::ConnectAck(a) => Packet::ConnAck((*a).into()),
            r::Packet::Publish(p) => Packet::Publish((*p).into()),
            r::Packet::PublishAck(a) => Packet::PubAck(a.into()),
            r::Packet::PublishReceived(a) => Packet::PubRec(a.into()),
            r::Packet::PublishRelease(a) => Packet::PubRel(a.into()),
            r::Packet::PublishComplete(a) => Packet::PubComp(a.into()),
            r::Packet::Subscribe(s) => Packet::Subscribe(s.into()),
            r::Packet::SubscribeAck(a) => Packet::SubAck(a.into()),
            r::Packet::Unsubscribe(u) => Packet::Unsubscribe(u.into()),
            r::Packet::UnsubscribeAck(a) => Packet::UnsubAck(a.into()),
            r::Packet::PingRequest => Packet::PingReq,
            r::Packet::PingResponse => Packet::PingResp,
            r::Packet::Disconnect(d) => Packet::Disconnect(d.into()),
            r::Packet::Auth(a) => Packet::Auth(a.into()),
        }
    }
}

/// Every packet but PUBLISH, which `crate::publish` encodes itself.
impl TryFrom<&Packet> for r::Packet {
    type Error = EncodeError;
    fn try_from(p: &Packet) -> Result<Self, EncodeError> {
        Ok(match p {
            Packet::Connect(c) => r::Packet::Connect(Box::new(c.as_ref().try_into()?)),
            Packet::ConnAck(a) => r::Packet::ConnectAck(Box::new(a.try_into()?)),
            Packet::Publish(_) => {
                return Err(EncodeError::Invalid(
                    "PUBLISH is encoded by statehub's own encoder",
                ))
            }
            Packet::PubAck(a) => r::Packet::PublishAck(a.try_into()?),
            Packet::PubRec(a) => r::Packet::PublishReceived(a.try_into()?),
            Packet::PubRel(a) => r::Packet::PublishRelease(a.try_into()?),
            Packet::PubComp(a) => r::Packet::PublishComplete(a.try_into()?),
            Packet::Subscribe(s) => r::Packet::Subscribe(s.try_into()?),
            Packet::SubAck(a) => r::Packet::SubscribeAck(a.try_into()?),
            Packet::Unsubscribe(u) => r::Packet::Unsubscribe(u.try_into()?),
            Packet::UnsubAck(a) => r::Packet::UnsubscribeAck(a.try_into()?),
            Packet::PingReq => r::Packet::PingRequest,
            Packet::PingResp => r::Packet::PingResponse,
            Packet::Disconnect(d) => r::Packet::Disconnect(d.try_into()?),
            Packet::Auth(a) => r::Packet::Auth(a.try_into()?),
        })
    }
}

/// MQTT 5 form (properties always `Some`). The codec encodes PUBLISH itself; this
/// completes the mapping for callers that hold rmqtt-codec types.
impl TryFrom<&Publish> for RPublish {
    type Error = EncodeError;
    fn try_from(p: &Publish) -> Result<Self, EncodeError> {
        let props = &p.properties;
        let subscription_ids = props
            .subscription_identifiers
            .iter()
            .map(|&id| NonZeroU32::new(id).ok_or(EncodeError::Invalid("Subscription Identifier 0")))
            .collect::<Result<_, _>>()?;
        Ok(RPublish {
            dup: p.dup,
            retain: p.retain,
            qos: p.qos.into(),
            topic: p.topic.clone(),
            packet_id: opt_packet_id(p.packet_id)?,
            payload: p.payload.clone(),
            properties: Some(r::PublishProperties {
                topic_alias: nonzero_u16(props.topic_alias, "Topic Alias 0")?,
                correlation_data: props.correlation_data.clone(),
                message_expiry_interval: nonzero_u32(
                    props.message_expiry_interval,
                    "Message Expiry Interval 0",
                )?,
                content_type: props.content_type.clone(),
                user_properties: props.user_properties.clone(),
                is_utf8_payload: props.payload_format_utf8,
                response_topic: props.response_topic.clone(),
                subscription_ids,
            }),
        })
    }
}
