//! Messages as the data directory keeps them (retained messages and persistent
//! sessions' queues): an MQTT 5 PUBLISH encoded by our own codec, so every property
//! survives as the wire has it, with the Message Expiry Interval set to what was left
//! when it was written. Whoever reads it back says how long statehub was down, and
//! that time counts against the expiry.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use statehub_broker::codec::{Codec, Packet, ProtocolVersion, PublishRef, QoS};
use statehub_broker::Message;

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

/// The message in `bytes` (exactly one PUBLISH), `None` if it expired during `down`.
pub(crate) fn read_message(bytes: &[u8], down: Duration) -> Result<Option<Message>, String> {
    let mut packet = BytesMut::from(bytes);
    let mut publish = match Codec::with_version(ProtocolVersion::V5, u32::MAX).decode(&mut packet) {
        Ok(Some(Packet::Publish(p))) if packet.is_empty() => p,
        Ok(_) => return Err("not one PUBLISH".into()),
        Err(e) => return Err(e.to_string()),
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
    Ok(Some(Message::from_publish(publish, None, Instant::now())))
}
