//! Every `-ERR` reply, byte for byte: timestamps, fencing, quotas, authorization.

mod common;

use common::{client_ts, request, resp, Harness, T0};
use statehub_state_store::{AllowAll, Config, Machine, MemoryEngine, Operation};

fn err(text: &str) -> Vec<u8> {
    format!("-ERR {text}\r\n").into_bytes()
}

const SKEW: &str = "the request timestamp is too far in the future; ensure that the client and broker system clocks are synchronized";
const FT_REQUIRED: &str = "a fencing token is required for this request";
const FT_SKEW: &str = "the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized";
const FT_LOWER: &str =
    "the request fencing token is a lower version than the fencing token protecting the resource";

fn payload_of(h: &mut Harness, args: &[&[u8]], ts: Option<&str>, ft: Option<&str>) -> Vec<u8> {
    let outcome = h.send_with("c", args, ts, ft);
    assert_eq!(outcome.reply.version, None, "errors carry no __ts");
    outcome.reply.payload.to_vec()
}

#[test]
fn payload_errors() {
    let mut h = Harness::new();
    let ts = client_ts(T0);
    let cases: &[(&[u8], &str)] = &[
        (b"garbage", "syntax error"),
        (b"*2\r\n$4\r\nPING\r\n$1\r\nk\r\n", "unknown command"),
        (b"*1\r\n$3\r\nGET\r\n", "wrong number of arguments"),
        (b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n", "the key length is zero"),
        (
            b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nXX\r\n",
            "syntax error",
        ),
    ];
    for (payload, text) in cases {
        let outcome = h.raw(request("c", payload, Some(&ts), None));
        assert_eq!(outcome.reply.payload.to_vec(), err(text));
        assert_eq!(outcome.reply.version, None);
    }
}

#[test]
fn payload_errors_come_before_timestamp_errors() {
    let mut h = Harness::new();
    let outcome = h.raw(request("c", b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n", None, None));
    assert_eq!(
        outcome.reply.payload.to_vec(),
        err("wrong number of arguments")
    );
}

#[test]
fn set_requires_a_timestamp() {
    let mut h = Harness::new();
    assert_eq!(
        payload_of(&mut h, &[b"SET", b"k", b"v"], None, None),
        err("missing timestamp")
    );
    assert_eq!(h.reply("c", &[b"GET", b"k"]).0, b"$-1\r\n");
}

#[test]
fn malformed_timestamps_and_tokens() {
    let mut h = Harness::new();
    let good = client_ts(T0);
    for bad in ["", "nope", "1:2", "1:2:3:4", "x:0:c"] {
        assert_eq!(
            payload_of(&mut h, &[b"SET", b"k", b"v"], Some(bad), None),
            err("malformed timestamp")
        );
        assert_eq!(
            payload_of(&mut h, &[b"GET", b"k"], Some(bad), None),
            err("malformed timestamp")
        );
        assert_eq!(
            payload_of(&mut h, &[b"SET", b"k", b"v"], Some(&good), Some(bad)),
            err("malformed timestamp")
        );
        assert_eq!(
            payload_of(&mut h, &[b"DEL", b"k"], None, Some(bad)),
            err("malformed timestamp")
        );
    }
}

#[test]
fn timestamp_skew_limit() {
    let mut h = Harness::new();
    let at_limit = client_ts(T0 + 60_000);
    let past_limit = client_ts(T0 + 60_001);
    assert_eq!(
        payload_of(&mut h, &[b"SET", b"k", b"v"], Some(&past_limit), None),
        err(SKEW)
    );
    assert_eq!(
        payload_of(&mut h, &[b"GET", b"k"], Some(&past_limit), None),
        err(SKEW)
    );
    assert_eq!(
        h.send_with("c", &[b"SET", b"k", b"v"], Some(&at_limit), None)
            .reply
            .payload
            .to_vec(),
        b"+OK\r\n"
    );
    // A clock far behind is fine.
    assert_eq!(
        h.send_with("c", &[b"SET", b"k", b"v"], Some("0:0:c"), None)
            .reply
            .payload
            .to_vec(),
        b"+OK\r\n"
    );
}

#[test]
fn fencing_token_skew_limit() {
    let mut h = Harness::new();
    let ts = client_ts(T0);
    let ft = format!("{:015}:00000:state-store", T0 + 60_001);
    assert_eq!(
        payload_of(&mut h, &[b"SET", b"k", b"v"], Some(&ts), Some(&ft)),
        err(FT_SKEW)
    );
    // The timestamp is checked first.
    let bad_ts = client_ts(T0 + 70_000);
    assert_eq!(
        payload_of(&mut h, &[b"SET", b"k", b"v"], Some(&bad_ts), Some(&ft)),
        err(SKEW)
    );
}

#[test]
fn fencing_page_algorithm() {
    let mut h = Harness::new();
    let ts = client_ts(T0);
    // Take the lock; its version is the token.
    let lock = h.send(
        "c1",
        &[b"SET", b"LockName", b"Client1", b"NEX", b"PX", b"10000"],
    );
    let token = lock.reply.version.expect("version").to_string();
    // An unfenced key accepts a token and stores it.
    let first = h.send_with(
        "c1",
        &[b"SET", b"ProtectedKey", b"1"],
        Some(&ts),
        Some(&token),
    );
    assert_eq!(&first.reply.payload[..], b"+OK\r\n");
    // Now SET without a token is refused, nothing changes.
    assert_eq!(
        payload_of(&mut h, &[b"SET", b"ProtectedKey", b"2"], Some(&ts), None),
        err(FT_REQUIRED)
    );
    // A lower token is refused.
    let lower = format!("{:015}:00000:state-store", T0 - 1);
    assert_eq!(
        payload_of(
            &mut h,
            &[b"SET", b"ProtectedKey", b"2"],
            Some(&ts),
            Some(&lower)
        ),
        err(FT_LOWER)
    );
    assert_eq!(h.reply("c", &[b"GET", b"ProtectedKey"]).0, b"$1\r\n1\r\n");
    // Equal is accepted; a higher one replaces the stored token.
    let equal = h.send_with(
        "c1",
        &[b"SET", b"ProtectedKey", b"3"],
        Some(&ts),
        Some(&token),
    );
    assert_eq!(&equal.reply.payload[..], b"+OK\r\n");
    let higher = format!("{:015}:00000:state-store", T0 + 5);
    let outcome = h.send_with(
        "c1",
        &[b"SET", b"ProtectedKey", b"4"],
        Some(&ts),
        Some(&higher),
    );
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    assert_eq!(
        payload_of(
            &mut h,
            &[b"SET", b"ProtectedKey", b"5"],
            Some(&ts),
            Some(&token)
        ),
        err(FT_LOWER)
    );
    // GET needs no token.
    assert_eq!(h.reply("c", &[b"GET", b"ProtectedKey"]).0, b"$1\r\n4\r\n");
}

#[test]
fn fenced_deletes() {
    let mut h = Harness::new();
    let ts = client_ts(T0);
    let token = format!("{T0:015}:00003:state-store");
    let lower = format!("{T0:015}:00002:state-store");
    h.send_with("c", &[b"SET", b"k", b"v"], Some(&ts), Some(&token));
    assert_eq!(
        payload_of(&mut h, &[b"DEL", b"k"], None, None),
        err(FT_REQUIRED)
    );
    assert_eq!(
        payload_of(&mut h, &[b"VDEL", b"k", b"v"], None, None),
        err(FT_REQUIRED)
    );
    assert_eq!(
        payload_of(&mut h, &[b"DEL", b"k"], None, Some(&lower)),
        err(FT_LOWER)
    );
    assert_eq!(
        payload_of(&mut h, &[b"VDEL", b"k", b"v"], None, Some(&lower)),
        err(FT_LOWER)
    );
    // The fence is checked before the value comparison.
    assert_eq!(
        payload_of(&mut h, &[b"VDEL", b"k", b"other"], None, None),
        err(FT_REQUIRED)
    );
    assert_eq!(
        h.send_with("c", &[b"VDEL", b"k", b"v"], None, Some(&token))
            .reply
            .payload
            .to_vec(),
        b":1\r\n"
    );
    // The token went away with the key.
    assert_eq!(
        h.send_with("c", &[b"SET", b"k", b"v"], Some(&ts), None)
            .reply
            .payload
            .to_vec(),
        b"+OK\r\n"
    );
    assert_eq!(
        h.send_with("c", &[b"DEL", b"k"], None, None)
            .reply
            .payload
            .to_vec(),
        b":1\r\n"
    );
}

#[test]
fn key_count_quota() {
    let mut h = Harness::with_config(Config {
        max_keys: 2,
        ..Config::default()
    });
    h.send("c", &[b"SET", b"a", b"1"]);
    h.send("c", &[b"SET", b"b", b"1"]);
    assert_eq!(
        h.reply("c", &[b"SET", b"c", b"1"]),
        (err("the quota has been exceeded"), None)
    );
    // Overwriting an existing key adds no key.
    assert_eq!(h.reply("c", &[b"SET", b"a", b"2"]).0, b"+OK\r\n");
    // A failed condition answers before the quota.
    assert_eq!(h.reply("c", &[b"SET", b"a", b"2", b"NX"]).0, b":-1\r\n");
    h.send("c", &[b"DEL", b"b"]);
    assert_eq!(h.reply("c", &[b"SET", b"c", b"1"]).0, b"+OK\r\n");
}

#[test]
fn byte_quota() {
    let mut h = Harness::with_config(Config {
        max_bytes: 10,
        ..Config::default()
    });
    assert_eq!(h.reply("c", &[b"SET", b"k", b"123456789"]).0, b"+OK\r\n");
    assert_eq!(
        h.reply("c", &[b"SET", b"k", b"1234567890"]).0,
        err("the quota has been exceeded")
    );
    assert_eq!(
        h.reply("c", &[b"SET", b"x", b""]).0,
        err("the quota has been exceeded")
    );
    // Shrinking is always allowed.
    assert_eq!(h.reply("c", &[b"SET", b"k", b"1"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"SET", b"x", b"1234567"]).0, b"+OK\r\n");
}

#[test]
fn observation_quota() {
    let mut h = Harness::with_config(Config {
        max_observations_per_client: 1,
        ..Config::default()
    });
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"a"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"a"]).0, b"+OK\r\n");
    assert_eq!(
        h.reply("c", &[b"KEYNOTIFY", b"b"]).0,
        err("the quota has been exceeded")
    );
    assert_eq!(h.reply("other", &[b"KEYNOTIFY", b"b"]).0, b"+OK\r\n");
}

fn only_public(client: &str, key: &[u8], op: Operation) -> bool {
    client == "admin"
        || key.starts_with(b"public/")
        || (op == Operation::Get && key.starts_with(b"ro/"))
}

#[test]
fn authorization_hook() {
    let mut machine =
        Machine::new(MemoryEngine::new(), only_public, Config::default()).expect("memory");
    for (client, args, expected) in [
        (
            "c",
            &[&b"SET"[..], b"secret", b"v"][..],
            err("not authorized"),
        ),
        ("admin", &[b"SET", b"secret", b"v"], b"+OK\r\n".to_vec()),
        ("admin", &[b"SET", b"ro/x", b"v"], b"+OK\r\n".to_vec()),
        ("c", &[b"GET", b"secret"], err("not authorized")),
        ("c", &[b"GET", b"ro/x"], b"$1\r\nv\r\n".to_vec()),
        ("c", &[b"SET", b"ro/x", b"w"], err("not authorized")),
        ("c", &[b"DEL", b"secret"], err("not authorized")),
        ("c", &[b"VDEL", b"secret", b"v"], err("not authorized")),
        ("c", &[b"KEYNOTIFY", b"secret"], err("not authorized")),
        ("c", &[b"SET", b"public/a", b"v"], b"+OK\r\n".to_vec()),
        // SCAN leaves out what the client may not see.
        (
            "c",
            &[b"SCAN", b"*"],
            b"*1\r\n*1\r\n$8\r\npublic/a\r\n".to_vec(),
        ),
        (
            "admin",
            &[b"SCAN", b"*"],
            b"*1\r\n*3\r\n$8\r\npublic/a\r\n$4\r\nro/x\r\n$6\r\nsecret\r\n".to_vec(),
        ),
    ] {
        let ts = client_ts(T0);
        let outcome = machine
            .handle(request(client, &resp(args), Some(&ts), None), T0)
            .expect("memory");
        assert_eq!(
            outcome.reply.payload.to_vec(),
            expected,
            "{client} {args:?}"
        );
    }
}

#[test]
fn allow_all_allows() {
    let mut machine =
        Machine::new(MemoryEngine::new(), AllowAll, Config::default()).expect("memory");
    let ts = client_ts(T0);
    let outcome = machine
        .handle(
            request("c", &resp(&[b"SET", b"k", b"v"]), Some(&ts), None),
            T0,
        )
        .expect("memory");
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
}

/// A request's own grants are asked as well as the machine's authorizer: a denied key
/// is `not authorized`, and SCAN leaves out the keys they deny.
#[test]
fn the_requester_access_is_asked_too() {
    let mut machine =
        Machine::new(MemoryEngine::new(), AllowAll, Config::default()).expect("memory");
    let ts = client_ts(T0);
    for key in [&b"mine/a"[..], b"theirs/b"] {
        let set = request("w", &resp(&[b"SET", key, b"v"]), Some(&ts), None);
        machine.handle(set, T0).expect("memory");
    }
    let grants = |_: &str, key: &[u8], op: Operation| {
        key.starts_with(b"mine/") && (op == Operation::Get || op == Operation::Scan)
    };
    for (args, expected) in [
        (&[&b"GET"[..], b"mine/a"][..], b"$1\r\nv\r\n".to_vec()),
        (&[b"GET", b"theirs/b"], err("not authorized")),
        (&[b"SET", b"mine/a", b"w"], err("not authorized")),
        (&[b"SCAN", b"*"], b"*1\r\n*1\r\n$6\r\nmine/a\r\n".to_vec()),
    ] {
        let mut req = request("c", &resp(args), Some(&ts), None);
        req.access = Some(&grants);
        let outcome = machine.handle(req, T0).expect("memory");
        assert_eq!(outcome.reply.payload.to_vec(), expected, "{args:?}");
    }
}
