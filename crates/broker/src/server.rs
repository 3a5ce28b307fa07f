//! The MQTT listener: accepts TCP connections (running the TLS handshake on a TLS
//! listener) and spawns one task per connection.
//! On shutdown it stops accepting, every connection sends DISCONNECT 0x8B, and the
//! listener waits (bounded) for the connections to finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use statehub_mqtt_codec::ReasonCode;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;

use crate::auth::{Authenticator, Peer};
use crate::connection;
use crate::pending::{Admission, Pending};
use crate::rate::Bandwidth;
use crate::ratelimit::LogLimit;
use crate::transport::tls::{TlsSource, TlsStream};
use crate::Broker;

/// A bound MQTT listener.
#[derive(Debug)]
pub struct MqttListener {
    listener: TcpListener,
    broker: Broker,
    workers: Vec<Handle>,
    pending: Arc<Pending>,
    /// This listener's authentication; `None`: the broker's (see
    /// [`Broker::set_authenticator`]).
    authenticator: Option<Arc<dyn Authenticator>>,
    tls: Option<Arc<dyn TlsSource>>,
    /// Bytes per second each connection may send (`None`: no limit).
    bandwidth: Option<Bandwidth>,
}

impl MqttListener {
    /// Binds `addr` (port 0 picks a free port; see [`MqttListener::local_addr`]).
    pub async fn bind(broker: Broker, addr: SocketAddr) -> std::io::Result<MqttListener> {
        let listener = TcpListener::bind(addr).await?;
        let cfg = broker.config();
        let pending = Pending::new(
            cfg.max_pending_connections,
            cfg.max_pending_per_address,
            broker.clock().clone(),
        );
        let bandwidth = Bandwidth::of(cfg);
        Ok(MqttListener {
            listener,
            bandwidth,
            broker,
            workers: Vec::new(),
            pending,
            authenticator: None,
            tls: None,
        })
    }

    /// Authenticates this listener's clients with `authenticator` instead of the
    /// broker's: each listener (plain on loopback, TLS on all interfaces) may ask
    /// for different credentials.
    pub fn with_authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Self {
        self.authenticator = Some(authenticator);
        self
    }

    /// Runs connection tasks on these runtimes, round-robin, instead of the
    /// caller's. The binary gives one single-threaded runtime per core: its
    /// scheduler runs woken tasks first-in first-out, so packets that arrive on
    /// different connections of one thread are handled in arrival order (the
    /// multi-threaded scheduler's LIFO slot can invert two wake-ups, letting a
    /// PUBLISH overtake a SUBSCRIBE sent just before it by another client), and no
    /// task is ever stolen across threads.
    pub fn with_workers(mut self, workers: Vec<Handle>) -> Self {
        self.workers = workers;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves this listener's connections over TLS, with the configuration `tls`
    /// gives at each handshake (so a reloaded certificate takes effect for new
    /// connections while open ones keep theirs).
    pub fn with_tls(mut self, tls: Arc<dyn TlsSource>) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Limits the bytes each of this listener's connections may send to `bandwidth`
    /// (`None`: no limit) instead of the `[mqtt]` table's `max_bytes_per_second`.
    pub fn with_bandwidth(mut self, bandwidth: Option<Bandwidth>) -> Self {
        self.bandwidth = bandwidth;
        self
    }

    /// Accepts connections until the broker's shutdown token is cancelled, then
    /// waits up to `drain` for open connections to close.
    pub async fn serve(self, drain: Duration) {
        let shutdown = self.broker.shutdown_token();
        let mut next = 0usize;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Some(admission) = self.pending.admit(peer.ip(), self.broker.metrics()) else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let worker = match self.workers.is_empty() {
                            true => None,
                            false => {
                                next = next.wrapping_add(1);
                                Some(&self.workers[next % self.workers.len()])
                            }
                        };
                        self.spawn(stream, peer, admission, worker);
                    }
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        drop(self.listener);
        // The one shutdown signal, fanned out: every attached connection is asked to
        // close with 0x8B (one attaching after this sees the token when it starts).
        self.broker.close_all(ReasonCode::SERVER_SHUTTING_DOWN);
        let deadline = tokio::time::Instant::now() + drain;
        while self.broker.connection_count() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl MqttListener {
    /// Starts the task of an accepted connection, on `worker` if given.
    fn spawn(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        admission: Admission,
        worker: Option<&Handle>,
    ) {
        let auth = match &self.authenticator {
            Some(auth) => auth.clone(),
            None => self.broker.authenticator(),
        };
        let broker = self.broker.clone();
        let tls = self.tls.as_ref().map(|source| source.server_config());
        let limits = Limits {
            auth,
            tls,
            bandwidth: self.bandwidth,
        };
        let Some(worker) = worker else {
            tokio::spawn(start(broker, stream, peer, admission, limits));
            return;
        };
        // A tokio stream belongs to the reactor it was accepted on; hand it over as a
        // std stream so the worker's own reactor drives it.
        let Ok(std_stream) = stream.into_std() else {
            return;
        };
        worker.spawn(async move {
            match TcpStream::from_std(std_stream) {
                Ok(stream) => start(broker, stream, peer, admission, limits).await,
                Err(e) => tracing::warn!(error = %e, "cannot register connection"),
            }
        });
    }
}

/// What a listener gives each of its connections.
struct Limits {
    auth: Arc<dyn Authenticator>,
    tls: Option<Arc<rustls::ServerConfig>>,
    bandwidth: Option<Bandwidth>,
}

/// Runs the TLS handshake if the listener has TLS, then serves the connection. The
/// handshake counts as the connection's pending time: it must finish within the
/// CONNECT timeout, and the connection can still be evicted meanwhile.
async fn start(
    broker: Broker,
    stream: TcpStream,
    addr: SocketAddr,
    admission: Admission,
    limits: Limits,
) {
    let Limits {
        auth,
        tls,
        bandwidth,
    } = limits;
    let Some(config) = tls else {
        let peer = Peer::plain(addr);
        return connection::serve_limited(broker, stream, peer, admission, auth, bandwidth).await;
    };
    let limit = Duration::from_secs(broker.config().connect_timeout_secs);
    let handshake = tokio::select! {
        r = tokio::time::timeout(limit, TlsStream::accept(stream, config)) => r,
        () = admission.closed.cancelled() => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return tls_failed(&broker, addr, &e.to_string()),
        Err(_) => return tls_failed(&broker, addr, "timed out"),
    };
    let peer = Peer {
        addr,
        tls: true,
        certificates: stream.peer_certificates(),
    };
    let serve = connection::serve_limited(broker, stream, peer, admission, auth, bandwidth);
    Box::pin(serve).await;
}

/// Counts and logs (rate-limited) a TLS handshake that failed: a client that does not
/// trust our certificate, one whose certificate we refuse, a port scanner.
fn tls_failed(broker: &Broker, peer: SocketAddr, error: &str) {
    static LOG: LogLimit = LogLimit::per_secs(10);
    let failures = &broker.metrics().tls_handshake_failures;
    failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(left_out) = LOG.allow() {
        tracing::info!(%peer, left_out, "TLS handshake failed: {error}");
    }
}
