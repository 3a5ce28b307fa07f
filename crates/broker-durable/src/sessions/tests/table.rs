//! What survives a reopen, and when the table writes it.

use std::time::Duration;

use statehub_broker::codec::ByteString;
use statehub_storage::Batch;

use super::*;
use crate::sessions::records::{message_key, receipt_key};
use crate::sessions::STALE;

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
            queue(&table, 5, seq, &d, false);
        }
        queue(&table, 5, 2, &d, true);
        done(&table, 5, 1, &d);
        for (packet_id, pending) in [(77, true), (78, true), (78, false)] {
            table.record(SessionChange::IncomingQos2 {
                incarnation: 5,
                packet_id,
                pending,
            });
        }
        // An orphan: a message of a session that was never saved.
        queue(&table, 6, 1, &d, false);
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
    let m = &s.messages[0];
    assert_eq!(
        (m.qos, m.retain, &m.subscription_ids, &m.shared),
        (d.qos, d.retain, &d.subscription_ids, &d.shared)
    );
    assert_eq!(
        (&m.msg.topic, &m.msg.payload, &m.msg.properties),
        (&d.msg.topic, &d.msg.payload, &d.msg.properties)
    );
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
            table.record(saved(client_id, incarnation, expiry));
            queue(&table, incarnation, 1, &d, false);
        }
        table.record(SessionChange::Ended {
            incarnation: 1,
            messages: vec![(1, &d.msg)],
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
    queue(&table, 1, 1, &d, false);
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
    assert_eq!(count(&store, b'B'), 1, "with its body");
}

#[test]
fn queued_messages_are_written_behind_and_an_acknowledgement_cancels_the_write() {
    let dir = tempfile::tempdir().unwrap();
    let (store, table, _) = open(dir.path());
    let t = store.table(SESSIONS_TABLE).unwrap();
    let (d, once) = (delivery("t", b"x", None), delivery("t", b"y", None));
    queue(&table, 1, 1, &once, false);
    queue(&table, 1, 2, &d, false);
    done(&table, 1, 1, &once);
    sync(&table);
    assert!(
        t.get(&message_key(1, 1)).unwrap().is_none(),
        "acknowledged while held: never written"
    );
    assert!(
        t.get(&message_key(1, 2)).unwrap().is_some(),
        "a barrier writes what is held"
    );
    assert_eq!(count(&store, b'B'), 1, "nor was the body of the first");

    queue(&table, 1, 3, &d, false);
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

    queue(&table, 1, 4, &d, false);
    table.record(SessionChange::Ended {
        incarnation: 1,
        messages: vec![(2, &d.msg), (3, &d.msg), (4, &d.msg)],
        incoming_qos2: vec![],
    });
    sync(&table);
    for seq in 1..=4 {
        assert!(
            t.get(&message_key(1, seq)).unwrap().is_none(),
            "the session ended: {seq} gone"
        );
    }
    assert_eq!(count(&store, b'B'), 0, "and the body with the last record");
}
