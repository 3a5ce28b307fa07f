//! The persistent-session record format shared by every [`SessionStore`]: the fields a
//! store writes for a session's subscriptions and for a queued message's per-subscriber
//! copy, and their decoders. Each store frames them its own way (a format byte, a
//! timestamp, a client id, where the message body is); what is here is only what they
//! all write alike, so that one store's bytes never drift from another's by accident.
//! Everything is big-endian; strings are a `u16` length then UTF-8 bytes (an MQTT string
//! is never longer).
//!
//! [`SessionStore`]: crate::SessionStore

use std::sync::Arc;

use bytes::{Buf, BufMut, BytesMut};
use statehub_mqtt_codec::{ByteString, QoS, SubscriptionOptions};

use crate::message::{Message, SharedVia};
use crate::session::Subscription;
use crate::session_store::{QueuedRef, StoredMessage};

/// A record's shared fields cannot be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordFormatError {
    #[error("record ends inside a field")]
    Truncated,
    #[error("invalid QoS {0}")]
    QoS(u8),
    #[error("a string is not UTF-8")]
    Utf8,
}

/// Appends `s`, its length first; past `u16::MAX` bytes it is cut.
pub fn put_str(out: &mut BytesMut, s: &str) {
    let len = s.len().min(usize::from(u16::MAX));
    out.put_u16(len as u16);
    out.put_slice(&s.as_bytes()[..len]);
}

/// Subscription options as one byte: QoS in bits 0-1, No Local 2, Retain As Published
/// 3, Retain Handling 4-5 (the SUBSCRIBE options byte's layout).
pub fn options_byte(o: SubscriptionOptions) -> u8 {
    o.qos as u8
        | u8::from(o.no_local) << 2
        | u8::from(o.retain_as_published) << 3
        | (o.retain_handling & 3) << 4
}

fn options_from(b: u8) -> Result<SubscriptionOptions, RecordFormatError> {
    Ok(SubscriptionOptions {
        qos: QoS::from_u8(b & 3).ok_or(RecordFormatError::QoS(b & 3))?,
        no_local: b & 4 != 0,
        retain_as_published: b & 8 != 0,
        retain_handling: (b >> 4) & 3,
    })
}

/// Appends a session's subscriptions: their count, then per subscription its filter,
/// options byte and identifier (0 for none).
pub fn put_subscriptions(out: &mut BytesMut, subscriptions: &[(&ByteString, Subscription)]) {
    out.put_u32(u32::try_from(subscriptions.len()).unwrap_or(u32::MAX));
    for (filter, sub) in subscriptions {
        put_str(out, filter);
        out.put_u8(options_byte(sub.options));
        out.put_u32(sub.identifier.unwrap_or(0));
    }
}

/// Appends a queued message's per-subscriber fields: QoS, retain, whether its PUBREL
/// was sent, subscription identifiers (at most `u16::MAX`), and the shared
/// subscription it came through.
pub fn put_message_fields(out: &mut BytesMut, m: QueuedRef<'_>, released: bool) {
    out.put_u8(m.qos as u8);
    out.put_u8(u8::from(m.retain));
    out.put_u8(u8::from(released));
    let ids = &m.subscription_ids[..m.subscription_ids.len().min(usize::from(u16::MAX))];
    out.put_u16(ids.len() as u16);
    for id in ids {
        out.put_u32(*id);
    }
    match m.shared {
        Some(via) => {
            out.put_u8(1);
            put_str(out, &via.filter);
            put_str(out, &via.group);
        }
        None => out.put_u8(0),
    }
}

/// A queued message's per-subscriber fields as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFields {
    pub qos: QoS,
    pub retain: bool,
    pub released: bool,
    pub subscription_ids: Vec<u32>,
    pub shared: Option<SharedVia>,
}

impl MessageFields {
    /// The stored message these fields describe, with its sequence number and body.
    pub fn into_stored(self, seq: u64, msg: Arc<Message>) -> StoredMessage {
        StoredMessage {
            seq,
            msg,
            qos: self.qos,
            retain: self.retain,
            subscription_ids: self.subscription_ids,
            shared: self.shared,
            released: self.released,
        }
    }
}

/// Reads a record's fields in order; every read refuses a record that ends early.
#[derive(Debug)]
pub struct RecordReader<'a>(&'a [u8]);

impl<'a> RecordReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        RecordReader(bytes)
    }

    fn need(&self, n: usize) -> Result<(), RecordFormatError> {
        if self.0.len() < n {
            return Err(RecordFormatError::Truncated);
        }
        Ok(())
    }

    pub fn u8(&mut self) -> Result<u8, RecordFormatError> {
        self.need(1)?;
        Ok(self.0.get_u8())
    }

    pub fn u16(&mut self) -> Result<u16, RecordFormatError> {
        self.need(2)?;
        Ok(self.0.get_u16())
    }

    pub fn u32(&mut self) -> Result<u32, RecordFormatError> {
        self.need(4)?;
        Ok(self.0.get_u32())
    }

    pub fn u64(&mut self) -> Result<u64, RecordFormatError> {
        self.need(8)?;
        Ok(self.0.get_u64())
    }

    pub fn qos(&mut self) -> Result<QoS, RecordFormatError> {
        let b = self.u8()?;
        QoS::from_u8(b).ok_or(RecordFormatError::QoS(b))
    }

    pub fn str(&mut self) -> Result<&'a str, RecordFormatError> {
        let n = usize::from(self.u16()?);
        self.need(n)?;
        let (s, rest) = self.0.split_at(n);
        self.0 = rest;
        std::str::from_utf8(s).map_err(|_| RecordFormatError::Utf8)
    }

    /// What is left unread.
    pub fn rest(&self) -> &'a [u8] {
        self.0
    }

    /// The fields [`put_subscriptions`] wrote.
    pub fn subscriptions(&mut self) -> Result<Vec<(ByteString, Subscription)>, RecordFormatError> {
        let n = self.u32()?;
        let mut subscriptions = Vec::new();
        for _ in 0..n {
            let filter = ByteString::from(self.str()?);
            let options = options_from(self.u8()?)?;
            let id = self.u32()?;
            let identifier = (id != 0).then_some(id);
            subscriptions.push((
                filter,
                Subscription {
                    options,
                    identifier,
                },
            ));
        }
        Ok(subscriptions)
    }

    /// The fields [`put_message_fields`] wrote.
    pub fn message_fields(&mut self) -> Result<MessageFields, RecordFormatError> {
        let qos = self.qos()?;
        let retain = self.u8()? != 0;
        let released = self.u8()? != 0;
        let n = self.u16()?;
        let subscription_ids = (0..n).map(|_| self.u32()).collect::<Result<_, _>>()?;
        let shared = match self.u8()? {
            0 => None,
            _ => Some(SharedVia {
                filter: self.str()?.into(),
                group: self.str()?.into(),
            }),
        };
        Ok(MessageFields {
            qos,
            retain,
            released,
            subscription_ids,
            shared,
        })
    }
}
