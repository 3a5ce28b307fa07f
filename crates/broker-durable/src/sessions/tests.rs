use super::records::*;
use super::*;
use crate::stored::wall_ms;
use bytes::Bytes;
use statehub_broker::codec::{ByteString, QoS, SubscriptionOptions};
use statehub_broker::codec::{Publish, PublishProperties};
use statehub_broker::Message;
use statehub_broker::{SharedVia, StoredSession, Subscription};
use statehub_storage::Options;

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
    futures_lite(table.barrier()).unwrap();
}

/// Runs a barrier future to completion on a throwaway runtime.
fn futures_lite<T>(f: BoxFuture<'static, T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn message_records_round_trip_with_every_per_subscriber_field() {
    let d = delivery("a/b", b"\x00payload", None);
    let record = encode_message(d.as_ref(), true, Instant::now());
    let (back, released) = decode_message(&record, wall_ms(), Instant::now())
        .unwrap()
        .unwrap();
    assert!(released);
    assert_eq!(
        (back.qos, back.retain, &back.subscription_ids),
        (QoS::AtLeastOnce, true, &vec![7, 9])
    );
    assert_eq!(back.shared, d.shared);
    assert_eq!(
        (&back.msg.topic, &back.msg.payload, back.msg.qos),
        (&d.msg.topic, &d.msg.payload, d.msg.qos)
    );
    assert_eq!(back.msg.properties, d.msg.properties);
}

#[test]
fn time_spent_down_counts_against_message_expiry() {
    let record = encode_message(
        delivery("a", b"x", Some(10)).as_ref(),
        false,
        Instant::now(),
    );
    let now = wall_ms();
    let (back, _) = decode_message(&record, now + 3_500, Instant::now())
        .unwrap()
        .unwrap();
    assert_eq!(
        back.msg.properties.message_expiry_interval,
        Some(7),
        "10 s - 3.5 s, rounded up"
    );
    assert!(
        decode_message(&record, now + 11_000, Instant::now())
            .unwrap()
            .is_none(),
        "expired while down"
    );
}

#[test]
fn damaged_records_are_errors() {
    let record = encode_message(delivery("a", b"x", None).as_ref(), false, Instant::now());
    let now = Instant::now();
    assert!(decode_message(&record[..record.len() - 1], 0, now).is_err());
    assert!(decode_message(&[2; 20], 0, now).is_err());
    assert!(decode_message(&[], 0, now).is_err());
    assert!(decode_session(&[FORMAT, 0, 0], 1, 0).is_err());
    assert!(decode_session(&[9; 30], 1, 0).is_err());
}

#[test]
fn sessions_messages_and_receipts_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("t/1", b"one", None);
    let sub = subscription(QoS::ExactlyOnce, Some(42));
    let filter: ByteString = "t/#".into();
    {
        let (store, table, loaded) = open(dir.path());
        assert!(loaded.is_empty());
        table.record(SessionChange::Saved {
            client_id: "c1",
            incarnation: 5,
            expiry_interval: 3600,
            disconnected: true,
            subscriptions: vec![(&filter, sub)],
        });
        for seq in 1..=3 {
            table.record(SessionChange::Message {
                incarnation: 5,
                seq,
                message: d.as_ref(),
                released: seq == 2,
                now: Instant::now(),
            });
        }
        table.record(SessionChange::MessageDone {
            incarnation: 5,
            seq: 1,
        });
        table.record(SessionChange::IncomingQos2 {
            incarnation: 5,
            packet_id: 77,
            pending: true,
        });
        table.record(SessionChange::IncomingQos2 {
            incarnation: 5,
            packet_id: 78,
            pending: true,
        });
        table.record(SessionChange::IncomingQos2 {
            incarnation: 5,
            packet_id: 78,
            pending: false,
        });
        // An orphan: a message of a session that was never saved.
        table.record(SessionChange::Message {
            incarnation: 6,
            seq: 1,
            message: d.as_ref(),
            released: false,
            now: Instant::now(),
        });
        sync(&table);
        store.close().unwrap();
    }
    let (store, _table, loaded) = open(dir.path());
    assert_eq!(loaded.len(), 1);
    let s = &loaded[0];
    assert_eq!(
        (s.client_id.as_ref(), s.incarnation, s.expiry_interval),
        ("c1", 5, 3600)
    );
    assert!(s
        .expires_in
        .is_some_and(|d| d > Duration::from_secs(3590) && d <= Duration::from_secs(3600)));
    assert_eq!(s.subscriptions, vec![(filter, sub)]);
    let seqs: Vec<(u64, bool)> = s.messages.iter().map(|m| (m.seq, m.released)).collect();
    assert_eq!(seqs, vec![(2, true), (3, false)]);
    assert_eq!(s.incoming_qos2, vec![77]);
    let orphan = store
        .table(SESSIONS_TABLE)
        .unwrap()
        .get(&message_key(6, 1))
        .unwrap();
    assert!(
        orphan.is_none(),
        "records of no session are deleted at load"
    );
}

#[test]
fn ended_and_expired_sessions_are_gone_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("t/1", b"one", None);
    {
        let (store, table, _) = open(dir.path());
        for (incarnation, client_id, expiry) in
            [(1, "ended", 60), (2, "expires", 1), (3, "never", u32::MAX)]
        {
            table.record(SessionChange::Saved {
                client_id,
                incarnation,
                expiry_interval: expiry,
                disconnected: true,
                subscriptions: Vec::new(),
            });
            table.record(SessionChange::Message {
                incarnation,
                seq: 1,
                message: d.as_ref(),
                released: false,
                now: Instant::now(),
            });
        }
        table.record(SessionChange::Ended {
            incarnation: 1,
            messages: vec![1],
            incoming_qos2: vec![],
        });
        sync(&table);
        store.close().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1_100));
    let (store, _table, loaded) = open(dir.path());
    let names: Vec<&str> = loaded.iter().map(|s| s.client_id.as_ref()).collect();
    assert_eq!(names, vec!["never"]);
    assert_eq!(loaded[0].expires_in, None);
    assert_eq!(loaded[0].messages.len(), 1);
    let table = store.table(SESSIONS_TABLE).unwrap();
    assert!(
        table.get(&message_key(2, 1)).unwrap().is_none(),
        "the expired session's messages go with it"
    );
}

#[test]
fn a_connected_session_starts_its_clock_at_load_and_the_newest_record_of_a_client_wins() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, table, _) = open(dir.path());
        let save = |incarnation, disconnected| SessionChange::Saved {
            client_id: "same",
            incarnation,
            expiry_interval: 1,
            disconnected,
            subscriptions: Vec::new(),
        };
        table.record(save(10, true));
        std::thread::sleep(Duration::from_millis(5));
        table.record(save(11, false));
        sync(&table);
        store.close().unwrap();
    }
    std::thread::sleep(Duration::from_millis(1_100));
    let (_store, _table, loaded) = open(dir.path());
    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].incarnation, 11);
    assert_eq!(
        loaded[0].expires_in,
        Some(Duration::from_secs(1)),
        "connected when stopped: a full interval"
    );
}

#[test]
fn a_group_is_written_whole_and_a_barrier_taken_inside_it_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, table, _) = open(dir.path());
    let d = delivery("t", b"x", None);
    table.begin_group();
    table.record(SessionChange::Message {
        incarnation: 1,
        seq: 1,
        message: d.as_ref(),
        released: false,
        now: Instant::now(),
    });
    table.begin_group();
    table.record(SessionChange::IncomingQos2 {
        incarnation: 1,
        packet_id: 3,
        pending: true,
    });
    table.end_group();
    let barrier = table.barrier();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (early, barrier) = rt.block_on(async {
        let mut barrier = barrier;
        let early = tokio::time::timeout(Duration::from_millis(100), &mut barrier)
            .await
            .is_ok();
        (early, barrier)
    });
    assert!(!early, "the barrier waits while the outer group is open");
    let t = store.table(SESSIONS_TABLE).unwrap();
    assert!(
        t.get(&message_key(1, 1)).unwrap().is_none(),
        "nothing of an open group is submitted"
    );
    table.end_group();
    rt.block_on(barrier).unwrap();
    assert!(t.get(&message_key(1, 1)).unwrap().is_some());
    assert!(t.get(&receipt_key(1, 3)).unwrap().is_some());
}

#[test]
fn queued_messages_are_written_behind_and_an_acknowledgement_cancels_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let (store, table, _) = open(dir.path());
    let t = store.table(SESSIONS_TABLE).unwrap();
    let d = delivery("t", b"x", None);
    let now = Instant::now();
    table.record(SessionChange::Message {
        incarnation: 1,
        seq: 1,
        message: d.as_ref(),
        released: false,
        now,
    });
    table.record(SessionChange::Message {
        incarnation: 1,
        seq: 2,
        message: d.as_ref(),
        released: false,
        now,
    });
    table.record(SessionChange::MessageDone {
        incarnation: 1,
        seq: 1,
    });
    sync(&table);
    assert!(
        t.get(&message_key(1, 1)).unwrap().is_none(),
        "acknowledged while held: never written"
    );
    assert!(
        t.get(&message_key(1, 2)).unwrap().is_some(),
        "a barrier writes what is held"
    );

    table.record(SessionChange::Message {
        incarnation: 1,
        seq: 3,
        message: d.as_ref(),
        released: false,
        now: Instant::now(),
    });
    table.flush_stale();
    store.submit(Batch::new()).unwrap().wait().unwrap();
    assert!(
        t.get(&message_key(1, 3)).unwrap().is_none(),
        "held for up to STALE"
    );
    std::thread::sleep(STALE);
    table.flush_stale();
    store.submit(Batch::new()).unwrap().wait().unwrap();
    assert!(
        t.get(&message_key(1, 3)).unwrap().is_some(),
        "written once STALE passed"
    );

    table.record(SessionChange::Message {
        incarnation: 1,
        seq: 4,
        message: d.as_ref(),
        released: false,
        now: Instant::now(),
    });
    table.record(SessionChange::Ended {
        incarnation: 1,
        messages: vec![2, 3, 4],
        incoming_qos2: vec![],
    });
    sync(&table);
    for seq in 1..=4 {
        assert!(
            t.get(&message_key(1, seq)).unwrap().is_none(),
            "the session ended: {seq} gone"
        );
    }
}
