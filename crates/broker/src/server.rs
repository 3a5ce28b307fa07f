//! The MQTT listener: accepts TCP connections and spawns one task per connection.
//! On shutdown it stops accepting, every connection sends DISCONNECT 0x8B, and the
//! listener waits (bounded) for the connections to finish.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use statehub_mqtt_codec::ReasonCode;
use tokio::net::TcpListener;
use tokio::runtime::Handle;

use crate::auth::Authenticator;
use crate::connection;
use crate::pending::Pending;
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
        Ok(MqttListener {
            listener,
            broker,
            workers: Vec::new(),
            pending,
            authenticator: None,
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
                        let auth = match &self.authenticator {
                            Some(auth) => auth.clone(),
                            None => self.broker.authenticator(),
                        };
                        if self.workers.is_empty() {
                            tokio::spawn(connection::serve(self.broker.clone(), stream, peer, admission, auth));
                            continue;
                        }
                        // A tokio stream belongs to the reactor it was accepted on; hand
                        // it over as a std stream so the worker's own reactor drives it.
                        let Ok(std_stream) = stream.into_std() else { continue };
                        let worker = &self.workers[next % self.workers.len()];
                        next = next.wrapping_add(1);
                        let broker = self.broker.clone();
                        worker.spawn(async move {
                            match tokio::net::TcpStream::from_std(std_stream) {
                                Ok(stream) => connection::serve(broker, stream, peer, admission, auth).await,
                                Err(e) => tracing::warn!(error = %e, "cannot register connection"),
                            }
                        });
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
