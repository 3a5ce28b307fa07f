//! Round trips to Redis per request: the machine's sweep of due keys rides in the
//! request's own script, so a SET, a GET, a DEL and a VDEL are one round trip each, and
//! a due key is still removed, versioned and fed before the request is answered.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{fresh_namespace, machine, request, ts, T0};
use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::{AllowAll, Config, Effect, Engine, Machine};
use statehub_state_store_redis::{Counters, RedisEngine};

type Node = Machine<RedisEngine, AllowAll>;

/// Runs one request at `now` and returns its reply payload and how many calls to Redis
/// it made.
fn run(node: &mut Node, counters: &Arc<Counters>, args: &[&[u8]], now: u64) -> (Vec<u8>, u64) {
    let before = counters.calls.load(Ordering::Relaxed);
    let stamp = ts(now, 0);
    let outcome = node
        .handle(request("client", args, Some(&stamp), None), now)
        .expect("request");
    let calls = counters.calls.load(Ordering::Relaxed) - before;
    (outcome.reply.payload.to_vec(), calls)
}

#[test]
fn set_get_del_vdel_are_one_round_trip_each() {
    let server = RedisServer::start();
    let ns = fresh_namespace("round-trips");
    let mut node = machine(&server, &ns, "a", Config::default());
    let counters = node.engine().counters();
    let requests: [&[&[u8]]; 6] = [
        &[b"SET", b"k", b"v"],
        &[b"GET", b"k"],
        &[b"SET", b"k", b"v", b"NX"],
        &[b"VDEL", b"k", b"other"],
        &[b"DEL", b"k"],
        &[b"GET", b"k"],
    ];
    for (i, args) in requests.iter().enumerate() {
        let (_, calls) = run(&mut node, &counters, args, T0 + i as u64);
        assert_eq!(calls, 1, "{args:?}: one round trip, the sweep included");
    }
}

#[test]
fn a_due_key_is_swept_by_the_next_write_in_its_one_round_trip() {
    let server = RedisServer::start();
    let ns = fresh_namespace("round-trips-sweep");
    let mut node = machine(&server, &ns, "a", Config::default());
    let counters = node.engine().counters();
    let stamp = ts(T0, 0);
    node.handle(
        request("observer", &[b"KEYNOTIFY", b"lease"], Some(&stamp), None),
        T0,
    )
    .expect("KEYNOTIFY");
    run(
        &mut node,
        &counters,
        &[b"SET", b"lease", b"holder", b"PX", b"10"],
        T0,
    );
    // A SET of another key, once `lease` is due: its script removes `lease` first.
    let before = counters.calls.load(Ordering::Relaxed);
    let stamp = ts(T0 + 20, 0);
    let outcome = node
        .handle(
            request("client", &[b"SET", b"other", b"v"], Some(&stamp), None),
            T0 + 20,
        )
        .expect("SET");
    assert_eq!(counters.calls.load(Ordering::Relaxed) - before, 1);
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    assert!(
        matches!(outcome.effects.first(), Some(Effect::AwaitDurable(_))),
        "the reply waits for the feed to carry the removal: {:?}",
        outcome.effects
    );
    assert_eq!(node.engine().stats().keys, 1, "lease removed");
    assert!(node.next_expiry().expect("next expiry").is_none());
}

#[test]
fn a_get_sweeps_a_due_key_and_a_refused_request_at_its_seal() {
    let server = RedisServer::start();
    let ns = fresh_namespace("round-trips-get");
    let mut node = machine(&server, &ns, "a", Config::default());
    let counters = node.engine().counters();
    run(
        &mut node,
        &counters,
        &[b"SET", b"a", b"v", b"PX", b"10"],
        T0,
    );
    run(
        &mut node,
        &counters,
        &[b"SET", b"b", b"v", b"PX", b"10"],
        T0,
    );
    // Due: the GET's read sees it and a script sweeps and reads again.
    let (reply, calls) = run(&mut node, &counters, &[b"GET", b"a"], T0 + 20);
    assert_eq!(&reply[..], b"$-1\r\n", "due, so absent");
    assert_eq!(calls, 2);
    assert_eq!(node.engine().stats().keys, 0, "both swept");
    // A request the engine never sees (refused before it) sweeps at its seal.
    run(
        &mut node,
        &counters,
        &[b"SET", b"c", b"v", b"PX", b"10"],
        T0 + 30,
    );
    let (reply, calls) = run(&mut node, &counters, &[b"NOSUCH"], T0 + 50);
    assert!(reply.starts_with(b"-ERR"), "{reply:?}");
    assert_eq!(calls, 1, "the sweep on its own");
    assert_eq!(node.engine().stats().keys, 0, "c swept");
}

#[test]
fn a_run_ending_with_a_refused_request_answers_it_as_alone() {
    let server = RedisServer::start();
    let ns = fresh_namespace("round-trips-refused");
    let mut node = machine(&server, &ns, "a", Config::default());
    let counters = node.engine().counters();
    // Connected, the scripts loaded.
    run(&mut node, &counters, &[b"SET", b"warm", b"v"], T0);
    let stamp = ts(T0, 0);
    let ok = request("client", &[b"SET", b"k", b"v"], Some(&stamp), None);
    let refused = request("client", &[b"SET", b"k2", b"v"], None, None);
    let begun = [ok, refused].map(|r| node.begin(&r, T0).expect("begin").expect("begun"));
    let replies: Vec<Vec<u8>> = node
        .finish(begun.into())
        .into_iter()
        .map(|o| o.expect("answered").reply.payload.to_vec())
        .collect();
    let alone = node
        .handle(request("client", &[b"SET", b"k3", b"v"], None, None), T0)
        .expect("alone")
        .reply
        .payload
        .to_vec();
    assert_eq!(replies, [b"+OK\r\n".to_vec(), alone]);
}

#[test]
fn a_run_after_a_script_flush_loads_the_scripts_again_and_succeeds() {
    let server = RedisServer::start();
    let ns = fresh_namespace("round-trips-flush");
    let mut node = machine(&server, &ns, "a", Config::default());
    let stamp = ts(T0, 0);
    let run = |node: &mut Node, keys: [&str; 3]| -> Vec<Vec<u8>> {
        let begun: Vec<_> = keys
            .iter()
            .map(|key| {
                let set = request(
                    "client",
                    &[b"SET", key.as_bytes(), b"v"],
                    Some(&stamp),
                    None,
                );
                node.begin(&set, T0).expect("begin").expect("begun")
            })
            .collect();
        node.finish(begun)
            .into_iter()
            .map(|o| o.expect("answered, not 503").reply.payload.to_vec())
            .collect()
    };
    // The scripts loaded on the connection by a first run.
    assert_eq!(
        run(&mut node, ["a", "b", "c"]),
        vec![b"+OK\r\n".to_vec(); 3]
    );
    server.command(&["SCRIPT", "FLUSH"]);
    assert_eq!(
        run(&mut node, ["d", "e", "f"]),
        vec![b"+OK\r\n".to_vec(); 3]
    );
}
