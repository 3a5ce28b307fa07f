//! A TCP proxy between a node and redis-server that holds back what one state store
//! connection sends (the node's second store thread's), for tests of requests that
//! wait for Redis while the rest of the node (its MQTT fabric) goes on.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::PATIENCE;
use crate::common::proxy::Proxy;

/// How many script calls (`EVALSHA`) the proxy holds back, from every connection.
#[derive(Default)]
struct Held(AtomicUsize);

/// The name of the store connection the proxy holds back: node `a`'s second store
/// thread's, which no expiry run uses (they run on the first).
pub const HELD: &[u8] = b"statehub-store:a/1";

/// A client id whose requests go to that thread: as `shards.rs` picks a client's
/// thread (a fixed hash of its id, modulo the threads).
pub fn client_on_second_thread() -> String {
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
pub async fn until_held(proxy: &HeldProxy, count: usize) -> usize {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = proxy.scripts();
        if now >= count || tokio::time::Instant::now() >= deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The proxy, what it holds, and how the test releases it.
pub struct HeldProxy {
    proxy: Proxy,
    held: Arc<Held>,
    release: watch::Sender<u64>,
}

impl HeldProxy {
    /// A proxy to redis-server on `redis_port`, holding nothing yet.
    pub async fn start(redis_port: u16) -> HeldProxy {
        let held = Arc::new(Held::default());
        let (release, released) = watch::channel(0u64);
        let proxy = Proxy::start(redis_port, {
            let held = held.clone();
            move |client, upstream, stall| {
                relay(client, upstream, stall, released.clone(), held.clone())
            }
        })
        .await;
        HeldProxy {
            proxy,
            held,
            release,
        }
    }

    /// `redis://` at the proxy.
    pub fn url(&self) -> String {
        self.proxy.url()
    }

    /// Holds back (or not) what the [`HELD`] connection sends from now on.
    pub fn hold(&self, on: bool) {
        self.proxy.stall.send_replace(on);
    }

    /// Sends what is held so far.
    pub fn release(&self) {
        self.release.send_modify(|n| *n += 1);
    }

    /// Script calls held now.
    pub fn scripts(&self) -> usize {
        self.held.0.load(Ordering::SeqCst)
    }
}

/// A node on `redis` behind a proxy the test holds, with two store threads, and a
/// client whose requests queue on the second ([`client_on_second_thread`]), connected
/// and subscribed to its response topic.
pub async fn held_node(
    redis: &statehub_redis_common::test_server::RedisServer,
) -> (
    HeldProxy,
    crate::common::Server,
    String,
    statehub_test_support::RawClient,
) {
    use statehub_test_support::{opts, RawClient, V5};
    let proxy = HeldProxy::start(redis.port()).await;
    let node = crate::common::start_configured(
        "[cluster]\ntimeout_ms = 600000\n[state_store]\nnetwork_threads = 2\n",
        &["--redis", &proxy.url(), "--node-id", "a"],
    );
    let id = client_on_second_thread();
    let mut client = RawClient::connect(node.mqtt, V5, &id).await;
    let response = format!("clients/{id}/response");
    client
        .subscribe(&response, opts(statehub_broker::codec::QoS::AtLeastOnce))
        .await;
    (proxy, node, id, client)
}
