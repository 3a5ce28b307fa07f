//! What the machine counts for the metrics endpoint: requests by command and result,
//! notifications (expiry's included), observations.

mod common;

use common::Harness;

use statehub_state_store::{COMMANDS, RESULTS};

fn count(h: &Harness, command: &str, result: &str) -> u64 {
    let c = COMMANDS.iter().position(|c| *c == command).unwrap();
    let r = RESULTS.iter().position(|r| *r == result).unwrap();
    h.machine.counts().requests[c][r]
}

#[test]
fn requests_are_counted_by_command_and_result() {
    let mut h = Harness::new();
    h.send("a", &[b"SET", b"k", b"v"]);
    h.send("a", &[b"SET", b"k", b"w", b"NX"]);
    h.send("a", &[b"GET", b"k"]);
    h.send("a", &[b"GET", b"missing"]);
    h.send("a", &[b"DEL", b"k"]);
    h.send("a", &[b"VDEL", b"k", b"v"]);
    h.send("a", &[b"SET", b"k"]);
    h.send("a", &[b"BOGUS", b"k"]);
    h.send_with("a", &[b"SET", b"k", b"v"], None, None);
    assert_eq!(count(&h, "set", "ok"), 2, "+OK and the NX's :-1");
    assert_eq!(count(&h, "get", "ok"), 2, "a hit and a nil");
    assert_eq!(count(&h, "del", "ok"), 1);
    assert_eq!(count(&h, "vdel", "ok"), 1);
    assert_eq!(count(&h, "set", "error"), 1, "missing timestamp");
    assert_eq!(
        count(&h, "invalid", "error"),
        2,
        "wrong arity and an unknown verb"
    );
    let total: u64 = h.machine.counts().requests.iter().flatten().sum();
    assert_eq!(total, 9);
}

#[test]
fn notifications_and_observations_are_counted() {
    let mut h = Harness::new();
    h.send("o1", &[b"KEYNOTIFY", b"k"]);
    h.send("o2", &[b"KEYNOTIFY", b"k"]);
    assert_eq!(h.machine.observations(), 2);
    h.send("w", &[b"SET", b"k", b"v", b"PX", b"10"]);
    assert_eq!(h.machine.counts().notifications, 2, "one per observer");
    h.advance(20);
    let now = h.now;
    h.machine.expire(now).unwrap();
    assert_eq!(
        h.machine.counts().notifications,
        4,
        "expiry's notifications too"
    );
    h.machine.client_disconnected("o1").unwrap();
    assert_eq!(h.machine.observations(), 1);
}
