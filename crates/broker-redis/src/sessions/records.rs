//! How a persistent session's parts are written into its Redis hash: the session's own
//! record (`_m`: expiry, whether disconnected and since when, subscriptions), each
//! queued message's per-subscriber fields (`m:{seq}`), and a message body (the `wire`
//! encoding, with its expiry as an absolute time). Big-endian, length-prefixed, a
//! format byte first; a decoder refuses what it cannot read rather than guess.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, BytesMut};
use statehub_broker::codec::{ByteString, QoS, SubscriptionOptions};
use statehub_broker::{Message, QueuedRef, SharedVia, StoredMessage, StoredSession, Subscription};

use crate::wire::{self, Now, WireError};

const FORMAT: u8 = 1;

/// Now on the wall clock, in Unix milliseconds.
pub(crate) fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn put_str(v: &mut BytesMut, s: &str) {
    v.put_u32(u32::try_from(s.len()).unwrap_or(u32::MAX));
    v.put_slice(s.as_bytes());
}

fn options_byte(o: SubscriptionOptions) -> u8 {
    o.qos as u8
        | u8::from(o.no_local) << 2
        | u8::from(o.retain_as_published) << 3
        | (o.retain_handling & 3) << 4
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
    v.put_u32(u32::try_from(subscriptions.len()).unwrap_or(u32::MAX));
    for (filter, sub) in subscriptions {
        put_str(&mut v, filter);
        v.put_u8(options_byte(sub.options));
        v.put_u32(sub.identifier.unwrap_or(0));
    }
    v.to_vec()
}

/// A message's per-subscriber record (`m:{seq}`).
pub(crate) fn encode_message(m: QueuedRef<'_>, released: bool) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(16 + 4 * m.subscription_ids.len());
    v.put_u8(FORMAT);
    v.put_u8(m.qos as u8);
    v.put_u8(u8::from(m.retain));
    v.put_u8(u8::from(released));
    let ids = &m.subscription_ids[..m.subscription_ids.len().min(usize::from(u16::MAX))];
    v.put_u16(ids.len() as u16);
    for id in ids {
        v.put_u32(*id);
    }
    match m.shared {
        Some(via) => {
            v.put_u8(1);
            put_str(&mut v, &via.filter);
            put_str(&mut v, &via.group);
        }
        None => v.put_u8(0),
    }
    v.to_vec()
}

/// A record cannot be read back.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("stored session record malformed: {0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Body(#[from] WireError),
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn need(&self, n: usize) -> Result<(), RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Malformed("short"));
        }
        Ok(())
    }
    fn u8(&mut self) -> Result<u8, RecordError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }
    fn u16(&mut self) -> Result<u16, RecordError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }
    fn u32(&mut self) -> Result<u32, RecordError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }
    fn u64(&mut self) -> Result<u64, RecordError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }
    fn str(&mut self) -> Result<&str, RecordError> {
        let n = self.u32()? as usize;
        self.need(n)?;
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        std::str::from_utf8(s).map_err(|_| RecordError::Malformed("not UTF-8"))
    }
    fn format(&mut self) -> Result<(), RecordError> {
        match self.u8()? {
            FORMAT => Ok(()),
            _ => Err(RecordError::Malformed("unknown format")),
        }
    }
    fn qos(&mut self) -> Result<QoS, RecordError> {
        QoS::from_u8(self.u8()?).ok_or(RecordError::Malformed("QoS"))
    }
}

fn options_from(b: u8) -> Result<SubscriptionOptions, RecordError> {
    Ok(SubscriptionOptions {
        qos: QoS::from_u8(b & 3).ok_or(RecordError::Malformed("QoS"))?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: (b >> 4) & 3,
    })
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
        let record = decode_message(value)?;
        body_ids.push((msg.clone(), bid.clone()));
        session.messages.push(StoredMessage {
            seq,
            msg,
            qos: record.qos,
            retain: record.retain,
            subscription_ids: record.subscription_ids,
            shared: record.shared,
            released: record.released,
        });
    }
    session.messages.sort_unstable_by_key(|m| m.seq);
    Ok(Some(Decoded { session, body_ids }))
}

/// A message record's per-subscriber fields.
struct MessageRecord {
    qos: QoS,
    retain: bool,
    released: bool,
    subscription_ids: Vec<u32>,
    shared: Option<SharedVia>,
}

fn decode_message(value: &[u8]) -> Result<MessageRecord, RecordError> {
    let mut r = Reader(value);
    r.format()?;
    let qos = r.qos()?;
    let retain = r.u8()? != 0;
    let released = r.u8()? != 0;
    let n = r.u16()?;
    let subscription_ids = (0..n).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let shared = match r.u8()? {
        0 => None,
        _ => Some(SharedVia {
            filter: r.str()?.into(),
            group: r.str()?.into(),
        }),
    };
    Ok(MessageRecord {
        qos,
        retain,
        released,
        subscription_ids,
        shared,
    })
}

/// The session record (`_m`) as a session without messages or identity; `None` if it
/// expired by `now`.
fn decode_session(meta: &[u8], now: Now) -> Result<Option<StoredSession>, RecordError> {
    let mut r = Reader(meta);
    r.format()?;
    let written_ms = r.u64()?;
    let disconnected = r.u8()? != 0;
    let expiry_interval = r.u32()?;
    let n = r.u32()?;
    let mut subscriptions = Vec::new();
    for _ in 0..n {
        let filter = ByteString::from(r.str()?);
        let options = options_from(r.u8()?)?;
        let id = r.u32()?;
        let identifier = (id != 0).then_some(id);
        subscriptions.push((
            filter,
            Subscription {
                options,
                identifier,
            },
        ));
    }
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
