//! A TCP proxy between a node and redis-server for the cluster fault tests: each
//! connection is relayed by the test's own `relay`, which holds back what it chooses
//! while [`Proxy::stall`] is set.

use std::future::Future;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    /// Set: the relays hold back the connections they choose until it is cleared.
    pub stall: watch::Sender<bool>,
}

impl Proxy {
    /// Listens on a free loopback port and relays every connection to `redis_port`
    /// with `relay(client, upstream, stall)`.
    pub async fn start<R, F>(redis_port: u16, relay: R) -> Proxy
    where
        R: Fn(TcpStream, TcpStream, watch::Receiver<bool>) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stall, rx) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if let Ok(upstream) = TcpStream::connect(("127.0.0.1", redis_port)).await {
                    tokio::spawn(relay(client, upstream, rx.clone()));
                }
            }
        });
        Proxy { addr, stall }
    }

    /// `redis://` at the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }
}

/// Whether `chunk` contains `what`.
pub fn contains(chunk: &[u8], what: &[u8]) -> bool {
    chunk.windows(what.len()).any(|w| w == what)
}

/// A relay between a node and redis-server: while `stall` is set, a chunk the node
/// sends that `held` picks (and everything after it on that connection) waits until
/// `stall` is cleared; replies always go back.
pub async fn hold_while(
    client: TcpStream,
    upstream: TcpStream,
    mut stall: watch::Receiver<bool>,
    held: impl Fn(&[u8]) -> bool,
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_redis, mut to_redis) = upstream.into_split();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 16 << 10];
        while let Ok(n) = from_redis.read(&mut buf).await {
            if n == 0 || to_client.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 16 << 10];
    while let Ok(n) = from_client.read(&mut buf).await {
        if n == 0 {
            return;
        }
        let chunk = &buf[..n];
        if held(chunk) {
            while *stall.borrow_and_update() {
                if stall.changed().await.is_err() {
                    return;
                }
            }
        }
        if to_redis.write_all(chunk).await.is_err() {
            return;
        }
    }
}
