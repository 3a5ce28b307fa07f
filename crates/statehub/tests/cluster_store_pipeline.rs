//! With `--redis`, one client's state store requests are in Redis at once: those that
//! queue behind a request waiting for Redis go out together, their scripts in one
//! pipeline, before any of them is answered; and they are answered, and acknowledged,
//! in the client's order, each GET seeing the SET before it.

mod common;
mod store_client;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use statehub_broker::codec::QoS;
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, RawClient, V5};
use store_client::raw::{acks_and_answers, request};
use store_client::PATIENCE;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// How many script calls (`EVALSHA`) the proxy holds back, from every connection.
#[derive(Default)]
struct Held(AtomicUsize);

/// The name of the store connection the proxy holds back: node `a`'s second store
/// thread's, which no expiry run uses (they run on the first).
const HELD: &[u8] = b"statehub-store:a/1";

/// A client id whose requests go to that thread: as `shards.rs` picks a client's
/// thread (a fixed hash of its id, modulo the threads).
fn client_on_second_thread() -> String {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    (0..)
        .map(|i| format!("piper-{i}"))
        .find(|id| BuildHasherDefault::<DefaultHasher>::default().hash_one(id) % 2 == 1)
        .unwrap()
}

/// Relays one connection; while `stall` is set, holds back what the node sends on the
/// [`HELD`] connection (named so when it connects), counting the scripts held, and
/// sends what it held each time `release` ticks.
async fn relay(
    client: TcpStream,
    upstream: TcpStream,
    stall: watch::Receiver<bool>,
    mut release: watch::Receiver<u64>,
    held: Arc<Held>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut upstream_rx, mut upstream_tx) = upstream.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut upstream_rx, &mut client_tx).await;
    });
    let (mut store, mut buffer, mut kept) = (false, vec![0u8; 1 << 16], Vec::new());
    loop {
        tokio::select! {
            read = client_rx.read(&mut buffer) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let bytes = &buffer[..n];
                store |= bytes.windows(HELD.len()).any(|w| w == HELD);
                if store && *stall.borrow() {
                    held.0.fetch_add(scripts(bytes), Ordering::SeqCst);
                    kept.extend_from_slice(bytes);
                } else if upstream_tx.write_all(bytes).await.is_err() {
                    return;
                }
            }
            changed = release.changed() => {
                if changed.is_err() {
                    return;
                }
                held.0.fetch_sub(scripts(&kept), Ordering::SeqCst);
                if upstream_tx.write_all(&std::mem::take(&mut kept)).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn scripts(bytes: &[u8]) -> usize {
    bytes.windows(7).filter(|w| w == b"EVALSHA").count()
}

/// Waits until the proxy holds `count` scripts; returns how many it holds after
/// [`PATIENCE`] if fewer.
async fn until_held(held: &Held, count: usize) -> usize {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = held.0.load(Ordering::SeqCst);
        if now >= count || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_requests_queued_behind_one_are_in_redis_together_and_answered_in_order() {
    let redis = RedisServer::start();
    let held = Arc::new(Held::default());
    let (release, released) = watch::channel(0u64);
    let proxy = Proxy::start(redis.port(), {
        let held = held.clone();
        move |client, upstream, stall| {
            relay(client, upstream, stall, released.clone(), held.clone())
        }
    })
    .await;
    // Two store threads: the client's requests queue on the second.
    let node = common::start_configured(
        "[cluster]\ntimeout_ms = 600000\n[state_store]\nnetwork_threads = 2\n",
        &["--redis", &proxy.url(), "--node-id", "a"],
    );
    let id = client_on_second_thread();
    let mut c = RawClient::connect(node.mqtt, V5, &id).await;
    c.subscribe(&format!("clients/{id}/response"), opts(QoS::AtLeastOnce))
        .await;
    c.send(&request(&id, 1, &[b"SET", b"first", b"v"])).await;
    let (acked, _) = acks_and_answers(&mut c, 1).await;
    assert_eq!(acked, [1]);

    // The first request waits at the proxy; the client's next ones queue behind it.
    proxy.stall.send_replace(true);
    c.send(&request(&id, 2, &[b"SET", b"w", b"0"])).await;
    assert_eq!(until_held(&held, 1).await, 1, "the first request's script");
    let keys: Vec<String> = (1..=4).map(|i| format!("k{i}")).collect();
    let mut calls: Vec<Vec<&[u8]>> = Vec::new();
    for key in &keys {
        calls.push(vec![b"SET", key.as_bytes(), key.as_bytes()]);
        calls.push(vec![b"GET", key.as_bytes()]);
    }
    for (i, args) in calls.iter().enumerate() {
        c.send(&request(&id, u16::try_from(i + 3).unwrap(), args))
            .await;
    }
    // Read and queued (the PINGREQ behind them is answered).
    c.ping().await;

    // Once the first is answered, the eight go out together, none answered yet.
    release.send_modify(|n| *n += 1);
    let together = until_held(&held, calls.len()).await;
    assert!(
        together == calls.len(),
        "{together} of the {} queued requests were in Redis at once",
        calls.len()
    );
    proxy.stall.send_replace(false);
    release.send_modify(|n| *n += 1);

    let (acked, answers) = acks_and_answers(&mut c, calls.len() + 1).await;
    let ids: Vec<u16> = (2..=u16::try_from(calls.len() + 2).unwrap()).collect();
    assert_eq!(acked, ids, "PUBACKs in the order of the requests");
    assert_eq!(answers[&2], b"+OK\r\n");
    for (i, key) in keys.iter().enumerate() {
        let set = u16::try_from(2 * i + 3).unwrap();
        assert_eq!(answers[&set], b"+OK\r\n");
        let got = format!("${}\r\n{key}\r\n", key.len());
        assert_eq!(answers[&(set + 1)], got.as_bytes(), "the GET saw its SET");
    }
}
