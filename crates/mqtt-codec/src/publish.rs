//! PUBLISH, written by hand for both versions instead of going through rmqtt-codec.
//!
//! Why: rmqtt-codec stores Message Expiry Interval and Topic Alias as `NonZero*`,
//! so a Message Expiry Interval of 0 (legal on the wire) is refused as malformed and
//! cannot be encoded, and Topic Alias 0 comes back as a generic "malformed packet"
//! where the spec asks for 0x94 Topic Alias invalid [MQTT-3.3.2-8]. PUBLISH is also the hot
//! path; decoding here goes straight into our struct with the payload as a slice of
//! the received frame (no `Box`, no intermediate struct).
//!
//! Checks done while decoding: QoS 3 [MQTT-3.3.1-4], DUP on QoS 0 [MQTT-3.3.1-2],
//! packet identifier 0 [MQTT-2.2.1-3], topic name syntax [MQTT-3.3.2-2] (empty only
//! with a Topic Alias, MQTT 5), Topic Alias 0 [MQTT-3.3.2-8], Subscription Identifier
//! 0, duplicated single-valued properties, and — for a server codec — Subscription
//! Identifiers from a client [MQTT-3.3.4-6].

use bytes::{Buf, Bytes, BytesMut};
use bytestring::ByteString;

use crate::property_id as id;
use crate::room::Room;
use crate::wire::{
    check_len, read_binary, read_string, read_u16, read_u32, read_u8, read_varint, varint_len,
    MAX_VARINT,
};
use crate::{validate, DecodeError, EncodeError, ProtocolVersion, Publish, PublishProperties, QoS};

const CLAUSE: &str = "MQTT-3.3.2";

const fn duplicate(detail: &'static str) -> DecodeError {
    DecodeError::Protocol {
        clause: "MQTT-2.2.2",
        detail,
    }
}

/// Decodes a PUBLISH body. `flags` is the low nibble of the first byte;
/// `from_client` turns on the checks a server applies to what clients send.
pub(crate) fn decode(
    flags: u8,
    mut body: Bytes,
    version: ProtocolVersion,
    from_client: bool,
) -> Result<Publish, DecodeError> {
    let qos = QoS::from_u8((flags >> 1) & 0b11).ok_or(DecodeError::Malformed {
        clause: "MQTT-3.3.1-4",
        detail: "PUBLISH with QoS 3",
    })?;
    let dup = flags & 0b1000 != 0;
    if dup && qos == QoS::AtMostOnce {
        return Err(DecodeError::Malformed {
            clause: "MQTT-3.3.1-2",
            detail: "DUP set on a QoS 0 PUBLISH",
        });
    }
    let topic = read_string(&mut body, CLAUSE)?;
    let packet_id = if qos == QoS::AtMostOnce {
        None
    } else {
        match read_u16(&mut body, CLAUSE)? {
            0 => {
                return Err(DecodeError::Protocol {
                    clause: "MQTT-2.2.1-3",
                    detail: "PUBLISH with QoS > 0 and packet identifier 0",
                })
            }
            id => Some(id),
        }
    };
    let properties = match version {
        ProtocolVersion::V311 => PublishProperties::default(),
        ProtocolVersion::V5 => decode_properties(&mut body)?,
    };
    if !(topic.is_empty() && properties.topic_alias.is_some()) {
        validate::topic_name(&topic)?;
    }
    if from_client && !properties.subscription_identifiers.is_empty() {
        return Err(DecodeError::Protocol {
            clause: "MQTT-3.3.4-6",
            detail: "a client PUBLISH must not carry Subscription Identifiers",
        });
    }
    Ok(Publish {
        dup,
        qos,
        retain: flags & 1 != 0,
        topic,
        packet_id,
        payload: body,
        properties,
    })
}

fn decode_properties(body: &mut Bytes) -> Result<PublishProperties, DecodeError> {
    let len = read_varint(body, CLAUSE)? as usize;
    if body.len() < len {
        return Err(crate::wire::truncated(CLAUSE));
    }
    let mut src = body.split_to(len);
    let mut p = PublishProperties::default();
    let mut seen_format = false;
    while src.has_remaining() {
        match src.get_u8() {
            id::PAYLOAD_FORMAT => {
                if seen_format {
                    return Err(duplicate("Payload Format Indicator included twice"));
                }
                seen_format = true;
                p.payload_format_utf8 = read_payload_format(&mut src)?;
            }
            id::MESSAGE_EXPIRY => {
                let v = read_u32(&mut src, CLAUSE)?;
                set_once(
                    &mut p.message_expiry_interval,
                    v,
                    "Message Expiry Interval included twice",
                )?;
            }
            id::CONTENT_TYPE => {
                let v = read_string(&mut src, CLAUSE)?;
                set_once(&mut p.content_type, v, "Content Type included twice")?;
            }
            id::RESPONSE_TOPIC => {
                let v = read_string(&mut src, CLAUSE)?;
                set_once(&mut p.response_topic, v, "Response Topic included twice")?;
            }
            id::CORRELATION_DATA => {
                let v = read_binary(&mut src, CLAUSE)?;
                set_once(
                    &mut p.correlation_data,
                    v,
                    "Correlation Data included twice",
                )?;
            }
            id::SUBSCRIPTION_ID => match read_varint(&mut src, CLAUSE)? {
                0 => return Err(zero("MQTT-3.3.2.3.8", "Subscription Identifier 0")),
                v => p.subscription_identifiers.push(v),
            },
            id::TOPIC_ALIAS => match read_u16(&mut src, CLAUSE)? {
                0 => return Err(zero("MQTT-3.3.2-8", "Topic Alias 0")),
                v => set_once(&mut p.topic_alias, v, "Topic Alias included twice")?,
            },
            id::USER_PROPERTY => {
                let k = read_string(&mut src, CLAUSE)?;
                let v = read_string(&mut src, CLAUSE)?;
                p.user_properties.push((k, v));
            }
            _ => {
                return Err(DecodeError::Malformed {
                    clause: "MQTT-2.2.2",
                    detail: "property identifier not valid in PUBLISH",
                })
            }
        }
    }
    Ok(p)
}

fn read_payload_format(src: &mut Bytes) -> Result<bool, DecodeError> {
    match read_u8(src, CLAUSE)? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::Protocol {
            clause: "MQTT-3.3.2.3.2",
            detail: "Payload Format Indicator other than 0 or 1",
        }),
    }
}

/// A property whose value may not be 0.
fn zero(clause: &'static str, detail: &'static str) -> DecodeError {
    DecodeError::Protocol { clause, detail }
}

fn set_once<T>(slot: &mut Option<T>, value: T, detail: &'static str) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(duplicate(detail));
    }
    *slot = Some(value);
    Ok(())
}

/// A PUBLISH to encode, borrowing the message it carries: the per-hop fields (DUP,
/// QoS, RETAIN, packet id, Topic Alias, Message Expiry left, Subscription
/// Identifiers) are given apart, and those of `properties` are ignored, so a broker
/// can write one shared message to many subscribers without copying its properties.
#[derive(Debug, Clone, Copy)]
pub struct PublishRef<'a> {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// Empty when only a Topic Alias is sent (MQTT 5).
    pub topic: &'a str,
    pub packet_id: Option<u16>,
    pub payload: &'a [u8],
    /// Everything else (Payload Format, Content Type, Response Topic, Correlation
    /// Data, User Properties).
    pub properties: &'a PublishProperties,
    pub message_expiry_interval: Option<u32>,
    pub topic_alias: Option<u16>,
    pub subscription_identifiers: &'a [u32],
}

impl<'a> PublishRef<'a> {
    /// The view of a whole [`Publish`].
    pub fn of(p: &'a Publish) -> PublishRef<'a> {
        PublishRef {
            dup: p.dup,
            qos: p.qos,
            retain: p.retain,
            topic: &p.topic,
            packet_id: p.packet_id,
            payload: &p.payload,
            properties: &p.properties,
            message_expiry_interval: p.properties.message_expiry_interval,
            topic_alias: p.properties.topic_alias,
            subscription_identifiers: &p.properties.subscription_identifiers,
        }
    }
}

/// Appends one PUBLISH. For 3.1.1 the properties are dropped.
pub(crate) fn encode(
    p: &PublishRef<'_>,
    version: ProtocolVersion,
    dst: &mut BytesMut,
) -> Result<(), EncodeError> {
    match (p.qos, p.packet_id) {
        (QoS::AtMostOnce, Some(_)) => {
            return Err(EncodeError::Invalid(
                "QoS 0 PUBLISH with a packet identifier",
            ))
        }
        (QoS::AtLeastOnce | QoS::ExactlyOnce, None | Some(0)) => {
            return Err(EncodeError::Invalid(
                "QoS > 0 PUBLISH needs a non-zero packet identifier",
            ))
        }
        _ => {}
    }
    if p.topic.is_empty() && (version == ProtocolVersion::V311 || p.topic_alias.is_none()) {
        return Err(EncodeError::Invalid(
            "PUBLISH with an empty topic and no Topic Alias",
        ));
    }
    check_len(p.topic.as_bytes())?;
    let props_len = match version {
        ProtocolVersion::V311 => None,
        ProtocolVersion::V5 => Some(properties_len(p)?),
    };
    let mut remaining = 2 + p.topic.len() + p.payload.len();
    if p.packet_id.is_some() {
        remaining += 2;
    }
    if let Some(len) = props_len {
        remaining += varint_len(len) + len;
    }
    if remaining > MAX_VARINT as usize {
        return Err(EncodeError::Invalid(
            "PUBLISH larger than the maximum packet size",
        ));
    }
    let start = dst.len();
    let mut room = Room::append(dst, 1 + varint_len(remaining) + remaining);
    let qos = p.qos as u8;
    room.u8(0x30 | (u8::from(p.dup) << 3) | (qos << 1) | u8::from(p.retain));
    room.varint(remaining);
    room.binary(p.topic.as_bytes());
    if let Some(id) = p.packet_id {
        room.u16(id);
    }
    if let Some(len) = props_len {
        room.varint(len);
        write_properties(p, &mut room);
    }
    room.slice(p.payload);
    room.filled().inspect_err(|_| dst.truncate(start))
}

fn string_prop_len(v: &Option<impl AsRef<[u8]>>) -> Result<usize, EncodeError> {
    match v {
        Some(s) => {
            check_len(s.as_ref())?;
            Ok(3 + s.as_ref().len())
        }
        None => Ok(0),
    }
}

/// Property length (without its own varint) of a PUBLISH's properties.
fn properties_len(p: &PublishRef<'_>) -> Result<usize, EncodeError> {
    let props = p.properties;
    let mut len = if props.payload_format_utf8 { 2 } else { 0 };
    if p.message_expiry_interval.is_some() {
        len += 5;
    }
    len += string_prop_len(&props.content_type.as_ref().map(ByteString::as_bytes))?;
    len += string_prop_len(&props.response_topic.as_ref().map(ByteString::as_bytes))?;
    len += string_prop_len(&props.correlation_data)?;
    for &sid in p.subscription_identifiers {
        if sid == 0 || sid > MAX_VARINT {
            return Err(EncodeError::Invalid(
                "Subscription Identifier outside 1..=268435455",
            ));
        }
        len += 1 + varint_len(sid as usize);
    }
    if p.topic_alias == Some(0) {
        return Err(EncodeError::Invalid("Topic Alias 0"));
    }
    if p.topic_alias.is_some() {
        len += 3;
    }
    len += user_properties_len(&props.user_properties)?;
    Ok(len)
}

pub(crate) fn user_properties_len(props: &crate::UserProperties) -> Result<usize, EncodeError> {
    let mut len = 0;
    for (k, v) in props {
        check_len(k.as_bytes())?;
        check_len(v.as_bytes())?;
        len += 5 + k.len() + v.len();
    }
    Ok(len)
}

fn write_properties(p: &PublishRef<'_>, room: &mut Room<'_>) {
    let props = p.properties;
    if props.payload_format_utf8 {
        room.slice(&[id::PAYLOAD_FORMAT, 1]);
    }
    if let Some(v) = p.message_expiry_interval {
        room.u8(id::MESSAGE_EXPIRY);
        room.u32(v);
    }
    if let Some(v) = &props.content_type {
        room.u8(id::CONTENT_TYPE);
        room.binary(v.as_bytes());
    }
    if let Some(v) = &props.response_topic {
        room.u8(id::RESPONSE_TOPIC);
        room.binary(v.as_bytes());
    }
    if let Some(v) = &props.correlation_data {
        room.u8(id::CORRELATION_DATA);
        room.binary(v);
    }
    for &sid in p.subscription_identifiers {
        room.u8(id::SUBSCRIPTION_ID);
        room.varint(sid as usize);
    }
    if let Some(v) = p.topic_alias {
        room.u8(id::TOPIC_ALIAS);
        room.u16(v);
    }
    for (k, v) in &props.user_properties {
        room.u8(id::USER_PROPERTY);
        room.binary(k.as_bytes());
        room.binary(v.as_bytes());
    }
}
