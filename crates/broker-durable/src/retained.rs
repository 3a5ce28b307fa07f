//! Retained MQTT messages on the data directory: the broker's [`RetainStore`] hook.
//!
//! One table, `mqtt-retained`, keyed by topic. A value is a format byte, the wall-clock
//! time it was written (ms since the Unix epoch, big-endian) and the message as an
//! MQTT 5 PUBLISH, encoded by our own codec (so every property survives as the wire
//! has it), with its Message Expiry Interval set to what was left when it was
//! written. On load, the time spent down is subtracted: a message that expired while
//! statehub was down is not loaded, and its record is deleted.

use std::sync::Arc;
use std::time::Instant;

use bytes::{BufMut, BytesMut};
use statehub_broker::{BoxFuture, Message, RetainStore, RetainStoreError};
use statehub_storage::{Batch, StorageError, Store, Table};

use crate::stored::{self, wall_ms, Reader, RecordError};
use crate::LoadError;

/// The table of retained messages, keyed by topic.
pub const RETAINED_TABLE: &str = "mqtt-retained";
const FORMAT: u8 = 1;
const HEADER: usize = 9;

/// The retained-message table of an open store.
#[derive(Debug)]
pub struct RetainedTable {
    store: Store,
    table: Table,
}

impl RetainedTable {
    /// Opens the table and reads every retained message that has not expired.
    pub fn open(store: &Store) -> Result<(RetainedTable, Vec<Message>), LoadError> {
        let failed = LoadError::storage(RETAINED_TABLE);
        let table = store.table(RETAINED_TABLE).map_err(&failed)?;
        let (now_ms, now) = (wall_ms(), Instant::now());
        let (mut live, mut expired) = (Vec::new(), Batch::new());
        for record in table.iter() {
            let record = record.map_err(&failed)?;
            let decoded = decode(record.value(), now_ms, now)
                .map_err(LoadError::record(RETAINED_TABLE, record.key()))?;
            match decoded {
                Some(msg) => live.push(msg),
                None => expired.delete(&table, record.key()).map_err(&failed)?,
            }
        }
        if !expired.is_empty() {
            store.submit(expired).map_err(&failed)?;
        }
        Ok((
            RetainedTable {
                store: store.clone(),
                table,
            },
            live,
        ))
    }
}

impl RetainStore for RetainedTable {
    fn record(
        &self,
        msg: &Message,
        now: Instant,
    ) -> BoxFuture<'static, Result<(), RetainStoreError>> {
        let mut batch = Batch::new();
        let queued = if msg.payload.is_empty() {
            batch.delete(&self.table, msg.topic.as_bytes())
        } else {
            batch.put(
                &self.table,
                msg.topic.as_bytes(),
                &encode(msg, now, wall_ms()),
            )
        }
        .and_then(|()| self.store.submit(batch));
        Box::pin(async move {
            let failed = |e: StorageError| RetainStoreError(Arc::new(e));
            queued.map_err(failed)?.durable().await.map_err(failed)
        })
    }
}

fn encode(msg: &Message, now: Instant, now_ms: u64) -> Vec<u8> {
    let mut out = BytesMut::with_capacity(HEADER + msg.payload.len() + msg.topic.len() + 64);
    out.put_u8(FORMAT);
    out.put_u64(now_ms);
    stored::put_message(&mut out, msg, now);
    out.to_vec()
}

/// The message a record holds, received at `now`; `None` if it expired by `now_ms`.
fn decode(value: &[u8], now_ms: u64, now: Instant) -> Result<Option<Message>, RecordError> {
    let mut r = Reader(value);
    match r.u8()? {
        FORMAT => {}
        other => return Err(RecordError::UnknownFormat(other)),
    }
    let written_ms = r.u64()?;
    stored::read_message(r.rest(), stored::down_since(written_ms, now_ms), now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use statehub_broker::codec::{Publish, PublishProperties, QoS};

    fn message(expiry: Option<u32>) -> Message {
        let properties = PublishProperties {
            message_expiry_interval: expiry,
            content_type: Some("text/plain".into()),
            user_properties: vec![("k".into(), "v".into())],
            ..PublishProperties::default()
        };
        let publish = Publish {
            dup: false,
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: "a/b".into(),
            packet_id: Some(7),
            payload: Bytes::from_static(b"\x00payload"),
            properties,
        };
        Message::from_publish(publish, Some("c".into()), Instant::now())
    }

    #[test]
    fn records_round_trip_with_every_property() {
        let msg = message(None);
        let back = decode(&encode(&msg, Instant::now(), 1_000), 5_000, Instant::now())
            .unwrap()
            .unwrap();
        assert_eq!(back.topic, msg.topic);
        assert_eq!(back.payload, msg.payload);
        assert_eq!(back.qos, msg.qos);
        assert!(back.retain);
        assert_eq!(back.properties, msg.properties);
    }

    #[test]
    fn time_spent_down_counts_against_message_expiry() {
        let msg = message(Some(10));
        let record = encode(&msg, Instant::now(), 1_000);
        let back = decode(&record, 4_500, Instant::now()).unwrap().unwrap();
        assert_eq!(
            back.properties.message_expiry_interval,
            Some(7),
            "10 s - 3.5 s, rounded up"
        );
        assert!(
            decode(&record, 11_000, Instant::now()).unwrap().is_none(),
            "expired while down"
        );
        assert!(
            decode(&record, 0, Instant::now()).unwrap().is_some(),
            "a clock that went back loses nothing"
        );
    }

    #[test]
    fn damaged_records_are_errors_not_messages() {
        let record = encode(&message(None), Instant::now(), 1);
        assert!(decode(&[], 0, Instant::now()).is_err());
        assert!(decode(&[2, 0, 0, 0, 0, 0, 0, 0, 0], 0, Instant::now()).is_err());
        assert!(decode(&record[..record.len() - 1], 0, Instant::now()).is_err());
        let mut longer = record.clone();
        longer.push(0);
        assert!(decode(&longer, 0, Instant::now()).is_err());
    }
}
