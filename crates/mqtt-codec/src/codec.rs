//! The sans-IO [`Codec`]: frames bytes into packets and back.
//!
//! Division of labour:
//! * [`crate::frame`] parses the fixed header (size limit enforced before the body
//!   arrives, reserved flags) and pre-checks bodies so errors carry precise clauses.
//! * PUBLISH (both versions) is decoded and encoded by [`crate::publish`], and the
//!   MQTT 5 "short forms" (PUBACK/PUBREC/PUBREL/PUBCOMP, DISCONNECT, AUTH with
//!   reason code 0 and no properties: Remaining Length 2 or 0) are written here,
//!   because rmqtt-codec always writes the reason code and a property length.
//! * Everything else goes through rmqtt-codec's `v3`/`v5` codecs and
//!   [`crate::convert`]. rmqtt-codec is only ever handed a complete frame, so its
//!   decoder never stops half-way through one; [`crate::strings`] then adds the
//!   U+0000 check it lacks.
//!
//! Checks the codec enforces on what it decodes: all of the above, the CONNECT layout
//! ([`crate::connect`]: nothing after its payload, properties at most once and in
//! range) plus, on a server
//! codec (one made with [`Codec::new_server`]), a client PUBLISH carrying
//! Subscription Identifiers [MQTT-3.3.4-6]. Topic Alias 0 [MQTT-3.3.2-8] and wildcard
//! topic names [MQTT-3.3.2-2] are refused on every codec. Topic *filters* are not
//! checked here: an invalid filter gets a SUBACK failure code, not a disconnect, so
//! the broker calls [`crate::validate::topic_filter`] itself.
//!
//! A decode error is fatal for the connection; after one the codec and the buffer
//! are in an unspecified state.

use bytes::{Buf, BufMut, BytesMut};
use rmqtt_codec::error::DecodeError as RError;
use tokio_util::codec::{Decoder, Encoder};

use crate::frame::{self, FixedHeader};
use crate::wire::MAX_VARINT;
use crate::{
    publish, DecodeError, EncodeError, Packet, ProtocolVersion, PubResponse, PublishRef, ReasonCode,
};

/// MQTT framing for one connection.
///
/// `max_incoming_packet_size` is the largest whole packet (fixed header included)
/// accepted from the peer; 0 means no limit beyond the protocol's own.
///
/// To refuse a CONNECT whose protocol level is unknown (no version was negotiated),
/// encode the CONNACK with `Codec::with_version(ProtocolVersion::V311, ..)`: a
/// 3.1.1 CONNACK with return code 1 is what [MQTT-3.1.2-2] asks for.
#[derive(Debug, Clone)]
pub struct Codec {
    version: Option<ProtocolVersion>,
    server: bool,
    max_incoming: u32,
}

impl Codec {
    /// Server side: the first packet must be CONNECT (3.1.1 = level 4, 5.0 = level 5,
    /// MQTT 3.1 = "MQIsdp" level 3, treated as 3.1.1); after it, the codec speaks that
    /// version. The version is fixed as soon as the protocol level is read, so even if
    /// the rest of the CONNECT is malformed the CONNACK can be encoded.
    pub fn new_server(max_incoming_packet_size: u32) -> Self {
        Codec {
            version: None,
            server: true,
            max_incoming: max_incoming_packet_size,
        }
    }

    /// Client side / tests: a fixed version from the start, no server-only checks.
    pub fn with_version(version: ProtocolVersion, max_incoming_packet_size: u32) -> Self {
        Codec {
            version: Some(version),
            server: false,
            max_incoming: max_incoming_packet_size,
        }
    }

    pub fn version(&self) -> Option<ProtocolVersion> {
        self.version
    }

    pub fn set_max_incoming_packet_size(&mut self, max: u32) {
        self.max_incoming = max;
    }

    /// `Ok(None)`: more bytes are needed, and the buffer is left intact.
    /// On success exactly one packet's bytes are consumed.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Packet>, DecodeError> {
        if self.version.is_none() && src.first().is_some_and(|b| b >> 4 != frame::CONNECT) {
            return Err(DecodeError::ExpectedConnect);
        }
        let Some(header) = frame::parse_header(src, self.max_incoming)? else {
            return Ok(None);
        };
        let version = match self.version {
            Some(v) => v,
            None => {
                frame::check_flags(header.first_byte, ProtocolVersion::V311)?;
                let Some(v) = frame::peek_connect_version(&src[header.header_len..])? else {
                    return Ok(None);
                };
                self.version = Some(v);
                v
            }
        };
        frame::check_flags(header.first_byte, version)?;
        if src.len() < header.total() {
            return Ok(None);
        }
        match header.packet_type() {
            frame::PUBLISH => {
                let frame = src.split_to(header.total()).freeze();
                let body = frame.slice(header.header_len..);
                let flags = header.first_byte & 0x0F;
                publish::decode(flags, body, version, self.server).map(|p| Some(Packet::Publish(p)))
            }
            frame::CONNECT => decode_connect(header, src, version).map(Some),
            t => {
                frame::check_body(t, &src[header.header_len..header.total()], version)?;
                if let Some(ack) = read_short_ack(t, &src[header.header_len..header.total()]) {
                    src.advance(header.total());
                    return Ok(Some(ack));
                }
                delegate(version, src, header.total(), t).map(Some)
            }
        }
    }

    /// Bytes still missing from the packet that starts `src` once its fixed header is
    /// there; `None` before that, or when the packet is complete or refused anyway. A
    /// reader can reserve exactly this instead of growing its buffer by doubling.
    pub fn missing(&self, src: &[u8]) -> Option<usize> {
        let header = frame::parse_header(src, self.max_incoming).ok()??;
        header.total().checked_sub(src.len()).filter(|&n| n > 0)
    }

    /// Appends one PUBLISH given as a [`PublishRef`] (a shared message with its
    /// per-hop fields), the way [`Codec::encode`] would write the whole [`Publish`].
    pub fn encode_publish(
        &self,
        publish: &PublishRef<'_>,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        publish::encode(publish, self.version.ok_or(EncodeError::NoVersion)?, dst)
    }

    /// Appends the PUBACK (for QoS 1) or PUBREC (for QoS 2) that says Success and
    /// nothing else: the two-byte form, the same in both versions [MQTT-3.4.2.1], as
    /// [`Codec::encode`] writes it, without a packet to build (every QoS 1 request is
    /// acknowledged so).
    pub fn encode_success_ack(
        &self,
        qos: crate::QoS,
        packet_id: u16,
        dst: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        self.version.ok_or(EncodeError::NoVersion)?;
        let first_byte = match qos {
            crate::QoS::AtMostOnce => {
                return Err(EncodeError::Invalid("QoS 0 is not acknowledged"))
            }
            crate::QoS::AtLeastOnce => 0x40,
            crate::QoS::ExactlyOnce => 0x50,
        };
        if packet_id == 0 {
            return Err(EncodeError::Invalid("packet identifier required"));
        }
        dst.put_slice(&[first_byte, 2]);
        dst.put_u16(packet_id);
        Ok(())
    }

    /// Appends exactly one packet. For 3.1.1 the MQTT 5-only fields are dropped,
    /// CONNACK reason codes become return codes (0x84→1, 0x85→2, 0x86→4, 0x87→5,
    /// other failures→3) and SUBACK failures become 0x80; AUTH is
    /// [`EncodeError::NotInV311`].
    pub fn encode(&self, packet: &Packet, dst: &mut BytesMut) -> Result<(), EncodeError> {
        let version = self.version.ok_or(EncodeError::NoVersion)?;
        if let Packet::Publish(p) = packet {
            return publish::encode(&PublishRef::of(p), version, dst);
        }
        match version {
            ProtocolVersion::V311 => {
                check_v311_size(packet)?;
                let p = rmqtt_codec::v3::Packet::try_from(packet)?;
                rmqtt_codec::v3::Codec::new(0)
                    .encode(p, dst)
                    .map_err(map_encode_error)
            }
            ProtocolVersion::V5 => {
                if encode_short_form(packet, dst) {
                    return Ok(());
                }
                let p = rmqtt_codec::v5::Packet::try_from(packet)?;
                rmqtt_codec::v5::Codec::new(0, 0)
                    .encode(p, dst)
                    .map_err(map_encode_error)
            }
        }
    }
}

fn decode_connect(
    header: FixedHeader,
    src: &mut BytesMut,
    version: ProtocolVersion,
) -> Result<Packet, DecodeError> {
    let body = &src[header.header_len..header.total()];
    let connect = frame::check_connect(body)?;
    if connect.version != version {
        let level = body[connect.flags_offset - 1];
        return Err(DecodeError::UnsupportedProtocolVersion(level));
    }
    crate::connect::check_layout(body, &connect)?;
    // rmqtt-codec refuses an empty Client Identifier without Clean Start for MQTT 5
    // too, where the spec allows it (only 3.1.1 forbids it, [MQTT-3.1.3-8]). Decode
    // with the flag set, then restore it.
    let restore_clean_start =
        version == ProtocolVersion::V5 && connect.empty_client_id && connect.flags & 0b10 == 0;
    if restore_clean_start {
        src[header.header_len + connect.flags_offset] |= 0b10;
    }
    let mut packet = delegate(version, src, header.total(), frame::CONNECT)?;
    if let (true, Packet::Connect(c)) = (restore_clean_start, &mut packet) {
        c.clean_start = false;
    }
    Ok(packet)
}

/// A PUBACK, PUBREC, PUBREL or PUBCOMP of two bytes: a packet identifier and nothing
/// else, which means Success in both versions [MQTT-3.4.2.1]. Every QoS 1 and 2 message
/// brings one back, so these are read here rather than through the general decoder.
/// `check_body` has refused identifier 0.
fn read_short_ack(packet_type: u8, body: &[u8]) -> Option<Packet> {
    let &[high, low] = body else { return None };
    let ok = PubResponse::ok(u16::from_be_bytes([high, low]));
    match packet_type {
        frame::PUBACK => Some(Packet::PubAck(ok)),
        frame::PUBREC => Some(Packet::PubRec(ok)),
        frame::PUBREL => Some(Packet::PubRel(ok)),
        frame::PUBCOMP => Some(Packet::PubComp(ok)),
        _ => None,
    }
}

/// Decodes the complete frame of `total` bytes at the front of `src` with
/// rmqtt-codec.
///
/// The frame is copied out first. The strings of a decoded control packet are slices
/// of the buffer they came from, and they live as long as the connection (its client
/// id, user name, subscription filters): decoded in place they would keep the whole
/// read buffer (4 KiB and more) of every idle connection allocated. Control packets
/// are rare next to PUBLISH, which stays zero-copy.
fn delegate(
    version: ProtocolVersion,
    src: &mut BytesMut,
    total: usize,
    packet_type: u8,
) -> Result<Packet, DecodeError> {
    let mut frame = BytesMut::from(&src[..total]);
    src.advance(total);
    let decoded = match version {
        ProtocolVersion::V311 => rmqtt_codec::v3::Codec::new(0)
            .decode(&mut frame)
            .map(|o| o.map(|(p, _)| p.into())),
        ProtocolVersion::V5 => rmqtt_codec::v5::Codec::new(0, 0)
            .decode(&mut frame)
            .map(|o| o.map(|(p, _)| p.into())),
    };
    match decoded {
        Ok(Some(p)) => crate::strings::check(&p).map(|()| p),
        Ok(None) => Err(crate::wire::truncated("MQTT-2.1.4")),
        Err(e) => Err(map_decode_error(e, packet_type)),
    }
}

/// rmqtt-codec's errors, made precise with the packet type they came from.
fn map_decode_error(e: RError, packet_type: u8) -> DecodeError {
    let malformed = |clause, detail| DecodeError::Malformed { clause, detail };
    match e {
        RError::Utf8Error => DecodeError::InvalidUtf8,
        RError::InvalidLength => malformed("MQTT-2.1.4", "a field runs past the end of the packet"),
        RError::InvalidProtocol => DecodeError::Protocol {
            clause: "MQTT-3.1.2-1",
            detail: "protocol name is not \"MQTT\"",
        },
        RError::UnsupportedProtocolLevel => {
            malformed("MQTT-3.1.2-2", "protocol level does not match")
        }
        RError::ConnectReservedFlagSet => malformed("MQTT-3.1.2-3", "CONNECT reserved flag is set"),
        RError::InvalidConnectFlags => malformed(
            "MQTT-3.1.2-11",
            "Will QoS or Will Retain set without the Will Flag",
        ),
        RError::ConnAckReservedFlagSet => {
            malformed("MQTT-3.2.2-1", "CONNACK reserved flags are set")
        }
        RError::InvalidClientId => DecodeError::Protocol {
            clause: "MQTT-3.1.3-8",
            detail: "empty Client Identifier without Clean Session (MQTT 3.1.1)",
        },
        RError::PacketIdRequired => DecodeError::Protocol {
            clause: "MQTT-2.2.1-3",
            detail: "packet identifier 0",
        },
        RError::MaxSizeExceeded { size, max } => DecodeError::PacketTooLarge {
            size: size.into(),
            max,
        },
        RError::InvalidTopicFilter if packet_type == frame::UNSUBSCRIBE => DecodeError::Protocol {
            clause: "MQTT-3.10.3-2",
            detail: "UNSUBSCRIBE without a topic filter, or with an empty one",
        },
        RError::InvalidTopicFilter => DecodeError::Protocol {
            clause: "MQTT-3.8.3-2",
            detail: "SUBSCRIBE without a topic filter, or with an empty one",
        },
        RError::InvalidTopicName => DecodeError::Protocol {
            clause: "MQTT-4.7.3-1",
            detail: "empty topic name",
        },
        RError::UnsupportedPacketType => malformed("MQTT-2.1.3-1", "invalid packet type or flags"),
        RError::MalformedPacket | RError::Io(_) => malformed_detail(packet_type),
    }
}

/// rmqtt-codec's catch-all "malformed packet": an unknown, duplicated or
/// out-of-range property, a reason code not allowed in this packet, or a field value
/// outside its range (QoS 3, Retain Handling 3, boolean other than 0/1, ...).
fn malformed_detail(packet_type: u8) -> DecodeError {
    let (clause, detail) = match packet_type {
        frame::CONNECT => ("MQTT-3.1.2", "bad CONNECT property or field value"),
        frame::CONNACK => (
            "MQTT-3.2.2",
            "bad CONNACK reason code, property or field value",
        ),
        frame::SUBSCRIBE => (
            "MQTT-3.8.3",
            "bad SUBSCRIBE property or subscription options",
        ),
        frame::DISCONNECT => ("MQTT-3.14.2", "bad DISCONNECT reason code or property"),
        frame::AUTH => ("MQTT-3.15.2", "bad AUTH reason code or property"),
        _ => ("MQTT-2.2.2", "bad reason code or property"),
    };
    DecodeError::Malformed { clause, detail }
}

fn map_encode_error(e: rmqtt_codec::error::EncodeError) -> EncodeError {
    use rmqtt_codec::error::EncodeError as E;
    EncodeError::Invalid(match e {
        E::OverMaxPacketSize { .. } => "packet larger than the maximum packet size",
        E::InvalidLength => "string or binary field longer than 65535 bytes",
        E::PacketIdRequired => "packet identifier required",
        E::MalformedPacket | E::UnsupportedVersion | E::Io(_) => "packet cannot be encoded",
    })
}

/// rmqtt-codec's 3.1.1 encoder panics on a Remaining Length over the protocol limit
/// instead of returning an error, so check the packets that can get that big.
fn check_v311_size(packet: &Packet) -> Result<(), EncodeError> {
    let len = match packet {
        Packet::Subscribe(s) => s.filters.iter().map(|(f, _)| 3 + f.len()).sum::<usize>(),
        Packet::Unsubscribe(u) => u.filters.iter().map(|f| 2 + f.len()).sum(),
        Packet::SubAck(a) => a.reason_codes.len(),
        _ => 0,
    };
    if len + 2 > MAX_VARINT as usize {
        return Err(EncodeError::Invalid(
            "packet larger than the maximum packet size",
        ));
    }
    Ok(())
}

/// MQTT 5 packets whose reason code is 0 and that have no properties: written in the
/// short form the spec allows (sections 3.4.2.1, 3.14.2.1, 3.15.2.1).
fn encode_short_form(packet: &Packet, dst: &mut BytesMut) -> bool {
    let short = match packet {
        Packet::PubAck(a) => short_ack(0x40, a),
        Packet::PubRec(a) => short_ack(0x50, a),
        Packet::PubRel(a) => short_ack(0x62, a),
        Packet::PubComp(a) => short_ack(0x70, a),
        Packet::Disconnect(d)
            if d.session_expiry_interval.is_none()
                && d.server_reference.is_none()
                && empty_reason(d.reason_code, &d.reason_string, &d.user_properties) =>
        {
            Some((0xE0, None))
        }
        Packet::Auth(a)
            if a.authentication_method.is_none()
                && a.authentication_data.is_none()
                && empty_reason(a.reason_code, &a.reason_string, &a.user_properties) =>
        {
            Some((0xF0, None))
        }
        _ => None,
    };
    match short {
        Some((first_byte, Some(packet_id))) => {
            dst.put_slice(&[first_byte, 2]);
            dst.put_u16(packet_id);
            true
        }
        Some((first_byte, None)) => {
            dst.put_slice(&[first_byte, 0]);
            true
        }
        None => false,
    }
}

fn short_ack(first_byte: u8, a: &crate::PubResponse) -> Option<(u8, Option<u16>)> {
    let short =
        a.packet_id != 0 && empty_reason(a.reason_code, &a.reason_string, &a.user_properties);
    short.then_some((first_byte, Some(a.packet_id)))
}

fn empty_reason(
    rc: ReasonCode,
    reason: &Option<bytestring::ByteString>,
    user: &crate::UserProperties,
) -> bool {
    rc == ReasonCode::SUCCESS && reason.is_none() && user.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control packet's strings live as long as the connection (client id, user
    /// name, filters): they must not be slices of the read buffer, or every idle
    /// connection keeps its 4 KiB read buffer.
    #[test]
    fn control_packets_do_not_keep_the_read_buffer() {
        let mut src = BytesMut::with_capacity(4096);
        let start = src.as_ptr() as usize;
        let inside = |p: *const u8| (start..start + 4096).contains(&(p as usize));
        // 3.1.1 CONNECT, clean session, client id "abc", user name "user", a password.
        src.extend_from_slice(b"\x10\x19\x00\x04MQTT\x04\xc2\x00\x3c\x00\x03abc\x00\x04user");
        src.extend_from_slice(&[0x00, 0x02]); // a password of length 2
        src.extend_from_slice(b"pw");
        // SUBSCRIBE packet id 1, filter "a/b" at QoS 1.
        src.extend_from_slice(b"\x82\x08\x00\x01\x00\x03a/b\x01");
        let mut codec = Codec::new_server(4096);
        let Some(Packet::Connect(c)) = codec.decode(&mut src).expect("decodes") else {
            panic!("a CONNECT");
        };
        assert_eq!(
            (&c.client_id[..], c.username.as_deref()),
            ("abc", Some("user"))
        );
        assert!(
            !inside(c.client_id.as_ptr()),
            "client id is a slice of the buffer"
        );
        assert!(!inside(c.username.as_deref().unwrap_or_default().as_ptr()));
        let Some(Packet::Subscribe(sub)) = codec.decode(&mut src).expect("decodes") else {
            panic!("a SUBSCRIBE");
        };
        assert_eq!(&sub.filters[0].0[..], "a/b");
        assert!(
            !inside(sub.filters[0].0.as_ptr()),
            "filter is a slice of the buffer"
        );
    }

    #[test]
    fn missing_counts_the_rest_of_a_started_packet() {
        let codec = Codec::with_version(ProtocolVersion::V5, 1024);
        assert_eq!(codec.missing(&[]), None);
        assert_eq!(codec.missing(&[0x30]), None);
        // PUBLISH, remaining length 200 (two-byte varint), 3 bytes of it here.
        assert_eq!(
            codec.missing(&[0x30, 0xC8, 0x01, 0, 1, b't']),
            Some(200 - 3)
        );
        assert_eq!(codec.missing(&[0xC0, 0x00]), None, "a whole PINGREQ");
        // Over the limit: the decoder refuses it; nothing to reserve.
        assert_eq!(codec.missing(&[0x30, 0xFF, 0x7F]), None);
    }

    /// The two-byte acknowledgements read in place decode exactly as the general decoder
    /// reads them, in both versions.
    #[test]
    fn short_acks_match_the_general_decoder() {
        for version in [ProtocolVersion::V311, ProtocolVersion::V5] {
            for (packet_type, flags) in [
                (frame::PUBACK, 0),
                (frame::PUBREC, 0),
                (frame::PUBREL, 2),
                (frame::PUBCOMP, 0),
            ] {
                for pid in [1u16, 0x00ff, 0x0100, 0xbeef, u16::MAX] {
                    let [high, low] = pid.to_be_bytes();
                    let bytes = [packet_type << 4 | flags, 2, high, low];
                    let fast = read_short_ack(packet_type, &bytes[2..]).expect("a short ack");
                    let general = delegate(
                        version,
                        &mut BytesMut::from(&bytes[..]),
                        bytes.len(),
                        packet_type,
                    )
                    .expect("decodes");
                    assert_eq!(fast, general, "{version:?} type {packet_type} id {pid}");
                }
            }
        }
        assert!(
            read_short_ack(frame::PUBACK, &[0, 1, 0]).is_none(),
            "a reason code goes the general way"
        );
        assert!(read_short_ack(frame::UNSUBACK, &[0, 1]).is_none());
    }
}
