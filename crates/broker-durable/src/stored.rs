//! What the records of both tables share: the message as the data directory keeps it
//! (an MQTT 5 PUBLISH encoded by our own codec, so every property survives as the wire
//! has it, with the Message Expiry Interval set to what was left when it was written;
//! whoever reads it back says how long statehub was down, and that time counts against
//! the expiry), the wall clock records carry, and a reader that refuses short, long or
//! unknown records rather than guess.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, BytesMut};
use statehub_broker::codec::{Codec, DecodeError, Packet, ProtocolVersion, PublishRef, QoS};
use statehub_broker::records::RecordFormatError;
use statehub_broker::Message;

/// A stored record that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The record ends inside a field.
    #[error("record ends inside a field")]
    Truncated,
    /// A format this build does not know (written by a newer statehub?).
    #[error("unknown record format {0}")]
    UnknownFormat(u8),
    /// A key of no known kind or length.
    #[error("unknown key")]
    UnknownKey,
    /// Bytes after the end of the record.
    #[error("trailing bytes after the record")]
    Trailing,
    /// A QoS byte other than 0, 1 or 2.
    #[error("invalid QoS {0}")]
    QoS(u8),
    /// A string that is not UTF-8.
    #[error("a string is not UTF-8")]
    Utf8,
    /// The stored PUBLISH does not decode.
    #[error("stored PUBLISH: {0}")]
    Publish(#[from] DecodeError),
    /// The stored bytes are not exactly one PUBLISH.
    #[error("not one PUBLISH")]
    NotOnePublish,
    /// A message record refers to a body that is not there.
    #[error("refers to message body {0}, which is not stored")]
    MissingBody(u64),
}

impl From<RecordFormatError> for RecordError {
    fn from(e: RecordFormatError) -> Self {
        match e {
            RecordFormatError::Truncated => RecordError::Truncated,
            RecordFormatError::QoS(b) => RecordError::QoS(b),
            RecordFormatError::Utf8 => RecordError::Utf8,
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Time between a record's writing and now; zero if the clock went back.
pub(crate) fn down_since(written_ms: u64, now_ms: u64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(written_ms))
}

/// Appends `msg` as one PUBLISH, written from the shared message as it is (only its
/// Message Expiry Interval is given apart), without a copy of its properties.
pub(crate) fn put_message(out: &mut BytesMut, msg: &Message, now: Instant) {
    let publish = PublishRef {
        dup: false,
        qos: msg.qos,
        retain: msg.retain,
        topic: &msg.topic,
        packet_id: (msg.qos != QoS::AtMostOnce).then_some(1),
        payload: &msg.payload,
        properties: &msg.properties,
        message_expiry_interval: msg.remaining_expiry(now),
        topic_alias: msg.properties.topic_alias,
        subscription_identifiers: &msg.properties.subscription_identifiers,
    };
    // Encoding a PUBLISH we built from a valid one cannot fail; if it ever did, the
    // record would fail to decode at start-up and say so, never load something else.
    let _ = Codec::with_version(ProtocolVersion::V5, u32::MAX).encode_publish(&publish, out);
}

/// The message in `bytes` (exactly one PUBLISH), received at `now`; `None` if it
/// expired during `down`.
pub(crate) fn read_message(
    bytes: &[u8],
    down: Duration,
    now: Instant,
) -> Result<Option<Message>, RecordError> {
    let mut packet = BytesMut::from(bytes);
    let mut publish =
        match Codec::with_version(ProtocolVersion::V5, u32::MAX).decode(&mut packet)? {
            Some(Packet::Publish(p)) if packet.is_empty() => p,
            _ => return Err(RecordError::NotOnePublish),
        };
    if let Some(secs) = publish.properties.message_expiry_interval {
        let left = Duration::from_secs(u64::from(secs)).saturating_sub(down);
        if left.is_zero() {
            return Ok(None);
        }
        let rounded_up = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        publish.properties.message_expiry_interval =
            Some(u32::try_from(rounded_up).unwrap_or(u32::MAX));
    }
    Ok(Some(Message::from_publish(publish, None, now)))
}

/// Appends a string with its u16 length (cut at 65,535 bytes, which no MQTT string
/// exceeds).
pub(crate) fn put_str(out: &mut BytesMut, s: &str) {
    let len = s.len().min(usize::from(u16::MAX));
    out.put_u16(len as u16);
    out.put_slice(&s.as_bytes()[..len]);
}

/// A cursor over a record that fails, rather than panics, on a short one.
#[derive(Debug)]
pub(crate) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    fn need(&self, n: usize) -> Result<(), RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Truncated);
        }
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8, RecordError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, RecordError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, RecordError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }

    pub fn u64(&mut self) -> Result<u64, RecordError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }

    /// A string written by [`put_str`].
    pub fn str(&mut self) -> Result<&'a str, RecordError> {
        let len = usize::from(self.u16()?);
        self.need(len)?;
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        std::str::from_utf8(s).map_err(|_| RecordError::Utf8)
    }

    /// What is left of the record.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }

    /// Fails unless the whole record was read.
    pub fn end(&self) -> Result<(), RecordError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(RecordError::Trailing)
        }
    }
}
