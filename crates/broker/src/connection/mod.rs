//! One task per client connection; the only place that touches its socket.
//!
//! The task reads and writes concurrently from one `select!` loop (borrowed halves
//! of the `TcpStream`): decoded packets are handled in place and their answers
//! appended to one write buffer, and deliveries from the session queue are encoded
//! into the same buffer, so many packets leave in one `write` call. The loop stops
//! draining the session queue while the write buffer is above its high-water mark;
//! the queue then fills and the session's bounds decide (see `session/mod.rs`).

mod handshake;
mod inbound;
mod outbound;
mod subscribe;
mod teardown;

use std::collections::HashMap;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::clock::Timer;
use bytes::{Buf, BytesMut};
use statehub_mqtt_codec::{
    ByteString, Codec, DecodeError, LastWill, Packet, ProtocolVersion, ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::service::ClientInfo;
use crate::session::Session;
use crate::signal::Signal;
use crate::Broker;

/// Why a connection ends; decides the DISCONNECT sent and whether the will goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Close {
    /// The client sent DISCONNECT; `will` is true for reason 0x04.
    ByClient { will: bool },
    /// The server closes with this reason code (MQTT 5 peers get a DISCONNECT).
    ByServer(ReasonCode, &'static str),
    /// The socket closed or failed without a DISCONNECT.
    Lost,
}

impl Close {
    fn from_decode(e: &DecodeError) -> Close {
        Close::ByServer(e.reason_code(), "malformed or invalid packet")
    }
}

/// The state of one accepted connection.
#[derive(Debug)]
pub(crate) struct Conn {
    broker: Broker,
    codec: Codec,
    wbuf: BytesMut,
    session: Arc<Session>,
    generation: u64,
    info: ClientInfo,
    version: ProtocolVersion,
    client_receive_max: u16,
    client_max_packet: u32,
    client_alias_max: u16,
    out_aliases: HashMap<ByteString, u16>,
    in_aliases: HashMap<u16, ByteString>,
    will: Option<LastWill>,
    auth_method: Option<ByteString>,
    session_expiry: u32,
    connect_expiry_zero: bool,
    signal: Arc<Signal>,
    keep_alive: Duration,
}

/// Serves one TCP connection until it closes. Never panics on peer input.
pub(crate) async fn serve(broker: Broker, mut stream: TcpStream, peer: SocketAddr) {
    let _open = broker.open_connection();
    let _ = stream.set_nodelay(true);
    if let Some((conn, rbuf)) = handshake::connect(&broker, &mut stream).await {
        let client = conn.info.client_id.clone();
        tracing::debug!(%peer, client = %client, "client connected");
        run(conn, stream, rbuf).await;
        tracing::debug!(%peer, client = %client, "client gone");
    }
}

/// The connected phase: the select loop, then teardown.
async fn run(mut conn: Conn, mut stream: TcpStream, mut rbuf: BytesMut) {
    conn.resume();
    let close = conn.pump(&mut stream, &mut rbuf).await;
    conn.finish(&mut stream, close).await;
}

impl Conn {
    async fn pump(&mut self, stream: &mut TcpStream, rbuf: &mut BytesMut) -> Close {
        let signal = self.signal.clone();
        let keep_alive = self.keep_alive.mul_f32(1.5);
        let clock = self.broker.clock().clone();
        let mut deadline = clock.now() + keep_alive;
        let high_water = self.broker.config().socket_write_high_water;
        // Shutdown reaches connections through their signals (the listener asks every
        // attached one to close); one that attached after that sees the token here.
        if self.broker.is_shutting_down() {
            return Close::ByServer(ReasonCode::SERVER_SHUTTING_DOWN, "server shutting down");
        }
        // Packets the client pipelined behind CONNECT are already in the buffer.
        if let Err(close) = self.handle_buffered(rbuf).await {
            return close;
        }
        let (mut rd, mut wr) = stream.split();
        // One keep-alive timer for the connection's life, moved only when it fires early:
        // a fresh `sleep_until` per turn of the loop inserted into and removed from the
        // timer wheel for every packet.
        let mut idle = Timer::new(clock.clone(), deadline);
        loop {
            // A wake-up that came before this drain is covered by it: drop it, so that a
            // delivery this task queued itself (a service's reply to this client) does not
            // cost another turn of the loop. One that comes after is kept for the select.
            signal.take_deliveries();
            if self.wbuf.len() < high_water {
                self.drain();
            }
            // Write what is buffered now, while the socket is known to be writable: the
            // common case (a request's PUBACK and reply) then needs no turn of the select
            // for its write. The select below waits when the socket is full.
            if !self.wbuf.is_empty() {
                match wr.try_write(&self.wbuf) {
                    Ok(n) if n > 0 => self.wbuf.advance(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    _ => return Close::Lost,
                }
            }
            rbuf.reserve(8192);
            let writing = !self.wbuf.is_empty();
            let reading = self.wbuf.len() < 4 * high_water;
            tokio::select! {
                biased;
                // Registers the task with the signal, so the deliveries branch below
                // needs no registration of its own.
                code = poll_fn(|cx| signal.poll_close(cx)) => return Close::ByServer(code, close_text(code)),
                r = wr.write_buf(&mut self.wbuf), if writing => {
                    tracing::trace!(client = %self.info.client_id, written = ?r, left = self.wbuf.len(), "write");
                    if !matches!(r, Ok(n) if n > 0) {
                        return Close::Lost;
                    }
                }
                r = rd.read_buf(rbuf), if reading => {
                    if !matches!(r, Ok(n) if n > 0) {
                        return Close::Lost;
                    }
                    deadline = clock.now() + keep_alive;
                    if let Err(close) = self.handle_buffered(rbuf).await {
                        return close;
                    }
                }
                () = poll_fn(|_| if signal.take_deliveries() { Poll::Ready(()) } else { Poll::Pending }) => {}
                () = poll_fn(|cx| idle.poll_elapsed(cx)), if !keep_alive.is_zero() => {
                    if clock.now() >= deadline {
                        return Close::ByServer(ReasonCode::KEEP_ALIVE_TIMEOUT, "keep alive timeout");
                    }
                    idle.reset(deadline);
                }
            }
        }
    }

    /// Decodes and handles every whole packet in `rbuf`.
    async fn handle_buffered(&mut self, rbuf: &mut BytesMut) -> Result<(), Close> {
        loop {
            match self.codec.decode(rbuf) {
                Ok(Some(p)) => self.handle(p).await?,
                Ok(None) => return Ok(()),
                Err(e) => {
                    tracing::debug!(client = %self.info.client_id, error = %e, "decode error");
                    self.broker
                        .metrics()
                        .protocol_errors
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(Close::from_decode(&e));
                }
            }
        }
    }

    /// Appends one packet to the write buffer. An encode failure is our bug, not the
    /// peer's: it closes the connection with 0x83.
    fn send(&mut self, p: &Packet) -> Result<(), Close> {
        tracing::trace!(client = %self.info.client_id, packet = ?p, "sending");
        self.codec.encode(p, &mut self.wbuf).map_err(|e| {
            tracing::error!(error = %e, "encode failed");
            Close::ByServer(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR, "encode failed")
        })
    }
}

/// Waits until every session change recorded so far is durable (at once without a
/// session store).
async fn barrier(broker: &Broker) -> Result<(), crate::SessionStoreError> {
    match broker.session_store() {
        Some(store) => store.barrier().await,
        None => Ok(()),
    }
}

fn close_text(code: ReasonCode) -> &'static str {
    match code {
        ReasonCode::SESSION_TAKEN_OVER => "session taken over by another connection",
        ReasonCode::QUOTA_EXCEEDED => "slow consumer: session queue full",
        ReasonCode::SERVER_SHUTTING_DOWN => "server shutting down",
        _ => "disconnected by the server",
    }
}
