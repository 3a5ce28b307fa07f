//! Framing and the checks made before a packet body is handed to rmqtt-codec.
//!
//! We parse the fixed header ourselves rather than letting rmqtt-codec do it because
//! its decoder consumes the header before the body has arrived (so `Ok(None)` would
//! not leave the buffer intact), compares the limit against the Remaining Length
//! rather than the whole packet, accepts non-minimal length encodings and ignores
//! most fixed-header flags. The body checks here cover what rmqtt-codec reports
//! only as a generic "malformed packet" or does not check at all, so each error can
//! carry its own spec clause. Clause numbers are those of MQTT 5.0.

use crate::wire::peek_varint;
use crate::{DecodeError, ProtocolVersion};

pub(crate) const CONNECT: u8 = 1;
pub(crate) const CONNACK: u8 = 2;
pub(crate) const PUBLISH: u8 = 3;
pub(crate) const PUBACK: u8 = 4;
pub(crate) const PUBREC: u8 = 5;
pub(crate) const PUBREL: u8 = 6;
pub(crate) const PUBCOMP: u8 = 7;
pub(crate) const SUBSCRIBE: u8 = 8;
pub(crate) const UNSUBACK: u8 = 11;
pub(crate) const UNSUBSCRIBE: u8 = 10;
pub(crate) const PINGREQ: u8 = 12;
pub(crate) const PINGRESP: u8 = 13;
pub(crate) const DISCONNECT: u8 = 14;
pub(crate) const AUTH: u8 = 15;

#[derive(Debug, Clone, Copy)]
pub(crate) struct FixedHeader {
    pub first_byte: u8,
    pub header_len: usize,
    pub remaining: usize,
}

impl FixedHeader {
    pub fn packet_type(&self) -> u8 {
        self.first_byte >> 4
    }

    pub fn total(&self) -> usize {
        self.header_len + self.remaining
    }
}

/// Parses the fixed header and enforces the size limit as soon as the Remaining
/// Length is known. `max == 0` means no limit.
pub(crate) fn parse_header(src: &[u8], max: u32) -> Result<Option<FixedHeader>, DecodeError> {
    let Some(&first_byte) = src.first() else {
        return Ok(None);
    };
    let Some((remaining, used)) = peek_varint(&src[1..])? else {
        return Ok(None);
    };
    let header = FixedHeader {
        first_byte,
        header_len: 1 + used,
        remaining: remaining as usize,
    };
    let size = header.total() as u64;
    if max != 0 && size > u64::from(max) {
        return Err(DecodeError::PacketTooLarge { size, max });
    }
    Ok(Some(header))
}

/// Reserved flag bits of the fixed header [MQTT-2.1.3-1], QoS 3 [MQTT-3.3.1-4].
pub(crate) fn check_flags(first_byte: u8, version: ProtocolVersion) -> Result<(), DecodeError> {
    let (packet_type, flags) = (first_byte >> 4, first_byte & 0x0F);
    let expected = match packet_type {
        0 => {
            return Err(DecodeError::Malformed {
                clause: "MQTT-2.1.2",
                detail: "reserved packet type 0",
            });
        }
        AUTH if version == ProtocolVersion::V311 => {
            return Err(DecodeError::Malformed {
                clause: "MQTT-2.1.2",
                detail: "packet type 15 (AUTH) is reserved in MQTT 3.1.1",
            });
        }
        PUBLISH if flags & 0b0110 == 0b0110 => {
            return Err(DecodeError::Malformed {
                clause: "MQTT-3.3.1-4",
                detail: "PUBLISH with QoS 3",
            });
        }
        PUBLISH => flags,
        PUBREL | SUBSCRIBE | UNSUBSCRIBE => 0b0010,
        _ => 0,
    };
    if flags != expected {
        return Err(DecodeError::Malformed {
            clause: "MQTT-2.1.3-1",
            detail: "reserved flags in the fixed header have the wrong value",
        });
    }
    Ok(())
}

/// What the CONNECT variable header says, read ahead of rmqtt-codec.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectHeader {
    pub version: ProtocolVersion,
    /// Offset of the Connect Flags byte within the body.
    pub flags_offset: usize,
    pub flags: u8,
    pub empty_client_id: bool,
}

const fn connect_malformed(clause: &'static str, detail: &'static str) -> DecodeError {
    DecodeError::Malformed { clause, detail }
}

/// Reads protocol name and level from a (possibly partial) CONNECT body.
/// `Ok(None)` means more bytes are needed.
pub(crate) fn peek_connect_version(body: &[u8]) -> Result<Option<ProtocolVersion>, DecodeError> {
    if body.len() < 2 {
        return Ok(None);
    }
    let name_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let Some(name_and_level) = body.get(2..2 + name_len + 1) else {
        return if name_len == 4 || name_len == 6 {
            Ok(None)
        } else {
            Err(DecodeError::Protocol {
                clause: "MQTT-3.1.2-1",
                detail: "protocol name is not \"MQTT\"",
            })
        };
    };
    let (name, level) = (&name_and_level[..name_len], name_and_level[name_len]);
    match (name, level) {
        (b"MQTT", 4) | (b"MQIsdp", 3) => Ok(Some(ProtocolVersion::V311)),
        (b"MQTT", 5) => Ok(Some(ProtocolVersion::V5)),
        (b"MQTT" | b"MQIsdp", level) => Err(DecodeError::UnsupportedProtocolVersion(level)),
        _ => Err(DecodeError::Protocol {
            clause: "MQTT-3.1.2-1",
            detail: "protocol name is not \"MQTT\"",
        }),
    }
}

/// Checks a complete CONNECT body up to the Client Identifier length.
pub(crate) fn check_connect(body: &[u8]) -> Result<ConnectHeader, DecodeError> {
    let truncated = || crate::wire::truncated("MQTT-3.1.2");
    let version = peek_connect_version(body)?.ok_or_else(truncated)?;
    let flags_offset = 2 + usize::from(u16::from_be_bytes([body[0], body[1]])) + 1;
    let flags = *body.get(flags_offset).ok_or_else(truncated)?;
    if flags & 0b1 != 0 {
        return Err(connect_malformed(
            "MQTT-3.1.2-3",
            "CONNECT reserved flag is set",
        ));
    }
    let will = flags & 0b100 != 0;
    let will_qos = (flags >> 3) & 0b11;
    if !will && (will_qos != 0 || flags & 0b10_0000 != 0) {
        return Err(connect_malformed(
            "MQTT-3.1.2-11",
            "Will QoS or Will Retain set without the Will Flag",
        ));
    }
    if will_qos == 3 {
        return Err(connect_malformed("MQTT-3.1.2-12", "Will QoS 3"));
    }
    if version == ProtocolVersion::V311 && flags & 0b1000_0000 == 0 && flags & 0b0100_0000 != 0 {
        return Err(connect_malformed(
            "MQTT-3.1.2-22",
            "password without a user name (MQTT 3.1.1)",
        ));
    }
    let mut pos = flags_offset + 3;
    if version == ProtocolVersion::V5 {
        let rest = body.get(pos..).ok_or_else(truncated)?;
        let (props_len, used) = peek_varint(rest)?.ok_or_else(truncated)?;
        pos += used + props_len as usize;
    }
    let id_len = body.get(pos..pos + 2).ok_or_else(truncated)?;
    Ok(ConnectHeader {
        version,
        flags_offset,
        flags,
        empty_client_id: id_len == [0, 0],
    })
}

/// Body checks for the packets rmqtt-codec decodes.
pub(crate) fn check_body(
    packet_type: u8,
    body: &[u8],
    version: ProtocolVersion,
) -> Result<(), DecodeError> {
    if (PUBACK..=UNSUBACK).contains(&packet_type) && body.starts_with(&[0, 0]) {
        return Err(DecodeError::Protocol {
            clause: "MQTT-2.2.1-3",
            detail: "packet identifier 0",
        });
    }
    let v311 = version == ProtocolVersion::V311;
    match packet_type {
        PINGREQ | PINGRESP if !body.is_empty() => Err(DecodeError::Malformed {
            clause: "MQTT-3.12.1",
            detail: "PINGREQ/PINGRESP with a body",
        }),
        DISCONNECT if v311 && !body.is_empty() => Err(DecodeError::Malformed {
            clause: "MQTT-3.14.1",
            detail: "3.1.1 DISCONNECT with a body",
        }),
        CONNACK if v311 && body.len() != 2 => Err(DecodeError::Malformed {
            clause: "MQTT-3.2.1",
            detail: "3.1.1 CONNACK must be 2 bytes",
        }),
        // Return codes 6-255 are reserved (3.1.1 table 3.1): nothing to map them to
        // that would encode back to the same byte.
        CONNACK if v311 && body[1] > 5 => Err(DecodeError::Malformed {
            clause: "MQTT-3.2.2.3",
            detail: "3.1.1 CONNACK return code is reserved",
        }),
        SUBSCRIBE if v311 => check_v311_subscribe_options(body),
        _ => Ok(()),
    }
}

/// rmqtt-codec masks off the upper six bits of a 3.1.1 subscription's QoS byte.
fn check_v311_subscribe_options(body: &[u8]) -> Result<(), DecodeError> {
    let mut pos = 2;
    while pos + 2 <= body.len() {
        pos += 2 + usize::from(u16::from_be_bytes([body[pos], body[pos + 1]]));
        match body.get(pos) {
            Some(&opts) if opts & 0b1111_1100 != 0 || opts == 3 => {
                return Err(DecodeError::Malformed {
                    clause: "MQTT-3.8.3-4",
                    detail: "subscription options: reserved bits set or QoS 3",
                });
            }
            Some(_) => pos += 1,
            None => break,
        }
    }
    Ok(())
}
