//! A TCP proxy between a node and redis-server for the cluster fault tests: each
//! connection is relayed by the test's own `relay`, which holds back what it chooses
//! while [`Proxy::stall`] is set.

use std::future::Future;
use std::net::SocketAddr;

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
