//! The engine while its store waits for disk space (a full disk, injected with the
//! storage crate's `fault-injection` feature): client writes refused before they change
//! anything, reads of durable data answered without a wait, reads of a waiting write
//! waiting with it, expiry going on; and everything back once there is room.

use std::time::{Duration, Instant};

use bytes::Bytes;
use statehub_state_store::{AllowAll, Config, Effect, Machine, Outcome, Request};
use statehub_state_store_durable::{is_no_space, DurableEngine};
use statehub_storage::{Options, Store};

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

fn waits(outcome: &Outcome) -> Option<u64> {
    match outcome.effects.first() {
        Some(Effect::AwaitDurable(seq)) => Some(*seq),
        _ => None,
    }
}

fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_full_disk_refuses_writes_answers_durable_reads_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let engine = DurableEngine::open(&store).unwrap();
    let mut machine = Machine::new(engine, AllowAll, Config::default()).unwrap();
    let now = 1_000;
    let set = |m: &mut Machine<DurableEngine>, key: &[u8], px: Option<&[u8]>| {
        let mut args: Vec<&[u8]> = vec![b"SET", key, b"v"];
        if let Some(px) = px {
            args.extend([&b"PX"[..], px]);
        }
        m.handle(request(&args, Some(now)), now)
    };
    let durable = set(&mut machine, b"durable", None).unwrap();
    store.ticket(waits(&durable).unwrap()).wait().unwrap();
    let expiring = set(&mut machine, b"expiring", Some(b"50")).unwrap();
    store.ticket(waits(&expiring).unwrap()).wait().unwrap();

    store.set_disk_full(true);
    // Written as the disk filled: it waits, and so does any read of it.
    let waiting = set(&mut machine, b"waiting", None).unwrap();
    let seq = waits(&waiting).expect("a SET waits for its write");
    until("no stall reported", || store.stall_error().is_some());
    // The next client write is refused before it changes anything.
    let refused = set(&mut machine, b"refused", None).unwrap_err();
    assert!(is_no_space(&refused), "{refused}");
    let get = |m: &mut Machine<DurableEngine>, key: &[u8]| {
        m.handle(request(&[b"GET", key], None), now).unwrap()
    };
    let absent = get(&mut machine, b"refused");
    assert_eq!(absent.reply.payload, Bytes::from_static(b"$-1\r\n"));
    // The first request after the stall began is not watched: it waits, to be safe.
    // From then on, reads of durable data are answered at once.
    let _ = get(&mut machine, b"durable");
    let read = get(&mut machine, b"durable");
    assert_eq!(read.reply.payload, Bytes::from_static(b"$1\r\nv\r\n"));
    assert_eq!(waits(&read), None, "a read of durable data waits");
    let read = get(&mut machine, b"waiting");
    assert_eq!(
        waits(&read),
        Some(seq),
        "a read of a waiting write must wait"
    );
    let scan = machine
        .handle(request(&[b"SCAN", b"0"], None), now)
        .unwrap();
    assert!(waits(&scan).is_some(), "a scan may reveal a waiting write");
    // Expiry goes on: the key that expired is removed, not refused.
    let later = now + 100;
    let effects = machine.expire(later).unwrap();
    assert!(effects.iter().all(|e| !matches!(e, Effect::Notify(_))));
    let gone = machine
        .handle(request(&[b"GET", b"expiring"], None), later)
        .unwrap();
    assert_eq!(gone.reply.payload, Bytes::from_static(b"$-1\r\n"));

    store.set_disk_full(false);
    store.ticket(seq).wait().unwrap();
    until("the stall did not end", || store.stall_error().is_none());
    let again = set(&mut machine, b"refused", None).unwrap();
    store.ticket(waits(&again).unwrap()).wait().unwrap();
    let read = get(&mut machine, b"durable");
    assert_eq!(waits(&read), None);
    drop(machine);
    store.close().unwrap();
    drop(store);
    // Reopened: everything acknowledged, nothing refused.
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let engine = DurableEngine::open(&store).unwrap();
    let mut machine = Machine::new(engine, AllowAll, Config::default()).unwrap();
    for key in [&b"durable"[..], b"waiting", b"refused"] {
        let read = get(&mut machine, key);
        assert_eq!(
            read.reply.payload,
            Bytes::from_static(b"$1\r\nv\r\n"),
            "{key:?}"
        );
    }
}
