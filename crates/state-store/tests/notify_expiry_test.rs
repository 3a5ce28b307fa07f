//! Notifications (exact payloads, versions, topics), active expiry and disconnects.

mod common;

use bytes::Bytes;
use common::{notifies, Harness, T0};
use statehub_state_store::{notify_topic, Effect, Notification};

const SET_ABC: &[u8] = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n";
const DELETE: &[u8] = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n";

fn n(
    client: &str,
    key: &[u8],
    payload: &[u8],
    version: &str,
) -> (String, Vec<u8>, Vec<u8>, String) {
    (
        client.to_owned(),
        key.to_vec(),
        payload.to_vec(),
        version.to_owned(),
    )
}

#[test]
fn topic_is_upper_case_hex() {
    assert_eq!(
        notify_topic(b"client-id1", b"SOMEKEY"),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/636C69656E742D696431/command/notify/534F4D454B4559"
    );
    assert_eq!(
        notify_topic(b"\xab", b"\x00\xff\x0a"),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/AB/command/notify/00FF0A"
    );
}

#[test]
fn set_notifies_every_observer_with_the_new_version() {
    let mut h = Harness::new();
    h.send("obs2", &[b"KEYNOTIFY", b"SOMEKEY"]);
    h.send("obs1", &[b"KEYNOTIFY", b"SOMEKEY"]);
    h.send("obs1", &[b"KEYNOTIFY", b"other"]);
    let outcome = h.send("writer", &[b"SET", b"SOMEKEY", b"abc"]);
    let version = outcome.reply.version.expect("version").to_string();
    assert_eq!(version, "001696374425001:00000:state-store");
    assert_eq!(
        notifies(&outcome.effects),
        vec![
            n("obs1", b"SOMEKEY", SET_ABC, &version),
            n("obs2", b"SOMEKEY", SET_ABC, &version)
        ]
    );
    let Effect::Notify(first) = &outcome.effects[0] else {
        panic!("not a notify")
    };
    assert_eq!(
        first.topic(),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/6F627331/command/notify/534F4D454B4559"
    );
}

#[test]
fn the_writer_is_notified_of_its_own_write() {
    let mut h = Harness::new();
    h.send("c", &[b"KEYNOTIFY", b"k"]);
    let outcome = h.send("c", &[b"SET", b"k", b""]);
    assert_eq!(
        notifies(&outcome.effects),
        vec![n(
            "c",
            b"k",
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$0\r\n\r\n",
            "001696374425001:00000:state-store"
        )]
    );
}

#[test]
fn deletes_notify_with_the_deletion_version() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"k"]);
    h.send("c", &[b"SET", b"k", b"v"]);
    let del = h.send("c", &[b"DEL", b"k"]);
    assert_eq!(
        notifies(&del.effects),
        vec![n("o", b"k", DELETE, "001696374425001:00001:state-store")]
    );
    h.send("c", &[b"SET", b"k", b"v"]);
    let refused = h.send("c", &[b"VDEL", b"k", b"x"]);
    assert!(refused.effects.is_empty());
    let vdel = h.send("c", &[b"VDEL", b"k", b"v"]);
    assert_eq!(
        notifies(&vdel.effects),
        vec![n("o", b"k", DELETE, "001696374425001:00003:state-store")]
    );
    // Nothing to delete, nothing to notify.
    assert!(h.send("c", &[b"DEL", b"k"]).effects.is_empty());
}

#[test]
fn refused_sets_do_not_notify() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"k"]);
    h.send("c", &[b"SET", b"k", b"v"]);
    assert!(h.send("c", &[b"SET", b"k", b"w", b"NX"]).effects.is_empty());
    assert!(h
        .send("c", &[b"SET", b"k", b"w", b"NEX"])
        .effects
        .is_empty());
    assert!(h
        .send_with("c", &[b"SET", b"k", b"w"], None, None)
        .effects
        .is_empty());
}

#[test]
fn stop_and_disconnect_end_notifications() {
    let mut h = Harness::new();
    h.send("a", &[b"KEYNOTIFY", b"k"]);
    h.send("b", &[b"KEYNOTIFY", b"k"]);
    h.send("a", &[b"KEYNOTIFY", b"k", b"STOP"]);
    assert_eq!(
        notifies(&h.send("c", &[b"SET", b"k", b"1"]).effects).len(),
        1
    );
    h.machine.client_disconnected("b").expect("memory engine");
    assert!(h.send("c", &[b"SET", b"k", b"2"]).effects.is_empty());
    // A reconnecting client starts from nothing.
    assert_eq!(h.reply("b", &[b"KEYNOTIFY", b"k", b"STOP"]).0, b":0\r\n");
    h.machine
        .client_disconnected("never-seen")
        .expect("memory engine");
}

#[test]
fn observing_absent_keys_sees_their_creation() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"later"]);
    h.advance(5_000);
    let outcome = h.send("c", &[b"SET", b"later", b"abc"]);
    assert_eq!(
        notifies(&outcome.effects),
        vec![n(
            "o",
            b"later",
            SET_ABC,
            "001696374430001:00000:state-store"
        )]
    );
}

#[test]
fn expiry_removes_and_notifies() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"lease"]);
    let set = h.send(
        "holder",
        &[b"SET", b"lease", b"holder", b"NEX", b"PX", b"1500"],
    );
    assert_eq!(
        set.effects[0],
        Effect::ArmExpiry {
            key: Bytes::from_static(b"lease"),
            at_ms: T0 + 1_500
        }
    );
    assert_eq!(h.machine.next_expiry().unwrap(), Some(T0 + 1_500));
    assert!(h.machine.expire(T0 + 1_499).unwrap().is_empty());
    let effects = h.machine.expire(T0 + 1_500).unwrap();
    assert_eq!(
        effects,
        vec![Effect::Notify(Notification {
            client_id: "o".to_owned(),
            key: Bytes::from_static(b"lease"),
            payload: Bytes::from_static(DELETE),
            version: common::version(T0 + 1_500, 0),
        })]
    );
    assert_eq!(h.machine.next_expiry().unwrap(), None);
    assert!(h.machine.expire(T0 + 5_000).unwrap().is_empty());
    h.advance(2_000);
    assert_eq!(
        h.reply("c", &[b"GET", b"lease"]),
        (b"$-1\r\n".to_vec(), None)
    );
}

#[test]
fn requests_expire_due_keys_first() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"lock"]);
    h.send("one", &[b"SET", b"lock", b"one", b"NEX", b"PX", b"100"]);
    h.advance(100);
    // The shell's timer has not fired yet; the lease is gone anyway, and the new holder wins.
    let outcome = h.send("two", &[b"SET", b"lock", b"two", b"NX", b"PX", b"100"]);
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    assert_eq!(
        notifies(&outcome.effects),
        vec![
            n("o", b"lock", DELETE, "001696374425100:00000:state-store"),
            n(
                "o",
                b"lock",
                b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\ntwo\r\n",
                "001696374425101:00000:state-store"
            ),
        ]
    );
}

#[test]
fn many_keys_expire_in_order() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"b"]);
    h.send("o", &[b"KEYNOTIFY", b"a"]);
    h.send("c", &[b"SET", b"b", b"v", b"PX", b"10"]);
    h.send("c", &[b"SET", b"a", b"v", b"PX", b"20"]);
    h.send("c", &[b"SET", b"z", b"v", b"PX", b"30"]);
    let effects = h.machine.expire(T0 + 25).unwrap();
    let keys: Vec<Vec<u8>> = notifies(&effects)
        .into_iter()
        .map(|(_, k, _, _)| k)
        .collect();
    assert_eq!(keys, vec![b"b".to_vec(), b"a".to_vec()]);
    assert_eq!(h.machine.next_expiry().unwrap(), Some(T0 + 30));
}
