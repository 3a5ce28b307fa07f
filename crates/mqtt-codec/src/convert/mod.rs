//! Conversions between rmqtt-codec's packet types and ours.
//!
//! rmqtt → ours is `From` and moves every `Bytes`/`ByteString` (no copies).
//! ours → rmqtt is `TryFrom<&_>`: the codec encodes from a borrowed packet, so the
//! fields are cloned, which for `Bytes`/`ByteString` is a reference-count bump, never
//! a payload copy. It is fallible because rmqtt-codec's types are narrower than ours:
//! packet identifiers and some properties are `NonZero*`, and reason codes are enums
//! holding only the values the spec lists for each packet.
//!
//! Normalisation (documented loss): rmqtt-codec stores several MQTT 5 properties as
//! plain values with the spec default (Session Expiry Interval 0, Receive Maximum
//! 65535, Maximum QoS 2, Request Problem Information true, Retain Available true, ...),
//! so a property sent explicitly with its default value decodes as `None`, and an
//! explicit default is omitted when encoding. The meaning is the same either way.

pub(crate) mod v3;
pub(crate) mod v5;
mod v5_ack;

use std::num::NonZeroU16;

use rmqtt_codec::types::QoS as RQoS;

use crate::{EncodeError, QoS};

impl From<RQoS> for QoS {
    fn from(q: RQoS) -> Self {
        match q {
            RQoS::AtMostOnce => QoS::AtMostOnce,
            RQoS::AtLeastOnce => QoS::AtLeastOnce,
            RQoS::ExactlyOnce => QoS::ExactlyOnce,
        }
    }
}

impl From<QoS> for RQoS {
    fn from(q: QoS) -> Self {
        match q {
            QoS::AtMostOnce => RQoS::AtMostOnce,
            QoS::AtLeastOnce => RQoS::AtLeastOnce,
            QoS::ExactlyOnce => RQoS::ExactlyOnce,
        }
    }
}

pub(crate) fn packet_id(id: u16) -> Result<NonZeroU16, EncodeError> {
    NonZeroU16::new(id).ok_or(EncodeError::Invalid("packet identifier 0"))
}

pub(crate) fn opt_packet_id(id: Option<u16>) -> Result<Option<NonZeroU16>, EncodeError> {
    id.map(packet_id).transpose()
}
