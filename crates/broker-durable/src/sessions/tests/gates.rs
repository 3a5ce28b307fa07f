//! A gate left to the table (`SessionStore::open_when_stored`) opens only once every
//! change recorded before it is on disk.

use std::time::Duration;

use statehub_broker::Gate;

use super::*;
use crate::sessions::records::message_key;

/// Waits until `cond` holds, polling (generous bound: a loaded machine is slow).
async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A table on a full disk, a QoS 2 copy queued (session 7, message 1) and its gate
/// left to the table, which stays shut while the copy's write stalls: the directory,
/// the store and the table (each kept for the test's length) and the gate.
async fn gate_behind_a_stalled_write() -> (tempfile::TempDir, Store, SessionTable, Arc<Gate>) {
    let dir = tempfile::tempdir().unwrap();
    let (store, table, _) = open(dir.path());
    store.set_disk_full(true);
    let d = delivery("t", b"qos2 copy", None);
    queue(&table, 7, 1, &d, false);
    let gate = Arc::new(Gate::default());
    table.open_when_stored(gate.clone());
    assert!(!gate.is_open(), "opened before its record was written");
    until("the write stalls", || store.stall_error().is_some()).await;
    (dir, store, table, gate)
}

#[tokio::test]
async fn a_gate_left_to_the_table_waits_while_the_disk_is_full_and_opens_once_written() {
    let (_dir, store, _table, gate) = gate_behind_a_stalled_write().await;
    assert!(
        !gate.is_open(),
        "opened while its record waits for disk space"
    );
    assert_eq!(store.durable_seq(), 0);

    store.set_disk_full(false);
    until("the gate opens", || gate.is_open()).await;
    let t = store.table(SESSIONS_TABLE).unwrap();
    assert!(t.get(&message_key(7, 1)).unwrap().is_some());
    assert!(
        store.durable_seq() >= store.last_seq(),
        "its record is durable"
    );
}

#[tokio::test]
async fn a_gate_stays_shut_when_the_store_can_never_write_its_record() {
    let (_dir, store, _table, gate) = gate_behind_a_stalled_write().await;
    // Closing while the disk is full ends the store with the write never made.
    let closed = tokio::task::spawn_blocking(move || {
        let _ = store.close();
        store
    });
    let store = closed.await.unwrap();
    drop(store);
    // The task that would open it is done once it lets go of the gate.
    until("the opener gives up", || Arc::strong_count(&gate) == 1).await;
    assert!(!gate.is_open(), "opened with its record never written");
}
