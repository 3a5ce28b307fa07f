//! MQTT over WebSocket: the broker's side of a socket another server upgraded, plain
//! (`ws://`) or in a TLS session (`wss://`).
//!
//! The HTTP server (the binary's) answers the WebSocket handshake and hands the
//! socket over; from then on it is an MQTT connection like one from the TCP
//! listener: the same connection task, sessions, takeover and limits. Until its
//! CONNECT arrives it holds a place among this endpoint's pending connections (the
//! `max_pending_*` bounds, like a listener's own) and must send CONNECT within
//! `connect_timeout_secs`; then it counts against `max_connections`.

use std::sync::Arc;

use bytes::Bytes;
use tokio::net::TcpStream;

use crate::auth::Authenticator;
use crate::connection;
use crate::pending::Pending;
use crate::transport::tls::TlsStream;
use crate::transport::ws::{Hold, Limits, Wire, WsStream};
use crate::Broker;

pub use crate::transport::ws::Refusals as WebSocketRefusals;

/// Serves MQTT connections on upgraded WebSockets.
#[derive(Debug, Clone)]
pub struct WebSocketEndpoint {
    broker: Broker,
    pending: Arc<Pending>,
    limits: Limits,
    refusals: Arc<WebSocketRefusals>,
    /// Who may connect (`None`: the broker's authenticator).
    authenticator: Option<Arc<dyn Authenticator>>,
}

impl WebSocketEndpoint {
    pub fn new(broker: Broker) -> WebSocketEndpoint {
        let cfg = broker.config();
        let pending = Pending::new(
            cfg.max_pending_connections,
            cfg.max_pending_per_address,
            broker.clock().clone(),
        );
        let limits = Limits::for_packets(cfg.max_packet_size);
        WebSocketEndpoint {
            broker,
            pending,
            limits,
            refusals: Arc::default(),
            authenticator: None,
        }
    }

    /// Authenticates this endpoint's clients with `authenticator` instead of the
    /// broker's.
    pub fn with_authenticator(mut self, authenticator: Arc<dyn Authenticator>) -> Self {
        self.authenticator = Some(authenticator);
        self
    }

    /// The largest WebSocket message (and frame) a client may send, in payload bytes.
    pub fn max_message_size(&self) -> usize {
        self.limits.max_message
    }

    /// What the WebSocket layer refused so far.
    pub fn refusals(&self) -> &WebSocketRefusals {
        &self.refusals
    }

    /// Serves one socket whose WebSocket handshake is done until the connection ends;
    /// `read` holds the bytes the client sent after its handshake that the HTTP server
    /// already read; `hold` is dropped when the socket is closed (after its lingering
    /// close: the HTTP server's slot for it). Never panics on peer input.
    pub async fn serve(&self, tcp: TcpStream, read: Bytes, hold: impl Send + Sync + 'static) {
        let Ok(addr) = tcp.peer_addr() else { return };
        self.serve_on(tcp, crate::auth::Peer::plain(addr), read, Box::new(hold))
            .await;
    }

    /// As [`WebSocketEndpoint::serve`], for a WebSocket over TLS (`wss://`): `tls` is
    /// the session the HTTPS server established on `tcp` (its handshake, the HTTP
    /// upgrade); `read` is the plaintext the HTTP server read past the upgrade. A
    /// client certificate the session verified authenticates as on an MQTT listener.
    pub async fn serve_tls(
        &self,
        tcp: TcpStream,
        tls: rustls::ServerConnection,
        read: Bytes,
        hold: impl Send + Sync + 'static,
    ) {
        let Ok(addr) = tcp.peer_addr() else { return };
        let stream = TlsStream::from_parts(tcp, tls);
        let peer = crate::auth::Peer {
            addr,
            tls: true,
            certificates: stream.peer_certificates(),
        };
        self.serve_on(stream, peer, read, Box::new(hold)).await;
    }

    async fn serve_on<W: Wire>(&self, wire: W, peer: crate::auth::Peer, read: Bytes, hold: Hold) {
        let _ = wire.tcp().set_nodelay(true);
        let Some(admission) = self.pending.admit(peer.addr.ip(), self.broker.metrics()) else {
            return;
        };
        let refusals = Arc::clone(&self.refusals);
        let stream = WsStream::new(wire, read, self.limits, refusals, hold);
        Box::pin(connection::serve(
            self.broker.clone(),
            stream,
            peer,
            admission,
            self.authenticator
                .clone()
                .unwrap_or_else(|| self.broker.authenticator()),
        ))
        .await;
    }
}
