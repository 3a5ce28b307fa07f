//! The machine over the persistent engine, with an injected clock: what a reply waits
//! for, and versions that stay above everything issued before a restart even when the
//! wall clock goes back.

use bytes::Bytes;
use statehub_state_store::{AllowAll, Config, Effect, Engine, Machine, Outcome, Request};
use statehub_state_store_durable::DurableEngine;
use statehub_storage::{Options, Store};

/// A request from the client "client". Its `__ts` string is leaked: a few bytes per
/// request, and the tests stay one call per request.
fn request(args: &[&[u8]], ts_ms: Option<u64>) -> Request<'static> {
    let mut payload = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        payload.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        payload.extend_from_slice(a);
        payload.extend_from_slice(b"\r\n");
    }
    Request {
        client_id: "client",
        payload: Bytes::from(payload),
        timestamp: ts_ms.map(|ms| &*format!("{ms:015}:00000:client").leak()),
        fencing_token: None,
        access: None,
    }
}

fn open(dir: &std::path::Path) -> (Store, Machine<DurableEngine, AllowAll>) {
    let store = Store::open(dir, Options::default()).unwrap();
    let engine = DurableEngine::open(&store).unwrap();
    (
        store.clone(),
        Machine::new(engine, AllowAll, Config::default()).unwrap(),
    )
}

/// Waits for the outcome's writes, as the shell does; returns the reply's version.
fn settle(store: &Store, outcome: &Outcome) -> Option<String> {
    if let Some(Effect::AwaitDurable(seq)) = outcome.effects.first() {
        store.ticket(*seq).wait().unwrap();
    }
    outcome.reply.version.as_ref().map(ToString::to_string)
}

#[test]
fn writes_wait_for_durability_and_reads_only_while_one_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut machine) = open(dir.path());
    let set = machine
        .handle(request(&[b"SET", b"k", b"v"], Some(1_000)), 1_000)
        .unwrap();
    let Some(Effect::AwaitDurable(seq)) = set.effects.first() else {
        panic!("a SET must wait for durability: {:?}", set.effects);
    };
    let get = machine
        .handle(request(&[b"GET", b"k"], None), 1_000)
        .unwrap();
    if !store.ticket(*seq).is_durable() {
        assert_eq!(
            get.effects.first(),
            Some(&Effect::AwaitDurable(*seq)),
            "a GET revealing an in-flight SET must wait for it"
        );
    }
    store.ticket(*seq).wait().unwrap();
    let get = machine
        .handle(request(&[b"GET", b"k"], None), 1_000)
        .unwrap();
    assert!(
        get.effects.is_empty(),
        "nothing in flight, nothing to wait for: {:?}",
        get.effects
    );
    let refused = machine
        .handle(
            request(&[b"SET", &vec![b'k'; 70_000], b"v"], Some(1_000)),
            1_000,
        )
        .unwrap();
    assert_eq!(
        refused.reply.payload,
        Bytes::from_static(b"-ERR the quota has been exceeded\r\n")
    );
}

#[test]
fn versions_stay_above_everything_issued_when_the_clock_goes_back() {
    let dir = tempfile::tempdir().unwrap();
    let far = 2_000_000_000_000; // 2033
    let deleted = {
        let (store, mut machine) = open(dir.path());
        let set = machine
            .handle(request(&[b"SET", b"k", b"v"], Some(far)), far)
            .unwrap();
        settle(&store, &set).unwrap();
        let del = machine.handle(request(&[b"DEL", b"k"], None), far).unwrap();
        let deleted = settle(&store, &del).unwrap();
        drop(machine);
        store.close().unwrap();
        deleted
    };
    let (store, mut machine) = open(dir.path());
    let now = 1_000; // the wall clock went back 63 years
    let set = machine
        .handle(request(&[b"SET", b"other", b"v"], Some(now)), now)
        .unwrap();
    let version = settle(&store, &set).unwrap();
    assert!(version > deleted, "{version} issued after {deleted}");
}

#[test]
fn keys_that_expired_while_down_are_removed_at_start_without_notifications() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, mut machine) = open(dir.path());
        let set = machine
            .handle(
                request(&[b"SET", b"lease", b"me", b"PX", b"100"], Some(5_000)),
                5_000,
            )
            .unwrap();
        settle(&store, &set);
        let watch = machine
            .handle(request(&[b"KEYNOTIFY", b"lease"], None), 5_000)
            .unwrap();
        assert!(watch.effects.is_empty());
        drop(machine);
        store.close().unwrap();
    }
    {
        let (store, mut machine) = open(dir.path());
        let effects = machine.expire(60_000).unwrap();
        assert!(
            effects.iter().all(|e| !matches!(e, Effect::Notify(_))),
            "{effects:?}"
        );
        if let Some(Effect::AwaitDurable(seq)) = effects.first() {
            store.ticket(*seq).wait().unwrap();
        }
        let get = machine
            .handle(request(&[b"GET", b"lease"], None), 60_000)
            .unwrap();
        assert_eq!(get.reply.payload, Bytes::from_static(b"$-1\r\n"));
    }
    let (_store, machine) = open(dir.path());
    assert_eq!(
        machine.engine().stats().keys,
        0,
        "the removal at start was persisted"
    );
}
