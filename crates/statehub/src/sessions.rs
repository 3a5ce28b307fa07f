//! Persistent MQTT sessions on the data directory: the broker's [`SessionStore`] hook
//! implemented on `statehub-storage`, in the same store (and the same group commit)
//! as the state store and the retained messages.
//!
//! One table, `mqtt-sessions`, with three kinds of record, all keyed by the session's
//! incarnation (a random id per session, so a Clean Start's new session never shares
//! a key with the one it replaced, and client ids of any length fit):
//!
//! * `S` + incarnation: client id, expiry interval, whether it was disconnected and
//!   when (its expiry clock), and its subscriptions;
//! * `M` + incarnation + sequence number: a queued or in-flight message with its
//!   per-subscriber fields (QoS, RETAIN, subscription ids, shared group) and whether
//!   its PUBREL was sent; its packet id follows from the sequence number;
//! * `Q` + incarnation + packet id: a QoS 2 PUBLISH received from the client, PUBREC
//!   sent, PUBREL not yet received.
//!
//! At start-up sessions whose expiry passed while statehub was down are deleted, as are
//! messages that expired and records of no live session. A session that was connected
//! when statehub stopped starts its expiry clock at start-up.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, BytesMut};
use parking_lot::Mutex;
use statehub_broker::codec::{ByteString, QoS, SubscriptionOptions};
use statehub_broker::{
    BoxFuture, Delivery, SessionChange, SessionStore, SessionStoreError, SharedVia, StoredMessage, StoredSession,
    Subscription,
};
use statehub_storage::{Batch, StorageError, Store, Table};
use tokio::sync::watch;

use crate::stored::{self, down_since, wall_ms};

const TABLE: &str = "mqtt-sessions";
const FORMAT: u8 = 1;
const SESSION: u8 = b'S';
const MESSAGE: u8 = b'M';
const QOS2: u8 = b'Q';

/// Why the stored sessions could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("persistent sessions: {0}")]
    Storage(#[from] StorageError),
    #[error("persistent session record {key} is unreadable ({why}); the data directory was written by another version or damaged")]
    Record { key: String, why: String },
}

/// The session table of an open store.
#[derive(Debug)]
pub struct SessionTable {
    store: Store,
    table: Table,
    /// The first change that could not be submitted; every later barrier fails with it
    /// (the store only refuses once it has failed or closed, for good).
    refused: Arc<Mutex<Option<Arc<StorageError>>>>,
    /// Changes held while a group is open; submitting happens under this lock too, so
    /// the store's order is the order of `record` calls.
    pending: Mutex<Pending>,
    /// (groups closed so far, sequence number of the last closed group's batch).
    closed: watch::Sender<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Groups open now (they overlap into one batch).
    open: u32,
    batch: Batch,
    closed: u64,
}

impl SessionTable {
    /// Opens the table and reads back every session that has not expired.
    pub fn open(store: &Store) -> Result<(SessionTable, Vec<StoredSession>), LoadError> {
        let table = store.table(TABLE)?;
        let now_ms = wall_ms();
        let mut garbage = Batch::new();
        let mut sessions: HashMap<u64, (u64, StoredSession)> = HashMap::new();
        let mut messages = Vec::new();
        let mut receipts = Vec::new();
        for record in table.iter() {
            let record = record?;
            let (key, value) = (record.key(), record.value());
            let bad = |why: String| LoadError::Record { key: hex(key), why };
            match (key.first(), key.len()) {
                (Some(&SESSION), 9) => {
                    let incarnation = u64::from_be_bytes(key[1..9].try_into().map_err(|_| bad("key".into()))?);
                    match decode_session(value, incarnation, now_ms).map_err(bad)? {
                        Some(s) => drop(sessions.insert(incarnation, s)),
                        None => garbage.delete(&table, key)?,
                    }
                }
                (Some(&MESSAGE), 17) => messages.push((key.to_vec(), value.to_vec())),
                (Some(&QOS2), 11) => receipts.push(key.to_vec()),
                _ => return Err(bad("unknown key".into())),
            }
        }
        drop_superseded(&mut sessions, &table, &mut garbage)?;
        for (key, value) in messages {
            let incarnation = u64::from_be_bytes(key[1..9].try_into().unwrap_or_default());
            let seq = u64::from_be_bytes(key[9..17].try_into().unwrap_or_default());
            let Some((_, session)) = sessions.get_mut(&incarnation) else {
                garbage.delete(&table, &key)?;
                continue;
            };
            match decode_message(&value, now_ms).map_err(|why| LoadError::Record { key: hex(&key), why })? {
                Some((delivery, released)) => session.messages.push(StoredMessage { seq, delivery, released }),
                None => garbage.delete(&table, &key)?,
            }
        }
        for key in receipts {
            let incarnation = u64::from_be_bytes(key[1..9].try_into().unwrap_or_default());
            match sessions.get_mut(&incarnation) {
                Some((_, session)) => session.incoming_qos2.push(u16::from_be_bytes([key[9], key[10]])),
                None => garbage.delete(&table, &key)?,
            }
        }
        if !garbage.is_empty() {
            store.submit(garbage)?.wait()?;
        }
        let loaded = sessions.into_values().map(|(_, s)| s).collect();
        let table = SessionTable {
            store: store.clone(),
            table,
            refused: Arc::default(),
            pending: Mutex::default(),
            closed: watch::Sender::new((0, 0)),
        };
        Ok((table, loaded))
    }

    fn stage(&self, batch: &mut Batch, change: SessionChange<'_>) -> Result<(), StorageError> {
        match change {
            SessionChange::Saved { client_id, incarnation, expiry_interval, disconnected, subscriptions } => {
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
                batch.put(&self.table, &session_key(incarnation), &v)
            }
            SessionChange::Ended { incarnation, messages, incoming_qos2, .. } => {
                batch.delete(&self.table, &session_key(incarnation))?;
                for seq in messages {
                    batch.delete(&self.table, &message_key(incarnation, seq))?;
                }
                for packet_id in incoming_qos2 {
                    batch.delete(&self.table, &receipt_key(incarnation, packet_id))?;
                }
                Ok(())
            }
            SessionChange::Message { incarnation, seq, delivery, released, now } => {
                batch.put(&self.table, &message_key(incarnation, seq), &encode_message(delivery, released, now))
            }
            SessionChange::MessageDone { incarnation, seq } => batch.delete(&self.table, &message_key(incarnation, seq)),
            SessionChange::IncomingQos2 { incarnation, packet_id, pending: true } => {
                batch.put(&self.table, &receipt_key(incarnation, packet_id), &[])
            }
            SessionChange::IncomingQos2 { incarnation, packet_id, pending: false } => {
                batch.delete(&self.table, &receipt_key(incarnation, packet_id))
            }
        }
    }
    fn refuse(&self, e: StorageError) {
        let mut refused = self.refused.lock();
        if refused.is_none() {
            tracing::error!("persistent session change not stored: {e}");
            *refused = Some(Arc::new(e));
        }
    }
}

impl SessionStore for SessionTable {
    fn record(&self, change: SessionChange<'_>) {
        let mut pending = self.pending.lock();
        let staged = if pending.open > 0 {
            self.stage(&mut pending.batch, change)
        } else {
            let mut batch = Batch::new();
            self.stage(&mut batch, change).and_then(|()| self.store.submit(batch).map(drop))
        };
        drop(pending);
        if let Err(e) = staged {
            self.refuse(e);
        }
    }

    fn begin_group(&self) {
        self.pending.lock().open += 1;
    }

    fn end_group(&self) {
        let mut pending = self.pending.lock();
        pending.open = pending.open.saturating_sub(1);
        if pending.open > 0 {
            return;
        }
        let batch = std::mem::take(&mut pending.batch);
        let seq = if batch.is_empty() {
            self.store.last_seq()
        } else {
            match self.store.submit(batch) {
                Ok(ticket) => ticket.seq(),
                Err(e) => {
                    self.refuse(e);
                    self.store.last_seq()
                }
            }
        };
        pending.closed += 1;
        self.closed.send_replace((pending.closed, seq));
    }

    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        let pending = self.pending.lock();
        // While a group is open its changes are not submitted yet: wait for it to close.
        let open_group = (pending.open > 0).then(|| (pending.closed, self.closed.subscribe()));
        let last = self.store.last_seq();
        drop(pending);
        let (store, refused) = (self.store.clone(), self.refused.clone());
        Box::pin(async move {
            let seq = match open_group {
                None => last,
                Some((closed, mut rx)) => {
                    let Ok(state) = rx.wait_for(|&(n, _)| n > closed).await else {
                        return Err(SessionStoreError(Arc::new(StorageError::Closed)));
                    };
                    state.1
                }
            };
            if let Some(e) = refused.lock().clone() {
                return Err(SessionStoreError(e));
            }
            store.ticket(seq).durable().await.map_err(|e| SessionStoreError(Arc::new(e)))
        })
    }
}

/// Two records of one client id can only both be present if the older one's deletion
/// was cut by a crash: the newer (by write time) wins, the older goes.
fn drop_superseded(
    sessions: &mut HashMap<u64, (u64, StoredSession)>,
    table: &Table,
    garbage: &mut Batch,
) -> Result<(), StorageError> {
    let mut newest: HashMap<ByteString, (u64, u64)> = HashMap::new();
    let mut losers = Vec::new();
    for (&incarnation, (written, s)) in sessions.iter() {
        let best = newest.entry(s.client_id.clone()).or_insert((*written, incarnation));
        if best.1 == incarnation {
            continue;
        }
        if best.0 >= *written {
            losers.push(incarnation);
        } else {
            losers.push(best.1);
            *best = (*written, incarnation);
        }
    }
    for incarnation in losers {
        sessions.remove(&incarnation);
        garbage.delete(table, &session_key(incarnation))?;
    }
    Ok(())
}

fn session_key(incarnation: u64) -> [u8; 9] {
    let mut k = [SESSION; 9];
    k[1..].copy_from_slice(&incarnation.to_be_bytes());
    k
}

fn message_key(incarnation: u64, seq: u64) -> [u8; 17] {
    let mut k = [MESSAGE; 17];
    k[1..9].copy_from_slice(&incarnation.to_be_bytes());
    k[9..].copy_from_slice(&seq.to_be_bytes());
    k
}

fn receipt_key(incarnation: u64, packet_id: u16) -> [u8; 11] {
    let mut k = [QOS2; 11];
    k[1..9].copy_from_slice(&incarnation.to_be_bytes());
    k[9..].copy_from_slice(&packet_id.to_be_bytes());
    k
}

fn hex(bytes: &[u8]) -> String {
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
    let s = std::str::from_utf8(&buf[..len]).map_err(|e| e.to_string())?.to_owned();
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
    o.qos as u8 | u8::from(o.no_local) << 2 | u8::from(o.retain_as_published) << 3 | (o.retain_handling & 3) << 4
}

fn options_from(b: u8) -> Result<SubscriptionOptions, String> {
    Ok(SubscriptionOptions {
        qos: QoS::from_u8(b & 3).ok_or("bad QoS")?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: (b >> 4) & 3,
    })
}

/// A session record, with the time it was written; `None` if it expired by `now_ms`.
fn decode_session(value: &[u8], incarnation: u64, now_ms: u64) -> Result<Option<(u64, StoredSession)>, String> {
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
        subscriptions.push((ByteString::from(filter), Subscription { options, identifier: (id != 0).then_some(id) }));
    }
    if !buf.is_empty() {
        return Err("trailing bytes".into());
    }
    let expires_in = match expiry_interval {
        u32::MAX => None,
        secs if disconnected => {
            let left = Duration::from_secs(u64::from(secs)).saturating_sub(down_since(written_ms, now_ms));
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

fn encode_message(d: &Delivery, released: bool, now: Instant) -> Vec<u8> {
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
fn decode_message(value: &[u8], now_ms: u64) -> Result<Option<(Delivery, bool)>, String> {
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
        _ => Some(SharedVia { filter: get_str(&mut buf)?.into(), group: get_str(&mut buf)?.into() }),
    };
    let Some(msg) = stored::read_message(buf, down_since(written_ms, now_ms))? else { return Ok(None) };
    let delivery = Delivery { msg: Arc::new(msg), qos, retain, subscription_ids, shared, seq: 0, dup: true };
    Ok(Some((delivery, released)))
}

#[cfg(test)]
#[path = "sessions_test.rs"]
mod tests;
