//! A Redis that stops answering while a pipeline of many requests waits: the run ends
//! within about one timeout (each request answered 503), not one timeout per request.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{fresh_namespace, options, request, ts, T0};
use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::{AllowAll, Config, Machine};
use statehub_state_store_redis::RedisEngine;

/// A TCP proxy to `upstream` that, once `hold` is set, keeps what clients send (Redis
/// never sees it, so never answers).
fn holding_proxy(upstream: u16, hold: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (client2, server2) = (
                client.try_clone().expect("clone"),
                server.try_clone().expect("clone"),
            );
            let hold = hold.clone();
            thread::spawn(move || pump(client, server, Some(hold)));
            thread::spawn(move || pump(server2, client2, None));
        }
    });
    port
}

fn pump(mut from: TcpStream, mut to: TcpStream, hold: Option<Arc<AtomicBool>>) {
    let mut buf = [0u8; 16 << 10];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if hold.as_ref().is_some_and(|h| h.load(Ordering::SeqCst)) {
            continue;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[test]
fn a_stalled_redis_ends_a_run_of_many_within_about_one_timeout() {
    let server = RedisServer::start();
    let hold = Arc::new(AtomicBool::new(false));
    let port = holding_proxy(server.port(), hold.clone());
    let ns = fresh_namespace("stalled");
    let mut opts = options(&server, &ns, "a");
    opts.url = format!("redis://127.0.0.1:{port}");
    let timeout = Duration::from_millis(500);
    opts.timeout = timeout;
    let engine = RedisEngine::open(&opts).expect("open");
    let mut node = Machine::new(engine, AllowAll, Config::default()).expect("machine");
    let stamp = ts(T0, 0);
    // Connected, the scripts loaded.
    node.handle(request("c", &[b"SET", b"k", b"v"], Some(&stamp), None), T0)
        .expect("SET");
    let begun: Vec<_> = (0..40)
        .map(|i| {
            let key = format!("k{i}");
            let args: [&[u8]; 3] = [b"SET", key.as_bytes(), b"v"];
            node.begin(&request("c", &args, Some(&stamp), None), T0)
                .expect("begin")
                .expect("begun")
        })
        .collect();
    hold.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let outcomes = node.finish(begun);
    let took = started.elapsed();
    assert_eq!(outcomes.len(), 40);
    for outcome in &outcomes {
        assert!(
            outcome.as_ref().is_err_and(|e| e.is_unavailable()),
            "each answered 503: {:?}",
            outcome.as_ref().err()
        );
    }
    assert!(
        took < timeout * 4,
        "40 queued requests ended after {took:?}, timeout {timeout:?}"
    );
}
