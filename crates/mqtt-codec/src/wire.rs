//! Byte-level primitives for the parts of the wire format this crate handles
//! itself (framing, PUBLISH, the short forms of acknowledgements, CONNECT header
//! checks). Readers work on a `Bytes` cursor so strings and binary fields are
//! zero-copy slices of the received frame.

use bytes::{Buf, Bytes};
use bytestring::ByteString;

use crate::DecodeError;

/// Largest value a Variable Byte Integer can carry (MQTT 5 section 1.5.5).
pub(crate) const MAX_VARINT: u32 = 268_435_455;

pub(crate) const fn truncated(clause: &'static str) -> DecodeError {
    DecodeError::Malformed {
        clause,
        detail: "a field runs past the end of the packet",
    }
}

/// Parses a Variable Byte Integer from the start of `src`.
/// `Ok(None)`: more bytes needed; `Ok(Some((value, bytes_used)))` otherwise.
pub(crate) fn peek_varint(src: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value: u32 = 0;
    for (i, &byte) in src.iter().enumerate().take(4) {
        value |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(DecodeError::Malformed {
                    clause: "MQTT-1.5.5-1",
                    detail: "variable byte integer not in its shortest form",
                });
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if src.len() >= 4 {
        return Err(DecodeError::Malformed {
            clause: "MQTT-1.5.5-1",
            detail: "variable byte integer longer than 4 bytes",
        });
    }
    Ok(None)
}

/// Reads a Variable Byte Integer inside a complete packet.
pub(crate) fn read_varint(src: &mut Bytes, clause: &'static str) -> Result<u32, DecodeError> {
    match peek_varint(src)? {
        Some((value, used)) => {
            src.advance(used);
            Ok(value)
        }
        None => Err(truncated(clause)),
    }
}

pub(crate) fn read_u8(src: &mut Bytes, clause: &'static str) -> Result<u8, DecodeError> {
    if src.is_empty() {
        return Err(truncated(clause));
    }
    Ok(src.get_u8())
}

pub(crate) fn read_u16(src: &mut Bytes, clause: &'static str) -> Result<u16, DecodeError> {
    if src.len() < 2 {
        return Err(truncated(clause));
    }
    Ok(src.get_u16())
}

pub(crate) fn read_u32(src: &mut Bytes, clause: &'static str) -> Result<u32, DecodeError> {
    if src.len() < 4 {
        return Err(truncated(clause));
    }
    Ok(src.get_u32())
}

/// Binary Data: two-byte length then that many bytes.
pub(crate) fn read_binary(src: &mut Bytes, clause: &'static str) -> Result<Bytes, DecodeError> {
    let len = usize::from(read_u16(src, clause)?);
    if src.len() < len {
        return Err(truncated(clause));
    }
    Ok(src.split_to(len))
}

/// UTF-8 Encoded String: well-formed UTF-8 [MQTT-1.5.4-1] without U+0000 [MQTT-1.5.4-2].
pub(crate) fn read_string(
    src: &mut Bytes,
    clause: &'static str,
) -> Result<ByteString, DecodeError> {
    let raw = read_binary(src, clause)?;
    if has_nul(&raw) {
        return Err(DecodeError::InvalidUtf8);
    }
    ByteString::try_from(raw).map_err(|_| DecodeError::InvalidUtf8)
}

/// Whether `bytes` holds a zero byte. Without an early exit the loop has no branch per
/// byte: for the short strings of a PUBLISH (topic, property names and values) fewer
/// instructions than a search that stops at the first match.
fn has_nul(bytes: &[u8]) -> bool {
    bytes.iter().fold(false, |found, &b| found | (b == 0))
}

/// Bytes a Variable Byte Integer takes on the wire.
pub(crate) fn varint_len(value: usize) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Rejects a string or binary field too long for its two-byte length prefix.
pub(crate) fn check_len(data: &[u8]) -> Result<(), crate::EncodeError> {
    if data.len() > usize::from(u16::MAX) {
        return Err(crate::EncodeError::Invalid(
            "string or binary field longer than 65535 bytes",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_with_u0000_anywhere_is_refused() {
        for len in [1usize, 7, 16, 31, 33, 100] {
            for at in [0, len / 2, len - 1] {
                let mut text = vec![b'a'; len];
                assert!(!has_nul(&text));
                text[at] = 0;
                let mut wire = Vec::from((len as u16).to_be_bytes());
                wire.extend_from_slice(&text);
                let mut src = Bytes::from(wire);
                assert!(matches!(
                    read_string(&mut src, "test"),
                    Err(DecodeError::InvalidUtf8)
                ));
            }
        }
    }
}
