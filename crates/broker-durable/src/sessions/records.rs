//! The records of the session table: keys and value encodings (see the parent
//! module for what each record means). Values start with a format byte, and those
//! whose age matters (sessions, bodies) with the wall-clock time they were written;
//! everything is big-endian and length-prefixed, and a decoder refuses short, long or
//! unknown records rather than guess. A message record of the first format holds its
//! message itself; it is still read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use statehub_broker::codec::{ByteString, QoS};
use statehub_broker::records::{self, MessageFields, RecordReader};
use statehub_broker::{Message, QueuedRef, SharedVia, StoredSession, Subscription};

use crate::stored::{self, down_since, put_str, wall_ms, Reader, RecordError};

pub(super) const FORMAT: u8 = 1;
/// A message record that refers to a body record instead of holding the message.
pub(super) const FORMAT_REF: u8 = 2;
pub(super) const SESSION: u8 = b'S';
pub(super) const MESSAGE: u8 = b'M';
pub(super) const QOS2: u8 = b'Q';
pub(super) const BODY: u8 = b'B';

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

pub(super) fn body_key(id: u64) -> [u8; 9] {
    let mut k = [BODY; 9];
    k[1..].copy_from_slice(&id.to_be_bytes());
    k
}

pub(super) fn receipt_key(incarnation: u64, packet_id: u16) -> [u8; 11] {
    let mut k = [QOS2; 11];
    k[1..9].copy_from_slice(&incarnation.to_be_bytes());
    k[9..].copy_from_slice(&packet_id.to_be_bytes());
    k
}

/// One subscriber's copy of a message, owned (see [`QueuedRef`]).
#[derive(Debug, Clone)]
pub(super) struct Queued {
    pub msg: Arc<Message>,
    pub qos: QoS,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    pub shared: Option<SharedVia>,
}

impl Queued {
    pub fn of(m: QueuedRef<'_>) -> Queued {
        Queued {
            msg: m.msg.clone(),
            qos: m.qos,
            retain: m.retain,
            subscription_ids: m.subscription_ids.to_vec(),
            shared: m.shared.cloned(),
        }
    }

    pub fn as_ref(&self) -> QueuedRef<'_> {
        QueuedRef {
            msg: &self.msg,
            qos: self.qos,
            retain: self.retain,
            subscription_ids: &self.subscription_ids,
            shared: self.shared.as_ref(),
        }
    }
}

fn format(r: &mut Reader<'_>) -> Result<(), RecordError> {
    match r.u8()? {
        FORMAT => Ok(()),
        other => Err(RecordError::UnknownFormat(other)),
    }
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
    records::put_subscriptions(&mut v, subscriptions);
    v.to_vec()
}

/// A session record, with the time it was written; `None` if it expired by `now_ms`.
pub(super) fn decode_session(
    value: &[u8],
    incarnation: u64,
    now_ms: u64,
) -> Result<Option<(u64, StoredSession)>, RecordError> {
    let mut r = Reader(value);
    format(&mut r)?;
    let written_ms = r.u64()?;
    let disconnected = r.u8()? != 0;
    let expiry_interval = r.u32()?;
    let client_id = r.str()?;
    let mut shared = RecordReader::new(r.rest());
    let subscriptions = shared.subscriptions()?;
    r = Reader(shared.rest());
    r.end()?;
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

/// Appends a message record's fields: its per-subscriber copy and whether its PUBREL
/// was sent, then the id of the body it refers to.
pub(super) fn encode_message(m: QueuedRef<'_>, released: bool, body: u64) -> Vec<u8> {
    let mut v = BytesMut::with_capacity(32 + 4 * m.subscription_ids.len());
    v.put_u8(FORMAT_REF);
    records::put_message_fields(&mut v, m, released);
    v.put_u64(body);
    v.to_vec()
}

/// Where a message record's message is.
#[derive(Debug)]
pub(super) enum Body {
    /// In the body record with this id.
    Ref(u64),
    /// In the record itself (the first format); `None` if it expired by the load.
    Inline(Option<Arc<Message>>),
}

/// A message record: the per-subscriber copy without its message, whether its PUBREL
/// was sent, and where the message is.
#[derive(Debug)]
pub(super) struct MessageRecord {
    pub fields: MessageFields,
    pub body: Body,
}

pub(super) fn decode_message(
    value: &[u8],
    now_ms: u64,
    now: Instant,
) -> Result<MessageRecord, RecordError> {
    let mut r = Reader(value);
    let format = r.u8()?;
    let written_ms = match format {
        FORMAT_REF => None,
        FORMAT => Some(r.u64()?),
        other => return Err(RecordError::UnknownFormat(other)),
    };
    let mut shared = RecordReader::new(r.rest());
    let fields = shared.message_fields()?;
    r = Reader(shared.rest());
    let body = match written_ms {
        None => {
            let id = r.u64()?;
            r.end()?;
            Body::Ref(id)
        }
        Some(written_ms) => {
            let down = down_since(written_ms, now_ms);
            Body::Inline(stored::read_message(r.rest(), down, now)?.map(Arc::new))
        }
    };
    Ok(MessageRecord { fields, body })
}

/// A body record: the time it was written and the message, its expiry as it was then.
pub(super) fn encode_body(msg: &Message, now: Instant) -> BytesMut {
    let mut v = BytesMut::with_capacity(16 + msg.payload.len() + msg.topic.len() + 64);
    v.put_u8(FORMAT);
    v.put_u64(wall_ms());
    stored::put_message(&mut v, msg, now);
    v
}

/// The message of a body record, received at `now`; `None` if it expired by `now_ms`.
pub(super) fn decode_body(
    value: &[u8],
    now_ms: u64,
    now: Instant,
) -> Result<Option<Message>, RecordError> {
    let mut r = Reader(value);
    format(&mut r)?;
    let written_ms = r.u64()?;
    stored::read_message(r.rest(), down_since(written_ms, now_ms), now)
}
