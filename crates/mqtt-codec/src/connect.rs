//! The whole CONNECT body, walked before rmqtt-codec decodes it, for what that
//! decoder lets through or reports as the wrong error:
//! * bytes after the payload's last field (it ignores them): a Malformed Packet;
//! * a property included twice, Receive Maximum 0, Maximum Packet Size 0, a Request
//!   Problem / Response Information other than 0 or 1, Authentication Data without an
//!   Authentication Method: Protocol Errors (spec 3.1.2.11 and 3.1.3.2), which it
//!   reports as Malformed Packet.
//!
//! Field contents (UTF-8, flag combinations, lengths inside the variable header) are
//! checked by `frame::check_connect` before and by rmqtt-codec after.

use crate::frame::ConnectHeader;
use crate::property_id as id;
use crate::wire::peek_varint;
use crate::{DecodeError, ProtocolVersion};

const CLAUSE: &str = "MQTT-3.1.3";

const fn protocol(clause: &'static str, detail: &'static str) -> DecodeError {
    DecodeError::Protocol { clause, detail }
}

/// A cursor over a complete CONNECT body.
struct Cursor<'a> {
    body: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.body.len());
        let end = end.ok_or(crate::wire::truncated(CLAUSE))?;
        let bytes = &self.body[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A length-prefixed string or binary field, skipped.
    fn field(&mut self) -> Result<(), DecodeError> {
        let len = self.u16()?;
        self.take(usize::from(len)).map(drop)
    }

    /// A property section: its length, then a cursor over it.
    fn properties(&mut self) -> Result<Cursor<'a>, DecodeError> {
        let rest = &self.body[self.pos.min(self.body.len())..];
        let (len, used) = peek_varint(rest)?.ok_or(crate::wire::truncated(CLAUSE))?;
        self.pos += used;
        let body = self.take(len as usize)?;
        Ok(Cursor { body, pos: 0 })
    }

    fn done(&self) -> bool {
        self.pos >= self.body.len()
    }
}

/// Property identifiers seen once already (every CONNECT and will property but User
/// Property may appear at most once).
#[derive(Default)]
struct Seen(u64);

impl Seen {
    /// Identifiers from 64 up name no CONNECT property; they are refused as unknown.
    fn first(&mut self, id: u8) -> Result<(), DecodeError> {
        let Some(bit) = 1u64.checked_shl(u32::from(id)) else {
            return Ok(());
        };
        if self.0 & bit != 0 {
            return Err(protocol("MQTT-2.2.2", "CONNECT property included twice"));
        }
        self.0 |= bit;
        Ok(())
    }
}

/// Walks a complete CONNECT body (`header` read by `frame::check_connect`).
pub(crate) fn check_layout(body: &[u8], header: &ConnectHeader) -> Result<(), DecodeError> {
    let v5 = header.version == ProtocolVersion::V5;
    // Protocol name and level, flags, keep alive.
    let mut c = Cursor {
        body,
        pos: header.flags_offset + 3,
    };
    if v5 {
        connect_properties(c.properties()?)?;
    }
    c.field()?; // Client Identifier
    if header.flags & 0b100 != 0 {
        if v5 {
            will_properties(c.properties()?)?;
        }
        c.field()?; // Will Topic
        c.field()?; // Will Payload
    }
    if header.flags & 0b1000_0000 != 0 {
        c.field()?; // User Name
    }
    if header.flags & 0b0100_0000 != 0 {
        c.field()?; // Password
    }
    if !c.done() {
        return Err(DecodeError::Malformed {
            clause: CLAUSE,
            detail: "bytes after the last field of the CONNECT payload",
        });
    }
    Ok(())
}

fn connect_properties(mut p: Cursor<'_>) -> Result<(), DecodeError> {
    let mut seen = Seen::default();
    let mut auth_method = false;
    let mut auth_data = false;
    while !p.done() {
        let id = p.u8()?;
        if id != id::USER_PROPERTY {
            seen.first(id)?;
        }
        match id {
            id::SESSION_EXPIRY => p.u32().map(drop)?,
            id::RECEIVE_MAXIMUM => {
                if p.u16()? == 0 {
                    return Err(protocol("MQTT-3.1.2.11.3", "Receive Maximum 0"));
                }
            }
            id::MAXIMUM_PACKET_SIZE => {
                if p.u32()? == 0 {
                    return Err(protocol("MQTT-3.1.2.11.4", "Maximum Packet Size 0"));
                }
            }
            id::TOPIC_ALIAS_MAXIMUM => p.u16().map(drop)?,
            id::REQUEST_RESPONSE | id::REQUEST_PROBLEM => {
                if p.u8()? > 1 {
                    return Err(protocol(
                        "MQTT-3.1.2.11",
                        "Request Response / Problem Information other than 0 or 1",
                    ));
                }
            }
            id::USER_PROPERTY => {
                p.field()?;
                p.field()?;
            }
            id::AUTH_METHOD => {
                auth_method = true;
                p.field()?;
            }
            id::AUTH_DATA => {
                auth_data = true;
                p.field()?;
            }
            _ => return Err(unknown()),
        }
    }
    if auth_data && !auth_method {
        return Err(protocol(
            "MQTT-3.1.2.11.10",
            "Authentication Data without an Authentication Method",
        ));
    }
    Ok(())
}

fn will_properties(mut p: Cursor<'_>) -> Result<(), DecodeError> {
    let mut seen = Seen::default();
    while !p.done() {
        let id = p.u8()?;
        if id != id::USER_PROPERTY {
            seen.first(id)?;
        }
        match id {
            id::WILL_DELAY | id::MESSAGE_EXPIRY => p.u32().map(drop)?,
            id::PAYLOAD_FORMAT => p.u8().map(drop)?,
            id::CONTENT_TYPE | id::RESPONSE_TOPIC | id::CORRELATION_DATA => p.field()?,
            id::USER_PROPERTY => {
                p.field()?;
                p.field()?;
            }
            _ => return Err(unknown()),
        }
    }
    Ok(())
}

fn unknown() -> DecodeError {
    DecodeError::Malformed {
        clause: "MQTT-2.2.2",
        detail: "property identifier not valid in CONNECT",
    }
}
