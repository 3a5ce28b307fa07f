//! Several nodes (machines) on one Redis: versions, contention, expiry, notifications
//! across nodes, and Redis going away and coming back.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use common::{fresh_namespace, machine, options, request, ts, T0};
use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::{AllowAll, Change, Config, Effect, Hlc, Machine};
use statehub_state_store_redis::RedisEngine;

type Node = Machine<RedisEngine, AllowAll>;

fn set(node: &mut Node, key: &str, value: &str, now: u64, extra: &[&[u8]]) -> (Vec<u8>, Hlc) {
    let stamp = ts(now, 0);
    let mut args: Vec<&[u8]> = vec![b"SET", key.as_bytes(), value.as_bytes()];
    args.extend_from_slice(extra);
    let outcome = node
        .handle(request("writer", &args, Some(&stamp), None), now)
        .expect("SET");
    (
        outcome.reply.payload.to_vec(),
        outcome.reply.version.expect("a version"),
    )
}

/// The feed of `namespace`, positioned now, running on a thread; changes come out of the
/// channel. Stops when the returned flag is set.
fn feed(server: &RedisServer, namespace: &str) -> (mpsc::Receiver<Change>, Arc<AtomicBool>) {
    let mut feed = RedisEngine::feed(&options(server, namespace, "reader")).expect("feed");
    feed.start().expect("position the feed");
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        feed.run(&flag, |change| {
            let _ = tx.send(change);
        });
    });
    (rx, stop)
}

const WAIT: Duration = Duration::from_secs(30);

#[test]
fn versions_strictly_increase_across_nodes_with_one_node_id() {
    let server = RedisServer::start();
    let ns = fresh_namespace("versions");
    let mut a = machine(&server, &ns, "a", Config::default());
    let mut b = machine(&server, &ns, "b", Config::default());
    let mut last: Option<Hlc> = None;
    for i in 0..50u64 {
        // Node b's wall clock runs 100 ms behind a's.
        let (_, version) = if i % 2 == 0 {
            set(&mut a, "k", "v", T0 + i, &[])
        } else {
            set(&mut b, "k", "v", T0 + i - 100, &[])
        };
        assert_eq!(&*version.node_id, "state-store");
        if let Some(last) = &last {
            assert!(version > *last, "{version} after {last}");
        }
        last = Some(version);
    }
}

#[test]
fn nx_contention_across_nodes_has_one_winner() {
    let server = RedisServer::start();
    let ns = fresh_namespace("nx");
    let url = server.url();
    let winners: Vec<Vec<bool>> = std::thread::scope(|scope| {
        let handles: Vec<_> = ["a", "b", "c"]
            .into_iter()
            .map(|node| {
                let ns = ns.clone();
                let server = &server;
                let _ = &url;
                scope.spawn(move || {
                    let mut m = machine(server, &ns, node, Config::default());
                    (0..40)
                        .map(|round| {
                            let key = format!("lock{round}");
                            let (reply, _) = set(&mut m, &key, node, T0 + round, &[b"NX"]);
                            reply == b"+OK\r\n"
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("node"))
            .collect()
    });
    for round in 0..40 {
        let won = winners.iter().filter(|w| w[round]).count();
        assert_eq!(won, 1, "round {round}: {won} winners");
    }
}

#[test]
fn keynotify_across_nodes_exactly_once_in_order() {
    let server = RedisServer::start();
    let ns = fresh_namespace("notify");
    let mut a = machine(&server, &ns, "a", Config::default());
    let mut b = machine(&server, &ns, "b", Config::default());
    let (changes, stop) = feed(&server, &ns);
    // A change before anyone observes is not fed.
    set(&mut a, "k", "before", T0, &[]);
    let stamp = ts(T0, 0);
    let reply = b
        .handle(
            request("observer", &[b"KEYNOTIFY", b"k"], Some(&stamp), None),
            T0,
        )
        .expect("KEYNOTIFY");
    assert_eq!(&reply.reply.payload[..], b"+OK\r\n");
    let (_, v1) = set(&mut a, "k", "one", T0 + 1, &[]);
    let (_, v2) = set(&mut b, "k", "two", T0 + 2, &[]);
    let del = a
        .handle(
            request("writer", &[b"DEL", b"k"], Some(&ts(T0 + 3, 0)), None),
            T0 + 3,
        )
        .expect("DEL");
    let v3 = del.reply.version.expect("a version");
    assert!(a
        .handle(
            request("writer", &[b"SET", b"other", b"x"], Some(&stamp), None),
            T0 + 3
        )
        .is_ok());
    // No node notifies as it writes: the feed does, for every node.
    assert!(del.effects.iter().all(|e| !matches!(e, Effect::Notify(_))));
    let mut got = Vec::new();
    while got.len() < 3 {
        let change = changes.recv_timeout(WAIT).expect("a change");
        for effect in b.apply_change(&change) {
            if let Effect::Notify(n) = effect {
                got.push((n.client_id, n.payload, n.version));
            }
        }
        // Node a has no observer: nothing to notify there.
        assert!(a.apply_change(&change).is_empty());
    }
    let payloads: Vec<&[u8]> = got.iter().map(|(_, p, _)| &p[..]).collect();
    assert_eq!(
        payloads,
        [
            &b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\none\r\n"[..],
            b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\ntwo\r\n",
            b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n",
        ]
    );
    let versions: Vec<&Hlc> = got.iter().map(|(_, _, v)| v).collect();
    assert_eq!(versions, [&v1, &v2, &v3]);
    assert!(got.iter().all(|(c, _, _)| c == "observer"));
    // Nothing more: each change once.
    assert!(changes.recv_timeout(Duration::from_millis(300)).is_err());
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn a_change_fed_before_an_observer_began_is_not_news_to_it() {
    let server = RedisServer::start();
    let ns = fresh_namespace("since");
    let mut a = machine(&server, &ns, "a", Config::default());
    let mut b = machine(&server, &ns, "b", Config::default());
    let (changes, stop) = feed(&server, &ns);
    let stamp = ts(T0, 0);
    let keynotify = |m: &mut Node, client: &str| {
        m.handle(
            request(client, &[b"KEYNOTIFY", b"k"], Some(&stamp), None),
            T0,
        )
        .expect("KEYNOTIFY")
    };
    keynotify(&mut a, "early");
    set(&mut a, "k", "one", T0 + 1, &[]);
    // b's client observes after the change was fed, before b read it.
    keynotify(&mut b, "late");
    let change = changes.recv_timeout(WAIT).expect("a change");
    assert!(
        b.apply_change(&change).is_empty(),
        "not news to a later observer"
    );
    assert_eq!(a.apply_change(&change).len(), 1);
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn an_expiry_is_removed_and_fed_once_whichever_nodes_race() {
    let server = RedisServer::start();
    let ns = fresh_namespace("expiry");
    let mut nodes: Vec<Node> = ["a", "b", "c"]
        .into_iter()
        .map(|n| machine(&server, &ns, n, Config::default()))
        .collect();
    let (changes, stop) = feed(&server, &ns);
    let stamp = ts(T0, 0);
    nodes[1]
        .handle(
            request("observer", &[b"KEYNOTIFY", b"lease"], Some(&stamp), None),
            T0,
        )
        .expect("KEYNOTIFY");
    set(&mut nodes[0], "lease", "holder", T0, &[b"PX", b"100"]);
    let written = changes.recv_timeout(WAIT).expect("the SET");
    assert_eq!(written.value.as_deref(), Some(&b"holder"[..]));
    let (mut notified, mut awaiting) = (0, 0);
    for node in &mut nodes {
        for effect in node.expire(T0 + 100).expect("expire") {
            match effect {
                Effect::Notify(_) => notified += 1,
                Effect::AwaitDurable(_) => awaiting += 1,
                Effect::ArmExpiry { .. } => {}
            }
        }
        assert!(node.next_expiry().expect("next expiry").is_none());
    }
    assert_eq!(
        notified, 0,
        "notifications come from the feed, not from expire"
    );
    assert_eq!(awaiting, 1, "the node that removed it waits for its feed");
    let change = changes.recv_timeout(WAIT).expect("the deletion");
    assert_eq!(change.value, None);
    assert_eq!(nodes[1].apply_change(&change).len(), 1);
    assert!(
        changes.recv_timeout(Duration::from_millis(300)).is_err(),
        "fed once"
    );
    stop.store(true, Ordering::Relaxed);
}

#[test]
fn redis_down_is_an_unavailable_error_and_service_resumes_when_it_returns() {
    let mut server = RedisServer::start();
    let ns = fresh_namespace("down");
    let mut a = machine(&server, &ns, "a", Config::default());
    let (changes, stop) = feed(&server, &ns);
    let stamp = ts(T0, 0);
    a.handle(
        request("observer", &[b"KEYNOTIFY", b"k"], Some(&stamp), None),
        T0,
    )
    .expect("KEYNOTIFY");
    set(&mut a, "k", "kept", T0, &[]);
    assert!(changes.recv_timeout(WAIT).is_ok());
    server.kill();
    for _ in 0..3 {
        let error = a
            .handle(
                request("writer", &[b"GET", b"k"], Some(&stamp), None),
                T0 + 1,
            )
            .expect_err("redis is down");
        assert!(error.is_unavailable(), "{error}");
    }
    server.restart();
    let get = loop {
        match a.handle(
            request("writer", &[b"GET", b"k"], Some(&stamp), None),
            T0 + 2,
        ) {
            Ok(outcome) => break outcome,
            // The first attempts may fall in the reconnect backoff.
            Err(e) if e.is_unavailable() => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        &get.reply.payload[..],
        b"$4\r\nkept\r\n",
        "acknowledged before the kill"
    );
    set(&mut a, "k", "after", T0 + 3, &[]);
    let change = changes.recv_timeout(WAIT).expect("the feed reconnected");
    assert_eq!(change.value.as_deref(), Some(&b"after"[..]));
    stop.store(true, Ordering::Relaxed);
}
