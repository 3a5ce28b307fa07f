//! A message queued for many sessions is stored once and deleted with the last record
//! that refers to it; what a crash can leave (a body without records) is cleaned at
//! load, and what it must never leave (a record without its body) is refused.

use statehub_storage::Batch;

use super::*;
use crate::sessions::records::message_key;

/// Bytes of every record of `kind` in the table.
fn bytes(store: &Store, kind: u8) -> usize {
    let table = store.table(SESSIONS_TABLE).unwrap();
    let n = table
        .prefix(&[kind])
        .map(|r| r.unwrap().value().len())
        .sum();
    n
}

#[test]
fn a_message_queued_for_many_sessions_is_stored_once_until_the_last_copy_goes() {
    const SESSIONS: u64 = 20;
    static PAYLOAD: [u8; 10_000] = [7; 10_000];
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("fan/out", &PAYLOAD, None);
    {
        let (store, table, _) = open(dir.path());
        for incarnation in 1..=SESSIONS {
            table.record(saved(&format!("c{incarnation}"), incarnation, 600));
            queue(&table, incarnation, 1, &d, false);
        }
        sync(&table);
        assert_eq!((count(&store, b'M'), count(&store, b'B')), (20, 1));
        let stored = bytes(&store, b'M') + bytes(&store, b'B');
        assert!(
            stored < 2 * PAYLOAD.len(),
            "{stored} bytes for 20 copies of {} bytes",
            PAYLOAD.len()
        );
        store.close().unwrap();
    }
    let (store, table, loaded) = open(dir.path());
    assert_eq!(loaded.len(), SESSIONS as usize);
    let first = &loaded[0].messages[0].msg;
    assert!(
        loaded
            .iter()
            .all(|s| Arc::ptr_eq(&s.messages[0].msg, first)),
        "the copies share one loaded message"
    );
    let loaded_copy = Queued {
        msg: first.clone(),
        ..d.clone()
    };
    for s in &loaded[1..] {
        done(&table, s.incarnation, 1, &loaded_copy);
    }
    sync(&table);
    assert_eq!((count(&store, b'M'), count(&store, b'B')), (1, 1));
    done(&table, loaded[0].incarnation, 1, &loaded_copy);
    sync(&table);
    assert_eq!(
        (count(&store, b'M'), count(&store, b'B')),
        (0, 0),
        "the last copy takes the body with it"
    );
}

#[test]
fn a_body_no_record_refers_to_is_deleted_at_load_and_a_missing_body_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = delivery("t", b"x", None);
    {
        let (store, table, _) = open(dir.path());
        table.record(saved("c", 1, 600));
        queue(&table, 1, 1, &d, false);
        sync(&table);
        // A crash between a record's deletion and its body's: the body stays behind.
        let t = store.table(SESSIONS_TABLE).unwrap();
        let mut batch = Batch::new();
        batch.delete(&t, &message_key(1, 1)).unwrap();
        store.submit(batch).unwrap().wait().unwrap();
        store.close().unwrap();
    }
    let (store, table, loaded) = open(dir.path());
    assert!(loaded[0].messages.is_empty());
    assert_eq!(count(&store, b'B'), 0, "the orphan body is deleted");

    // A record whose body is gone is damage: the load says so rather than guess.
    queue(&table, 1, 2, &d, false);
    sync(&table);
    let t = store.table(SESSIONS_TABLE).unwrap();
    let bodies: Vec<Vec<u8>> = t.prefix(b"B").map(|r| r.unwrap().key().to_vec()).collect();
    assert_eq!(bodies.len(), 1);
    let mut batch = Batch::new();
    batch.delete(&t, &bodies[0]).unwrap();
    store.submit(batch).unwrap().wait().unwrap();
    drop(table);
    store.close().unwrap();
    drop(store);
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let err = SessionTable::open(&store).unwrap_err();
    assert!(err.to_string().contains("not stored"), "{err}");
}

#[test]
fn held_copies_written_while_a_group_is_open_join_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (store, table, _) = open(dir.path());
    let d = delivery("t", b"shared", None);
    // Held (outside any group), then the same message queued inside a group: the
    // group's batch stages its body. A barrier inside the group must not write the
    // held record ahead of that batch, body-less.
    queue(&table, 1, 1, &d, false);
    table.begin_group();
    queue(&table, 2, 1, &d, false);
    let barrier = table.barrier();
    store.submit(Batch::new()).unwrap().wait().unwrap();
    assert_eq!(
        (count(&store, b'M'), count(&store, b'B')),
        (0, 0),
        "nothing is written while the group is open"
    );
    table.end_group();
    block_on(barrier).unwrap();
    assert_eq!((count(&store, b'M'), count(&store, b'B')), (2, 1));
}
