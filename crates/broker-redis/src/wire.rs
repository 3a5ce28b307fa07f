//! How a message and a set of shared-group picks are written into Redis.
//!
//! A message is its MQTT 5 PUBLISH packet (the broker's own codec writes and reads it,
//! so every property survives the trip) behind a short header: a format byte, the
//! publisher's client id (for No Local on the other nodes) and the expiry as Unix
//! milliseconds (an absolute time, so a retained message read much later still expires
//! when it should).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use statehub_broker::codec::{ByteString, Codec, Packet, ProtocolVersion, PublishRef};
use statehub_broker::{Message, SharedPick, SharedPicks};

const FORMAT: u8 = 1;

/// A stored entry cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("message entry malformed: {0}")]
    Malformed(&'static str),
    #[error("message entry's PUBLISH: {0}")]
    Decode(#[from] statehub_broker::codec::DecodeError),
    #[error("message cannot be written: {0}")]
    Encode(#[from] statehub_broker::codec::EncodeError),
}

/// Now, as both clocks: the broker's (for `Message::expires_at`) and the wall clock
/// (for what other nodes read).
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub instant: Instant,
    pub unix_ms: u64,
}

impl Now {
    pub fn at(instant: Instant) -> Self {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Self { instant, unix_ms }
    }
}

/// Writes `msg`.
pub fn encode(msg: &Message, now: Now) -> Result<Vec<u8>, WireError> {
    let publisher = msg.publisher.as_deref().unwrap_or("");
    let len = u16::try_from(publisher.len()).map_err(|_| WireError::Malformed("client id"))?;
    let expires = msg.expires_at.map_or(0, |t| {
        let left = t.saturating_duration_since(now.instant);
        let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        now.unix_ms.saturating_add(left).max(1)
    });
    let mut out =
        BytesMut::with_capacity(16 + publisher.len() + msg.payload.len() + msg.topic.len());
    out.put_u8(FORMAT);
    out.put_u8(u8::from(msg.publisher.is_some()));
    out.put_u16(len);
    out.put_slice(publisher.as_bytes());
    out.put_u64(expires);
    // Written from the shared message as it is, without a copy of its properties.
    let publish = PublishRef {
        dup: false,
        qos: msg.qos,
        retain: msg.retain,
        topic: &msg.topic,
        packet_id: (msg.qos != statehub_broker::codec::QoS::AtMostOnce).then_some(1),
        payload: &msg.payload,
        properties: &msg.properties,
        message_expiry_interval: msg.properties.message_expiry_interval,
        topic_alias: msg.properties.topic_alias,
        subscription_identifiers: &msg.properties.subscription_identifiers,
    };
    Codec::with_version(ProtocolVersion::V5, 0).encode_publish(&publish, &mut out)?;
    Ok(out.to_vec())
}

/// Reads a message written by [`encode`]; `None` if it expired meanwhile.
pub fn decode(bytes: &[u8], now: Now) -> Result<Option<Message>, WireError> {
    let malformed = WireError::Malformed;
    let (&format, rest) = bytes.split_first().ok_or(malformed("empty"))?;
    if format != FORMAT {
        return Err(malformed("unknown format"));
    }
    let (&has_publisher, rest) = rest.split_first().ok_or(malformed("header"))?;
    let (len, rest) = rest.split_at_checked(2).ok_or(malformed("header"))?;
    let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
    let (publisher, rest) = rest.split_at_checked(len).ok_or(malformed("client id"))?;
    let publisher = std::str::from_utf8(publisher).map_err(|_| malformed("client id"))?;
    let (expires, rest) = rest.split_at_checked(8).ok_or(malformed("expiry"))?;
    let mut exp = [0u8; 8];
    exp.copy_from_slice(expires);
    let expires = u64::from_be_bytes(exp);
    let expires_at = match expires {
        0 => None,
        at if at <= now.unix_ms => return Ok(None),
        at => now
            .instant
            .checked_add(Duration::from_millis(at - now.unix_ms)),
    };
    let mut buf = BytesMut::from(rest);
    let packet = Codec::with_version(ProtocolVersion::V5, 0).decode(&mut buf)?;
    let Some(Packet::Publish(publish)) = packet else {
        return Err(malformed("not a PUBLISH"));
    };
    let publisher = (has_publisher == 1).then(|| ByteString::from(publisher));
    let mut msg = Message::from_publish(publish, publisher, now.instant);
    msg.expires_at = expires_at;
    Ok(Some(msg))
}

/// Writes picks as `filter NUL group NUL node NUL` triples.
pub fn encode_picks(picks: &SharedPicks) -> Vec<u8> {
    let mut out = Vec::new();
    for p in picks.picks() {
        for part in [&p.filter, &p.group, &p.node] {
            out.extend_from_slice(part.as_bytes());
            out.push(0);
        }
    }
    out
}

/// Reads picks written by [`encode_picks`], marking those for node `here`.
pub fn decode_picks(bytes: &[u8], here: &str) -> Result<SharedPicks, WireError> {
    let parts: Vec<&str> = bytes
        .split(|&b| b == 0)
        .map(std::str::from_utf8)
        .collect::<Result<_, _>>()
        .map_err(|_| WireError::Malformed("shared picks"))?;
    // The last part is what follows the final NUL: empty.
    let whole = parts.len().saturating_sub(1);
    if !whole.is_multiple_of(3) {
        return Err(WireError::Malformed("shared picks"));
    }
    let picks = parts[..whole]
        .chunks_exact(3)
        .map(|c| SharedPick {
            filter: Arc::from(c[0]),
            group: Arc::from(c[1]),
            node: Arc::from(c[2]),
            here: c[2] == here,
        })
        .collect();
    Ok(SharedPicks::new(picks))
}

/// Writes a node's shared groups as `filter NUL group NUL` pairs.
pub fn encode_groups<'a>(groups: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (filter, group) in groups {
        out.extend_from_slice(filter.as_bytes());
        out.push(0);
        out.extend_from_slice(group.as_bytes());
        out.push(0);
    }
    out
}

/// Reads groups written by [`encode_groups`].
pub fn decode_groups(bytes: &[u8]) -> Vec<(String, String)> {
    let parts: Vec<String> = bytes
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let whole = parts.len().saturating_sub(1) / 2 * 2;
    parts[..whole]
        .chunks_exact(2)
        .map(|c| (c[0].clone(), c[1].clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use statehub_broker::codec::{Publish, PublishProperties, QoS};

    fn bytes(b: &[u8]) -> Bytes {
        Bytes::copy_from_slice(b)
    }

    fn message(expiry: Option<u32>) -> Message {
        let publish = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "a/b".into(),
            packet_id: Some(7),
            payload: bytes(b"hello"),
            properties: PublishProperties {
                message_expiry_interval: expiry,
                user_properties: vec![("k".into(), "v".into())],
                ..PublishProperties::default()
            },
        };
        Message::from_publish(publish, Some("pub".into()), Instant::now())
    }

    /// The shared message is written without a copy, byte for byte as the whole
    /// PUBLISH would be (what another node's reader decodes).
    #[test]
    fn the_message_is_written_as_its_whole_publish() {
        let now = Now::at(Instant::now());
        let msg = message(Some(30));
        let encoded = encode(&msg, now).unwrap();
        let whole = Publish {
            dup: false,
            qos: msg.qos,
            retain: msg.retain,
            topic: msg.topic.clone(),
            packet_id: Some(1),
            payload: msg.payload.clone(),
            properties: msg.properties.clone(),
        };
        let mut expected = BytesMut::new();
        Codec::with_version(ProtocolVersion::V5, 0)
            .encode(&Packet::Publish(whole), &mut expected)
            .unwrap();
        assert!(
            encoded.ends_with(&expected),
            "the PUBLISH closes the record"
        );
    }

    #[test]
    fn a_message_survives_the_trip_with_its_publisher_and_expiry() {
        let now = Now::at(Instant::now());
        let msg = message(Some(60));
        let back = decode(&encode(&msg, now).unwrap(), now).unwrap().unwrap();
        assert_eq!(back.topic, msg.topic);
        assert_eq!(back.payload, msg.payload);
        assert_eq!(back.qos, QoS::AtLeastOnce);
        assert!(back.retain);
        assert_eq!(back.publisher.as_deref(), Some("pub"));
        assert_eq!(
            back.properties.user_properties,
            msg.properties.user_properties
        );
        let left = back.expires_at.unwrap().duration_since(now.instant);
        assert!(left > Duration::from_secs(59) && left <= Duration::from_secs(60));
    }

    #[test]
    fn an_expired_message_is_not_read_back() {
        let now = Now::at(Instant::now());
        let bytes = encode(&message(Some(1)), now).unwrap();
        let later = Now {
            unix_ms: now.unix_ms + 2_000,
            ..now
        };
        assert!(decode(&bytes, later).unwrap().is_none());
    }

    #[test]
    fn picks_and_groups_survive_the_trip() {
        let picks = SharedPicks::new(vec![SharedPick {
            filter: "t/#".into(),
            group: "g".into(),
            node: "b".into(),
            here: false,
        }]);
        let back = decode_picks(&encode_picks(&picks), "b").unwrap();
        assert!(back.here("t/#", "g"));
        assert!(!decode_picks(&encode_picks(&picks), "a")
            .unwrap()
            .here("t/#", "g"));
        let groups = encode_groups([("t/#", "g"), ("x", "h")].into_iter());
        assert_eq!(
            decode_groups(&groups),
            vec![("t/#".into(), "g".into()), ("x".into(), "h".into())]
        );
    }
}
