//! Every command end to end: request payload and user properties in, exact payload,
//! `__ts` and effects out.

mod common;

use bytes::Bytes;
use common::{client_ts, notifies, Harness, T0};
use statehub_state_store::{Config, Effect};

/// The version of the first write, stamped and handled at `T0`: the server steps past a
/// stamp from the millisecond it handles it in (the page's example shows
/// `1696374425000:1`, the textbook HLC update; see `hlc.rs` for why statehub steps).
const V1: &str = "001696374425001:00000:state-store";
/// The version of the second write within that millisecond.
const V2: &str = "001696374425001:00001:state-store";

fn ts(s: &str) -> Option<String> {
    Some(s.to_owned())
}

#[test]
fn set_then_get_page_example() {
    let mut h = Harness::new();
    assert_eq!(
        h.reply("c", &[b"SET", b"keyName", b"value"]),
        (b"+OK\r\n".to_vec(), ts(V1))
    );
    assert_eq!(
        h.reply("c", &[b"GET", b"keyName"]),
        (b"$5\r\nvalue\r\n".to_vec(), ts(V1))
    );
}

#[test]
fn get_missing_has_no_timestamp() {
    let mut h = Harness::new();
    assert_eq!(
        h.reply("c", &[b"GET", b"nope"]),
        (b"$-1\r\n".to_vec(), None)
    );
    // Without a `__ts` too.
    let outcome = h.send_with("c", &[b"GET", b"nope"], None, None);
    assert_eq!(&outcome.reply.payload[..], b"$-1\r\n");
    assert_eq!(outcome.reply.version, None);
}

#[test]
fn empty_and_binary_values_round_trip() {
    let mut h = Harness::new();
    h.send("c", &[b"SET", b"k", b""]);
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$0\r\n\r\n");
    h.send("c", &[b"SET", b"\x00\xff", b"\r\n\x00"]);
    assert_eq!(
        h.reply("c", &[b"GET", b"\x00\xff"]).0,
        b"$3\r\n\r\n\x00\r\n"
    );
}

#[test]
fn large_keys_and_values() {
    let mut h = Harness::new();
    let key = vec![b'k'; 6_500];
    let value = vec![0xAB; 65_000];
    assert_eq!(h.reply("c", &[b"SET", &key, &value]).0, b"+OK\r\n");
    let mut expected = b"$65000\r\n".to_vec();
    expected.extend_from_slice(&value);
    expected.extend_from_slice(b"\r\n");
    assert_eq!(h.reply("c", &[b"GET", &key]).0, expected);
}

#[test]
fn set_versions_strictly_increase_and_exceed_the_request() {
    let mut h = Harness::new();
    let a = h.reply("c", &[b"SET", b"k", b"1"]).1;
    let b = h.reply("c", &[b"SET", b"k", b"2"]).1;
    assert_eq!(a.as_deref(), Some(V1));
    assert_eq!(b.as_deref(), Some(V2));
    // A client clock 30 s ahead: the version follows it.
    let ahead = format!("{:015}:00004:CLIENT", T0 + 30_000);
    let outcome = h.send_with("c", &[b"SET", b"k", b"3"], Some(&ahead), None);
    assert_eq!(
        outcome.reply.version.map(|v| v.to_string()).as_deref(),
        Some("001696374455000:00005:state-store")
    );
    // A client clock behind: the server clock wins.
    let behind = client_ts(T0 - 10_000);
    h.advance(40_000);
    let outcome = h.send_with("c", &[b"SET", b"k", b"4"], Some(&behind), None);
    assert_eq!(
        outcome.reply.version.map(|v| v.to_string()).as_deref(),
        Some("001696374465000:00000:state-store")
    );
}

#[test]
fn nx_sets_only_absent_keys() {
    let mut h = Harness::new();
    assert_eq!(
        h.reply("c", &[b"SET", b"k", b"v", b"NX"]),
        (b"+OK\r\n".to_vec(), ts(V1))
    );
    // Refused: `:-1` carrying the current version.
    assert_eq!(
        h.reply("c", &[b"SET", b"k", b"v", b"NX"]),
        (b":-1\r\n".to_vec(), ts(V1))
    );
    assert_eq!(
        h.reply("c", &[b"SET", b"k", b"w", b"NX"]),
        (b":-1\r\n".to_vec(), ts(V1))
    );
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$1\r\nv\r\n");
}

#[test]
fn nex_lease_take_renew_and_race() {
    let mut h = Harness::new();
    let take = h.send(
        "holder1",
        &[b"SET", b"lock", b"holder1", b"NEX", b"PX", b"10000"],
    );
    assert_eq!(&take.reply.payload[..], b"+OK\r\n");
    assert_eq!(
        take.effects,
        vec![Effect::ArmExpiry {
            key: Bytes::from_static(b"lock"),
            at_ms: T0 + 10_000
        }]
    );
    // The other racer loses with the holder's version.
    assert_eq!(
        h.reply(
            "holder2",
            &[b"SET", b"lock", b"holder2", b"NEX", b"PX", b"10000"]
        ),
        (b":-1\r\n".to_vec(), ts(V1))
    );
    // Renewal 2 s later: new version with a later wall clock, same node, refreshed PX.
    h.advance(2_000);
    let renew = h.send(
        "holder1",
        &[b"SET", b"lock", b"holder1", b"NEX", b"PX", b"10000"],
    );
    assert_eq!(&renew.reply.payload[..], b"+OK\r\n");
    assert_eq!(
        renew.reply.version.map(|v| v.to_string()).as_deref(),
        Some("001696374427001:00000:state-store")
    );
    assert_eq!(h.machine.next_expiry().unwrap(), Some(T0 + 12_000));
    h.advance(9_000);
    assert_eq!(h.reply("c", &[b"GET", b"lock"]).0, b"$7\r\nholder1\r\n");
}

#[test]
fn set_without_px_clears_expiry() {
    let mut h = Harness::new();
    h.send("c", &[b"SET", b"k", b"v", b"PX", b"100"]);
    let outcome = h.send("c", &[b"SET", b"k", b"v"]);
    assert!(outcome.effects.is_empty());
    assert_eq!(h.machine.next_expiry().unwrap(), None);
    h.advance(1_000);
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$1\r\nv\r\n");
}

#[test]
fn del_responses() {
    let mut h = Harness::new();
    assert_eq!(h.reply("c", &[b"DEL", b"k"]), (b":0\r\n".to_vec(), None));
    h.send("c", &[b"SET", b"k", b"v"]);
    assert_eq!(h.reply("c", &[b"DEL", b"k"]), (b":1\r\n".to_vec(), ts(V2)));
    assert_eq!(h.reply("c", &[b"GET", b"k"]), (b"$-1\r\n".to_vec(), None));
    assert_eq!(h.reply("c", &[b"DEL", b"k"]), (b":0\r\n".to_vec(), None));
}

#[test]
fn del_needs_no_timestamp() {
    let mut h = Harness::new();
    h.send("c", &[b"SET", b"k", b"v"]);
    let outcome = h.send_with("c", &[b"DEL", b"k"], None, None);
    assert_eq!(&outcome.reply.payload[..], b":1\r\n");
}

#[test]
fn vdel_responses() {
    let mut h = Harness::new();
    assert_eq!(
        h.reply("c", &[b"VDEL", b"k", b"v"]),
        (b":0\r\n".to_vec(), None)
    );
    h.send("c", &[b"SET", b"k", b"v"]);
    assert_eq!(
        h.reply("c", &[b"VDEL", b"k", b"other"]),
        (b":-1\r\n".to_vec(), ts(V1))
    );
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$1\r\nv\r\n");
    assert_eq!(
        h.reply("c", &[b"VDEL", b"k", b"v"]),
        (b":1\r\n".to_vec(), ts(V2))
    );
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$-1\r\n");
}

#[test]
fn keynotify_responses() {
    let mut h = Harness::new();
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"k", b"STOP"]),
        (b":0\r\n".to_vec(), None)
    );
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"k"]),
        (b"+OK\r\n".to_vec(), None)
    );
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"k"]),
        (b"+OK\r\n".to_vec(), None)
    );
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"k", b"STOP"]),
        (b"+OK\r\n".to_vec(), None)
    );
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"k", b"STOP"]),
        (b":0\r\n".to_vec(), None)
    );
}

#[test]
fn scan_single_page() {
    let mut h = Harness::new();
    for key in [&b"key1"[..], b"key2", b"other", b"key10"] {
        h.send("c", &[b"SET", key, b"v"]);
    }
    assert_eq!(
        h.reply("c", &[b"SCAN", b"key*"]),
        (
            b"*1\r\n*3\r\n$4\r\nkey1\r\n$5\r\nkey10\r\n$4\r\nkey2\r\n".to_vec(),
            None
        )
    );
    assert_eq!(
        h.reply("c", &[b"SCAN", b"key[0-9]"]).0,
        b"*1\r\n*2\r\n$4\r\nkey1\r\n$4\r\nkey2\r\n"
    );
    assert_eq!(h.reply("c", &[b"SCAN", b"nomatch*"]).0, b"*1\r\n*0\r\n");
}

#[test]
fn scan_pages_until_no_token() {
    let mut h = Harness::with_config(Config {
        scan_count: 2,
        ..Config::default()
    });
    for key in [&b"a1"[..], b"a2", b"b1", b"a3", b"b2"] {
        h.send("c", &[b"SET", key, b"v"]);
    }
    // Keys in byte order: a1 a2 | a3 b1 | b2
    assert_eq!(
        h.reply("c", &[b"SCAN", b"a*"]).0,
        b"*2\r\n*2\r\n$2\r\na1\r\n$2\r\na2\r\n$2\r\na2\r\n"
    );
    assert_eq!(
        h.reply("c", &[b"SCAN", b"a*", b"a2"]).0,
        b"*2\r\n*1\r\n$2\r\na3\r\n$2\r\nb1\r\n"
    );
    assert_eq!(h.reply("c", &[b"SCAN", b"a*", b"b1"]).0, b"*1\r\n*0\r\n");
    // An empty token starts over.
    assert_eq!(
        h.reply("c", &[b"SCAN", b"b*", b""]).0,
        b"*2\r\n*0\r\n$2\r\na2\r\n"
    );
}

#[test]
fn lower_case_page_examples_work() {
    let mut h = Harness::new();
    let ts = client_ts(T0);
    let set = h.raw(common::request(
        "c",
        b"*3\r\n$3\r\nset\r\n$7\r\nSETKEY2\r\n$6\r\nVALUE5\r\n",
        Some(&ts),
        None,
    ));
    assert_eq!(&set.reply.payload[..], b"+OK\r\n");
    let get = h.raw(common::request(
        "c",
        b"*2\r\n$3\r\nget\r\n$7\r\nSETKEY2\r\n",
        None,
        None,
    ));
    assert_eq!(&get.reply.payload[..], b"$6\r\nVALUE5\r\n");
    let vdel = h.raw(common::request(
        "c",
        b"*3\r\n$4\r\nvdel\r\n$7\r\nSETKEY2\r\n$3\r\nABC\r\n",
        None,
        None,
    ));
    assert_eq!(&vdel.reply.payload[..], b":-1\r\n");
    let del = h.raw(common::request(
        "c",
        b"*2\r\n$3\r\ndel\r\n$7\r\nSETKEY2\r\n",
        None,
        None,
    ));
    assert_eq!(&del.reply.payload[..], b":1\r\n");
}

#[test]
fn reads_produce_no_effects() {
    let mut h = Harness::new();
    h.send("o", &[b"KEYNOTIFY", b"k"]);
    h.send("c", &[b"SET", b"k", b"v"]);
    for args in [
        &[&b"GET"[..], b"k"][..],
        &[b"SCAN", b"*"],
        &[b"KEYNOTIFY", b"k"],
        &[b"DEL", b"missing"],
    ] {
        assert!(notifies(&h.send("c", args).effects).is_empty());
    }
}
