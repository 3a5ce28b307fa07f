//! U+0000 check for the strings of packets decoded by rmqtt-codec.
//!
//! rmqtt-codec checks that UTF-8 strings are well-formed but not that they are free
//! of U+0000, which makes the packet malformed [MQTT-1.5.4-2]. Our own PUBLISH
//! decoder checks while reading; for the other packets this walks every string
//! field after decoding (binary fields such as passwords may contain zero bytes).

use bytestring::ByteString;

use crate::{DecodeError, Packet, UserProperties};

fn s(v: &ByteString) -> Result<(), DecodeError> {
    if v.as_bytes().contains(&0) {
        return Err(DecodeError::InvalidUtf8);
    }
    Ok(())
}

fn opt(v: &Option<ByteString>) -> Result<(), DecodeError> {
    v.as_ref().map_or(Ok(()), s)
}

fn user(props: &UserProperties) -> Result<(), DecodeError> {
    props.iter().try_for_each(|(k, v)| s(k).and_then(|()| s(v)))
}

fn diag(reason: &Option<ByteString>, props: &UserProperties) -> Result<(), DecodeError> {
    opt(reason)?;
    user(props)
}

pub(crate) fn check(packet: &Packet) -> Result<(), DecodeError> {
    match packet {
        Packet::Connect(c) => {
            s(&c.client_id)?;
            opt(&c.username)?;
            opt(&c.properties.authentication_method)?;
            user(&c.properties.user_properties)?;
            if let Some(w) = &c.will {
                s(&w.topic)?;
                opt(&w.properties.content_type)?;
                opt(&w.properties.response_topic)?;
                user(&w.properties.user_properties)?;
            }
            Ok(())
        }
        Packet::ConnAck(a) => {
            let p = &a.properties;
            for v in [
                &p.assigned_client_identifier,
                &p.response_information,
                &p.server_reference,
            ] {
                opt(v)?;
            }
            opt(&p.authentication_method)?;
            diag(&p.reason_string, &p.user_properties)
        }
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            diag(&a.reason_string, &a.user_properties)
        }
        Packet::Subscribe(sub) => {
            sub.filters.iter().try_for_each(|(f, _)| s(f))?;
            user(&sub.user_properties)
        }
        Packet::Unsubscribe(u) => {
            u.filters.iter().try_for_each(s)?;
            user(&u.user_properties)
        }
        Packet::SubAck(a) => diag(&a.reason_string, &a.user_properties),
        Packet::UnsubAck(a) => diag(&a.reason_string, &a.user_properties),
        Packet::Disconnect(d) => {
            opt(&d.server_reference)?;
            diag(&d.reason_string, &d.user_properties)
        }
        Packet::Auth(a) => {
            opt(&a.authentication_method)?;
            diag(&a.reason_string, &a.user_properties)
        }
        Packet::Publish(_) | Packet::PingReq | Packet::PingResp => Ok(()),
    }
}
