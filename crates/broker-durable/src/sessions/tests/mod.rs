//! The session table's tests: record encodings (`records.rs`), what survives a reopen
//! and when it is written (`table.rs`), message bodies stored once (`bodies.rs`).

mod bodies;
mod gates;
mod records;
mod table;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use statehub_broker::codec::{Publish, PublishProperties, QoS, SubscriptionOptions};
use statehub_broker::{BoxFuture, Message, SessionChange, SessionStore, SharedVia};
use statehub_broker::{StoredSession, Subscription};
use statehub_storage::{Options, Store};

use super::records::Queued;
use super::{SessionTable, SESSIONS_TABLE};

fn delivery(topic: &str, payload: &'static [u8], expiry: Option<u32>) -> Queued {
    let properties = PublishProperties {
        message_expiry_interval: expiry,
        correlation_data: Some(Bytes::from_static(b"\x01\x02")),
        user_properties: vec![("k".into(), "v".into())],
        ..PublishProperties::default()
    };
    let publish = Publish {
        dup: false,
        qos: QoS::ExactlyOnce,
        retain: false,
        topic: topic.into(),
        packet_id: Some(3),
        payload: Bytes::from_static(payload),
        properties,
    };
    let msg = Message::from_publish(publish, Some("publisher".into()), Instant::now());
    Queued {
        msg: Arc::new(msg),
        qos: QoS::AtLeastOnce,
        retain: true,
        subscription_ids: vec![7, 9],
        shared: Some(SharedVia {
            filter: "a/#".into(),
            group: "g".into(),
        }),
    }
}

fn subscription(qos: QoS, id: Option<u32>) -> Subscription {
    let options = SubscriptionOptions {
        qos,
        no_local: true,
        retain_as_published: false,
        retain_handling: 2,
    };
    Subscription {
        options,
        identifier: id,
    }
}

fn open(dir: &std::path::Path) -> (Store, SessionTable, Vec<StoredSession>) {
    let store = Store::open(dir, Options::default()).unwrap();
    let (table, loaded) = SessionTable::open(&store).unwrap();
    (store, table, loaded)
}

fn sync(table: &SessionTable) {
    block_on(table.barrier()).unwrap();
}

/// Runs a barrier future to completion on a throwaway runtime.
fn block_on<T>(f: BoxFuture<'static, T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Records `d` as message `seq` of session `incarnation` (`released`: its PUBREL sent).
fn queue(table: &SessionTable, incarnation: u64, seq: u64, d: &Queued, released: bool) {
    table.record(SessionChange::Message {
        incarnation,
        seq,
        message: d.as_ref(),
        released,
        now: Instant::now(),
    });
}

/// Records that message `seq` (`d`) of session `incarnation` is done with.
fn done(table: &SessionTable, incarnation: u64, seq: u64, d: &Queued) {
    table.record(SessionChange::MessageDone {
        incarnation,
        seq,
        msg: &d.msg,
    });
}

/// How many records of `kind` (`b'S'`, `b'M'`, `b'B'`, `b'Q'`) the table holds.
fn count(store: &Store, kind: u8) -> usize {
    let table = store.table(SESSIONS_TABLE).unwrap();
    let n = table.prefix(&[kind]).count();
    n
}

fn saved<'a>(client_id: &'a str, incarnation: u64, expiry: u32) -> SessionChange<'a> {
    SessionChange::Saved {
        client_id,
        incarnation,
        expiry_interval: expiry,
        disconnected: true,
        subscriptions: Vec::new(),
    }
}
