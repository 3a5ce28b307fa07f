//! How a persistent session's parts are written into its Redis hash: the session's own
//! record (`_m`: expiry, whether disconnected and since when, subscriptions), each
//! queued message's per-subscriber fields (`m:{seq}`), and a message body (the `wire`
//! encoding, with its expiry as an absolute time). Big-endian, length-prefixed, a
//! format byte first; a decoder refuses what it cannot read rather than guess.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, BytesMut};
use statehub_broker::codec::ByteString;
use statehub_broker::records::{self, RecordFormatError, RecordReader};
use statehub_broker::{Message, QueuedRef, StoredSession, Subscription};

use crate::wire::{self, Now, WireError};

/// The first layout of these records, with `u32` string lengths, is refused rather
/// than misread.
const FORMAT: u8 = 2;

/// Now on the wall clock, in Unix milliseconds.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The session record (`_m`).
pub(crate) fn encode_session(
    expiry_interval: u32,
    disconnected: bool,
    subscriptions: &[(&ByteString, Subscription)],
) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(24 + 32 * subscriptions.len());
    v.put_u8(FORMAT);
    v.put_u64(wall_ms());
    v.put_u8(u8::from(disconnected));
    v.put_u32(expiry_interval);
    records::put_subscriptions(&mut v, subscriptions);
    v.to_vec()
}

/// A message's per-subscriber record (`m:{seq}`).
pub(crate) fn encode_message(m: QueuedRef<'_>, released: bool) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(16 + 4 * m.subscription_ids.len());
    v.put_u8(FORMAT);
    records::put_message_fields(&mut v, m, released);
    v.to_vec()
}

/// A record cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("stored session record malformed: {0}")]
    Malformed(&'static str),
    #[error("stored session record malformed: {0}")]
    Format(#[from] RecordFormatError),
    #[error(transparent)]
    Body(#[from] WireError),
}

/// Reads past the format byte, refusing any other format.
fn reader(value: &[u8]) -> Result<RecordReader<'_>, RecordError> {
    let mut r = RecordReader::new(value);
    match r.u8()? {
        FORMAT => Ok(r),
        _ => Err(RecordError::Malformed("unknown format")),
    }
}

/// A session's hash as read: its fields, and the bodies its messages refer to.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub fields: HashMap<Vec<u8>, Vec<u8>>,
    pub bodies: HashMap<Vec<u8>, Vec<u8>>,
}

/// A loaded session, and the body id of each of its messages (by sequence number).
#[derive(Debug)]
pub(crate) struct Decoded {
    pub session: StoredSession,
    pub body_ids: Vec<(Arc<Message>, Vec<u8>)>,
}

/// Reads the session `incarnation` of `client_id` back; `None` if it expired. A
/// message whose body expired, or is missing, is left out.
pub(crate) fn decode(
    client_id: &str,
    incarnation: u64,
    loaded: &Loaded,
    now: Now,
) -> Result<Option<Decoded>, RecordError> {
    let meta = loaded
        .fields
        .get(&b"_m"[..])
        .ok_or(RecordError::Malformed("no session record"))?;
    let Some(mut session) = decode_session(meta, now)? else {
        return Ok(None);
    };
    session.client_id = client_id.into();
    session.incarnation = incarnation;
    let mut bodies: HashMap<&[u8], Arc<Message>> = HashMap::new();
    let mut body_ids = Vec::new();
    for (field, value) in &loaded.fields {
        if let Some(pid) = field.strip_prefix(b"q:") {
            let pid = std::str::from_utf8(pid).ok().and_then(|p| p.parse().ok());
            session.incoming_qos2.extend(pid.filter(|&p: &u16| p != 0));
            continue;
        }
        let Some(seq) = field.strip_prefix(b"m:") else {
            continue;
        };
        let seq: u64 = std::str::from_utf8(seq)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(RecordError::Malformed("message field"))?;
        let mut key = b"b:".to_vec();
        key.extend_from_slice(seq.to_string().as_bytes());
        let Some(bid) = loaded.fields.get(&key) else {
            continue;
        };
        let msg = match bodies.get(&bid[..]) {
            Some(msg) => msg.clone(),
            None => {
                let Some(data) = loaded.bodies.get(bid) else {
                    continue;
                };
                let Some(msg) = wire::decode(data, now)? else {
                    continue;
                };
                let msg = Arc::new(msg);
                bodies.insert(bid, msg.clone());
                msg
            }
        };
        let fields = reader(value)?.message_fields()?;
        body_ids.push((msg.clone(), bid.clone()));
        session.messages.push(fields.into_stored(seq, msg));
    }
    session.messages.sort_unstable_by_key(|m| m.seq);
    Ok(Some(Decoded { session, body_ids }))
}

/// The session record (`_m`) as a session without messages or identity; `None` if it
/// expired by `now`.
fn decode_session(meta: &[u8], now: Now) -> Result<Option<StoredSession>, RecordError> {
    let mut r = reader(meta)?;
    let written_ms = r.u64()?;
    let disconnected = r.u8()? != 0;
    let expiry_interval = r.u32()?;
    let subscriptions = r.subscriptions()?;
    let expires_in = match expiry_interval {
        u32::MAX => None,
        secs if disconnected => {
            let down = Duration::from_millis(now.unix_ms.saturating_sub(written_ms));
            let left = Duration::from_secs(u64::from(secs)).saturating_sub(down);
            if left.is_zero() {
                return Ok(None);
            }
            Some(left)
        }
        secs => Some(Duration::from_secs(u64::from(secs))),
    };
    Ok(Some(StoredSession {
        client_id: ByteString::default(),
        incarnation: 0,
        expiry_interval,
        expires_in,
        subscriptions,
        messages: Vec::new(),
        incoming_qos2: Vec::new(),
    }))
}
