//! The stored form of an entry and of the clock's high-water mark.
//!
//! Hand-written because it is ours and tiny: a format byte (so a later format can be
//! told apart), a flags byte, the version, the optional fencing token and expiry, then
//! the value as the rest of the record (no length, no copy of a length check). Integers
//! are big-endian; an HLC is its wall clock, counter and node id (length-prefixed UTF-8).
//! Decoding never panics: a record that does not parse is an error naming what is wrong.

use statehub_state_store::{Entry, Hlc, Value};

/// The only format so far.
const FORMAT: u8 = 1;
const HAS_FENCING_TOKEN: u8 = 0b01;
const HAS_EXPIRY: u8 = 0b10;

/// A stored record that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record ends inside a field.
    #[error("record ends inside a field")]
    Truncated,
    /// A format this build does not know (written by a newer statehub?).
    #[error("unknown record format {0}")]
    UnknownFormat(u8),
    /// Flag bits this format does not define.
    #[error("unknown record flags {0:#04x}")]
    UnknownFlags(u8),
    /// A node id that is not UTF-8.
    #[error("node id is not UTF-8")]
    NodeId,
    /// Bytes after a record that has no trailing value.
    #[error("trailing bytes after the record")]
    Trailing,
}

fn put_hlc(hlc: &Hlc, out: &mut Vec<u8>) {
    out.extend_from_slice(&hlc.wall_ms.to_be_bytes());
    out.extend_from_slice(&hlc.counter.to_be_bytes());
    let node = hlc.node_id.as_bytes();
    out.extend_from_slice(&(node.len() as u32).to_be_bytes());
    out.extend_from_slice(node);
}

fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], RecordError> {
    if input.len() < n {
        return Err(RecordError::Truncated);
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

fn take_u64(input: &mut &[u8]) -> Result<u64, RecordError> {
    let bytes = take(input, 8)?;
    Ok(u64::from_be_bytes(
        bytes.try_into().map_err(|_| RecordError::Truncated)?,
    ))
}

fn take_hlc(input: &mut &[u8]) -> Result<Hlc, RecordError> {
    let wall_ms = take_u64(input)?;
    let counter = take_u64(input)?;
    let len = take(input, 4)?;
    let len = u32::from_be_bytes(len.try_into().map_err(|_| RecordError::Truncated)?);
    let node = take(
        input,
        usize::try_from(len).map_err(|_| RecordError::Truncated)?,
    )?;
    let node_id = std::str::from_utf8(node).map_err(|_| RecordError::NodeId)?;
    Ok(Hlc::new(wall_ms, counter, node_id))
}

fn take_header(input: &mut &[u8]) -> Result<u8, RecordError> {
    let head = take(input, 2)?;
    if head[0] != FORMAT {
        return Err(RecordError::UnknownFormat(head[0]));
    }
    Ok(head[1])
}

/// The stored form of `entry`.
#[cfg(test)]
pub(crate) fn encode_entry(entry: &Entry) -> Vec<u8> {
    let mut out = Vec::with_capacity(48 + entry.value.len());
    encode_entry_into(entry, &mut out);
    out
}

/// Appends the stored form of `entry` to `out` (a batch's buffer: no copy of its own).
pub(crate) fn encode_entry_into(entry: &Entry, out: &mut Vec<u8>) {
    let mut flags = 0;
    if entry.fencing_token.is_some() {
        flags |= HAS_FENCING_TOKEN;
    }
    if entry.expires_at_ms.is_some() {
        flags |= HAS_EXPIRY;
    }
    out.extend_from_slice(&[FORMAT, flags]);
    put_hlc(&entry.version, out);
    if let Some(token) = &entry.fencing_token {
        put_hlc(token, out);
    }
    if let Some(at) = entry.expires_at_ms {
        out.extend_from_slice(&at.to_be_bytes());
    }
    out.extend_from_slice(&entry.value);
}

/// Parses a stored entry; the value is copied out, so the record can be dropped.
pub(crate) fn decode_entry(mut input: &[u8]) -> Result<Entry, RecordError> {
    let flags = take_header(&mut input)?;
    if flags & !(HAS_FENCING_TOKEN | HAS_EXPIRY) != 0 {
        return Err(RecordError::UnknownFlags(flags));
    }
    let version = take_hlc(&mut input)?;
    let fencing_token = if flags & HAS_FENCING_TOKEN != 0 {
        Some(Box::new(take_hlc(&mut input)?))
    } else {
        None
    };
    let expires_at_ms = if flags & HAS_EXPIRY != 0 {
        Some(take_u64(&mut input)?)
    } else {
        None
    };
    Ok(Entry {
        value: Value::new(input),
        version,
        fencing_token,
        expires_at_ms,
    })
}

/// The stored form of a clock value.
pub(crate) fn encode_hlc(hlc: &Hlc) -> Vec<u8> {
    let mut out = vec![FORMAT, 0];
    put_hlc(hlc, &mut out);
    out
}

/// Parses a stored clock value.
pub(crate) fn decode_hlc(mut input: &[u8]) -> Result<Hlc, RecordError> {
    let flags = take_header(&mut input)?;
    if flags != 0 {
        return Err(RecordError::UnknownFlags(flags));
    }
    let hlc = take_hlc(&mut input)?;
    if !input.is_empty() {
        return Err(RecordError::Trailing);
    }
    Ok(hlc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hlc() -> impl Strategy<Value = Hlc> {
        (any::<u64>(), any::<u64>(), "[^:]{0,20}").prop_map(|(w, c, n)| Hlc::new(w, c, n))
    }

    proptest! {
        #[test]
        fn entries_round_trip(
            value in proptest::collection::vec(any::<u8>(), 0..200),
            version in hlc(),
            fencing_token in proptest::option::of(hlc()),
            expires_at_ms in proptest::option::of(any::<u64>()),
        ) {
            let entry = Entry { value: Value::new(&value), version, fencing_token: fencing_token.map(Box::new), expires_at_ms };
            prop_assert_eq!(decode_entry(&encode_entry(&entry)), Ok(entry));
        }

        #[test]
        fn clocks_round_trip(clock in hlc()) {
            prop_assert_eq!(decode_hlc(&encode_hlc(&clock)), Ok(clock));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = decode_entry(&bytes);
            let _ = decode_hlc(&bytes);
        }
    }

    #[test]
    fn damaged_records_say_what_is_wrong() {
        let entry = Entry {
            value: Value::new(b"v"),
            version: Hlc::new(1, 2, "n"),
            fencing_token: None,
            expires_at_ms: Some(9),
        };
        let good = encode_entry(&entry);
        assert_eq!(decode_entry(&good[..10]), Err(RecordError::Truncated));
        assert_eq!(decode_entry(&[2, 0]), Err(RecordError::UnknownFormat(2)));
        assert_eq!(
            decode_entry(&[FORMAT, 0x80]),
            Err(RecordError::UnknownFlags(0x80))
        );
        let mut bad_node = encode_hlc(&Hlc::new(1, 1, "x"));
        *bad_node.last_mut().unwrap() = 0xff;
        assert_eq!(decode_hlc(&bad_node), Err(RecordError::NodeId));
        let mut trailing = encode_hlc(&Hlc::new(1, 1, "x"));
        trailing.push(0);
        assert_eq!(decode_hlc(&trailing), Err(RecordError::Trailing));
    }
}
