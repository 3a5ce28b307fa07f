//! The records of the session table: keys and value encodings (see the parent
//! module for what each record means). Values start with a format byte and the
//! wall-clock time they were written; everything is big-endian and length-prefixed,
//! and a decoder refuses short, long or unknown records rather than guess.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, BytesMut};
use statehub_broker::codec::{ByteString, QoS, SubscriptionOptions};
use statehub_broker::{Delivery, SharedVia, StoredSession, Subscription};

use crate::stored::{self, down_since, wall_ms};

pub(super) const FORMAT: u8 = 1;
pub(super) const SESSION: u8 = b'S';
pub(super) const MESSAGE: u8 = b'M';
pub(super) const QOS2: u8 = b'Q';

pub(super) fn session_key(incarnation: u64) -> [u8; 9] {
    let mut k = [SESSION; 9];
    k[1..].copy_from_slice(&incarnation.to_be_bytes());
    k
}

pub(super) fn message_key(incarnation: u64, seq: u64) -> [u8; 17] {
    let mut k = [MESSAGE; 17];
    k[1..9].copy_from_slice(&incarnation.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn receipt_key(incarnation: u64, packet_id: u16) -> [u8; 11] {
    let mut k = [QOS2; 11];
    k[1..9].copy_from_slice(&incarnation.to_be_bytes());
    k[9..].copy_from_slice(&packet_id.to_be_bytes());
    k
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u16(u16::try_from(s.len()).unwrap_or(u16::MAX));
    out.put_slice(&s.as_bytes()[..s.len().min(usize::from(u16::MAX))]);
}

fn get_str(buf: &mut &[u8]) -> Result<String, String> {
    if buf.remaining() < 2 {
        return Err("short string".into());
    }
    let len = usize::from(buf.get_u16());
    if buf.remaining() < len {
        return Err("short string".into());
    }
    let s = std::str::from_utf8(&buf[..len])
        .map_err(|e| e.to_string())?
        .to_owned();
    buf.advance(len);
    Ok(s)
}

fn need(buf: &[u8], n: usize) -> Result<(), String> {
    if buf.len() < n {
        return Err("record too short".into());
    }
    Ok(())
}

fn options_byte(o: SubscriptionOptions) -> u8 {
    o.qos as u8
        | u8::from(o.no_local) << 2
        | u8::from(o.retain_as_published) << 3
        | (o.retain_handling & 3) << 4
}

fn options_from(b: u8) -> Result<SubscriptionOptions, String> {
    Ok(SubscriptionOptions {
        qos: QoS::from_u8(b & 3).ok_or("bad QoS")?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: (b >> 4) & 3,
    })
}

/// The value of a session record.
pub(super) fn encode_session(
    client_id: &str,
    expiry_interval: u32,
    disconnected: bool,
    subscriptions: &[(&ByteString, Subscription)],
) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(32 + client_id.len() + 32 * subscriptions.len());
    v.put_u8(FORMAT);
    v.put_u64(wall_ms());
    v.put_u8(u8::from(disconnected));
    v.put_u32(expiry_interval);
    put_str(&mut v, client_id);
    v.put_u32(u32::try_from(subscriptions.len()).unwrap_or(u32::MAX));
    for (filter, sub) in subscriptions {
        put_str(&mut v, filter);
        v.put_u8(options_byte(sub.options));
        v.put_u32(sub.identifier.unwrap_or(0));
    }
    v.to_vec()
}

/// A session record, with the time it was written; `None` if it expired by `now_ms`.
pub(super) fn decode_session(
    value: &[u8],
    incarnation: u64,
    now_ms: u64,
) -> Result<Option<(u64, StoredSession)>, String> {
    let mut buf = value;
    need(buf, 14)?;
    if buf.get_u8() != FORMAT {
        return Err("unknown record format".into());
    }
    let written_ms = buf.get_u64();
    let disconnected = buf.get_u8() != 0;
    let expiry_interval = buf.get_u32();
    let client_id = get_str(&mut buf)?;
    need(buf, 4)?;
    let n = buf.get_u32();
    let mut subscriptions = Vec::new();
    for _ in 0..n {
        let filter = get_str(&mut buf)?;
        need(buf, 5)?;
        let options = options_from(buf.get_u8())?;
        let id = buf.get_u32();
        subscriptions.push((
            ByteString::from(filter),
            Subscription {
                options,
                identifier: (id != 0).then_some(id),
            },
        ));
    }
    if !buf.is_empty() {
        return Err("trailing bytes".into());
    }
    let expires_in = match expiry_interval {
        u32::MAX => None,
        secs if disconnected => {
            let left =
                Duration::from_secs(u64::from(secs)).saturating_sub(down_since(written_ms, now_ms));
            if left.is_zero() {
                return Ok(None);
            }
            Some(left)
        }
        secs => Some(Duration::from_secs(u64::from(secs))),
    };
    let session = StoredSession {
        client_id: client_id.into(),
        incarnation,
        expiry_interval,
        expires_in,
        subscriptions,
        messages: Vec::new(),
        incoming_qos2: Vec::new(),
    };
    Ok(Some((written_ms, session)))
}

pub(super) fn encode_message(d: &Delivery, released: bool, now: Instant) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(64 + d.msg.payload.len() + d.msg.topic.len());
    v.put_u8(FORMAT);
    v.put_u64(wall_ms());
    v.put_u8(d.qos as u8);
    v.put_u8(u8::from(d.retain));
    v.put_u8(u8::from(released));
    v.put_u16(u16::try_from(d.subscription_ids.len()).unwrap_or(u16::MAX));
    for id in d.subscription_ids.iter().take(usize::from(u16::MAX)) {
        v.put_u32(*id);
    }
    match &d.shared {
        Some(via) => {
            v.put_u8(1);
            put_str(&mut v, &via.filter);
            put_str(&mut v, &via.group);
        }
        None => v.put_u8(0),
    }
    stored::put_message(&mut v, &d.msg, now);
    v.to_vec()
}

/// A queued message and whether its PUBREL was sent; `None` if it expired by `now_ms`.
pub(super) fn decode_message(
    value: &[u8],
    now_ms: u64,
) -> Result<Option<(Delivery, bool)>, String> {
    let mut buf = value;
    need(buf, 14)?;
    if buf.get_u8() != FORMAT {
        return Err("unknown record format".into());
    }
    let written_ms = buf.get_u64();
    let qos = QoS::from_u8(buf.get_u8()).ok_or("bad QoS")?;
    let retain = buf.get_u8() != 0;
    let released = buf.get_u8() != 0;
    let n = usize::from(buf.get_u16());
    need(buf, 4 * n + 1)?;
    let subscription_ids = (0..n).map(|_| buf.get_u32()).collect();
    let shared = match buf.get_u8() {
        0 => None,
        _ => Some(SharedVia {
            filter: get_str(&mut buf)?.into(),
            group: get_str(&mut buf)?.into(),
        }),
    };
    let Some(msg) = stored::read_message(buf, down_since(written_ms, now_ms))? else {
        return Ok(None);
    };
    let delivery = Delivery {
        msg: Arc::new(msg),
        qos,
        retain,
        subscription_ids,
        shared,
        seq: 0,
        dup: true,
        gate: None,
    };
    Ok(Some((delivery, released)))
}
