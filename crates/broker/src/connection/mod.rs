//! One task per client connection; the only place that touches its socket.
//!
//! The task reads and writes concurrently from one `select!` loop (borrowed halves
//! of the `TcpStream`): decoded packets are handled in place and their answers
//! appended to one write buffer, and deliveries from the session queue are encoded
//! into the same buffer, so many packets leave in one `write` call. The loop stops
//! draining the session queue while the write buffer is above its high-water mark;
//! the queue then fills and the session's bounds decide (see `session.rs`).

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

use bytes::{Buf, BytesMut};
use statehub_mqtt_codec::{
    ByteString, Codec, DecodeError, LastWill, Packet, ProtocolVersion, ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::pending::Admission;
use crate::service::ClientInfo;
use crate::session::Session;
use crate::signal::Signal;
use crate::Broker;

use handshake::{AuthStep, Refused};
pub(crate) use teardown::schedule_expiry;

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

/// Counts a connection against `max_connections` from its CONNECT to its end.
struct Counted(Broker);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.inner.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one TCP connection until it closes. Never panics on peer input.
pub(crate) async fn serve(
    broker: Broker,
    mut stream: TcpStream,
    peer: SocketAddr,
    admission: Admission,
) {
    broker
        .inner
        .metrics
        .connections_total
        .fetch_add(1, Ordering::Relaxed);
    let _ = stream.set_nodelay(true);
    if let Some((conn, rbuf, _counted)) = connect(&broker, &mut stream, admission).await {
        let client = conn.info.client_id.clone();
        tracing::debug!(%peer, client = %client, "client connected");
        run(conn, stream, rbuf).await;
        tracing::debug!(%peer, client = %client, "client gone");
    }
}

/// Reads CONNECT (and any AUTH rounds), answers CONNACK. `None` if refused. Until the
/// CONNECT is in, the connection holds its place among the pending ones (`admission`)
/// and closes if evicted from it; from then on it counts against `max_connections`.
async fn connect(
    broker: &Broker,
    stream: &mut TcpStream,
    admission: Admission,
) -> Option<(Conn, BytesMut, Counted)> {
    let cfg = broker.config();
    let deadline = Instant::now() + Duration::from_secs(cfg.connect_timeout_secs);
    let mut codec = Codec::new_server(cfg.max_packet_size);
    let mut rbuf = BytesMut::new();
    let first = tokio::select! {
        r = read_packet(stream, &mut codec, &mut rbuf, deadline) => r,
        () = admission.closed.cancelled() => return None,
    };
    drop(admission);
    let first = match first {
        Ok(Some(p)) => p,
        Ok(None) => return None,
        Err(DecodeError::UnsupportedProtocolVersion(level)) => {
            let answer: &[u8] = if level >= 5 {
                &[0x20, 0x03, 0x00, 0x84, 0x00]
            } else {
                &[0x20, 0x02, 0x00, 0x01]
            };
            let _ = stream.write_all(answer).await;
            return None;
        }
        Err(e) => {
            tracing::debug!(error = %e, "bad first packet");
            refuse_bad_connect(stream, &codec, &e).await;
            return None;
        }
    };
    let Packet::Connect(mut connect) = first else {
        return None;
    };
    broker.inner.connections.fetch_add(1, Ordering::Relaxed);
    let counted = Counted(broker.clone());
    let version = connect.protocol;
    let unavailable = if broker.inner.shutdown.is_cancelled() {
        Some(ReasonCode::SERVER_UNAVAILABLE)
    } else if broker.connection_count() > cfg.max_connections {
        tracing::warn!(client = %connect.client_id, "connection limit reached; refusing with 0x97");
        Some(ReasonCode::QUOTA_EXCEEDED)
    } else {
        None
    };
    if let Some(code) = unavailable {
        refuse(stream, &codec, code).await;
        return None;
    }
    let auth_data = match handshake::check(broker, &connect)
        .and_then(|()| handshake::authenticate(broker, &connect))
    {
        Ok(AuthStep::Done(data)) => data,
        Ok(AuthStep::Challenge(challenge)) => {
            match auth_rounds(
                broker, stream, &mut codec, &mut rbuf, &connect, challenge, deadline,
            )
            .await
            {
                Ok(data) => data,
                Err(Some(Refused(code))) => {
                    refuse(stream, &codec, code).await;
                    return None;
                }
                Err(None) => return None,
            }
        }
        Err(Refused(code)) => {
            refuse(stream, &codec, code).await;
            return None;
        }
    };
    let accepted = handshake::accept(broker, &mut connect, auth_data);
    if accepted.stored {
        if let Err(e) = barrier(broker).await {
            // Session Present could not be promised: refuse, and the client retries.
            tracing::error!("{e}; refusing the connection of {}", connect.client_id);
            refuse(stream, &codec, ReasonCode::UNSPECIFIED_ERROR).await;
            return None;
        }
    }
    let mut wbuf = BytesMut::with_capacity(1024);
    if codec
        .encode(&Packet::ConnAck(accepted.connack.clone()), &mut wbuf)
        .is_err()
    {
        return None;
    }
    let p = &connect.properties;
    let conn = Conn {
        broker: broker.clone(),
        codec,
        wbuf,
        session: accepted.session,
        generation: accepted.generation,
        info: ClientInfo {
            client_id: connect.client_id.clone(),
            username: connect.username.clone(),
            protocol: version,
        },
        version,
        client_receive_max: p.receive_maximum.unwrap_or(u16::MAX).max(1),
        client_max_packet: p.maximum_packet_size.unwrap_or(u32::MAX),
        client_alias_max: if cfg.server_topic_aliases {
            p.topic_alias_maximum.unwrap_or(0)
        } else {
            0
        },
        out_aliases: HashMap::new(),
        in_aliases: HashMap::new(),
        will: connect.will.take(),
        auth_method: p.authentication_method.clone(),
        session_expiry: accepted.session_expiry,
        connect_expiry_zero: accepted.session_expiry == 0,
        signal: accepted.signal,
        keep_alive: accepted.keep_alive,
    };
    Some((conn, rbuf, counted))
}

/// Answers a CONNECT that failed to decode with a refusing CONNACK where the
/// protocol has a code for it (any for MQTT 5 [MQTT-3.2.2-7]; 3.1.1 only for the
/// identifier case, return code 2 [MQTT-3.1.3-8]), then the caller closes.
async fn refuse_bad_connect(stream: &mut TcpStream, codec: &Codec, e: &DecodeError) {
    let code = e.reason_code();
    let answer = match codec.version() {
        Some(ProtocolVersion::V5) => true,
        Some(ProtocolVersion::V311) => code == ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        None => false,
    };
    if answer {
        refuse(stream, codec, code).await;
    }
}

/// Writes a CONNACK refusing the connection with `code` (the codec maps it to a
/// 3.1.1 return code); the caller then closes.
async fn refuse(stream: &mut TcpStream, codec: &Codec, code: ReasonCode) {
    let mut out = BytesMut::new();
    let ack = statehub_mqtt_codec::ConnAck {
        reason_code: code,
        ..Default::default()
    };
    if codec.encode(&Packet::ConnAck(ack), &mut out).is_ok() {
        let _ = stream.write_all(&out).await;
    }
}

/// Extra AUTH exchanges during connect (MQTT 5 enhanced authentication).
async fn auth_rounds(
    broker: &Broker,
    stream: &mut TcpStream,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    connect: &statehub_mqtt_codec::Connect,
    mut challenge: Packet,
    deadline: Instant,
) -> Result<Option<bytes::Bytes>, Option<Refused>> {
    let method = connect
        .properties
        .authentication_method
        .clone()
        .unwrap_or_default();
    let authenticator = broker.inner.authenticator.read().clone();
    loop {
        let mut out = BytesMut::new();
        codec.encode(&challenge, &mut out).map_err(|_| None)?;
        stream.write_all(&out).await.map_err(|_| None)?;
        let Ok(Some(Packet::Auth(auth))) = read_packet(stream, codec, rbuf, deadline).await else {
            return Err(None);
        };
        if auth.reason_code != ReasonCode::CONTINUE_AUTHENTICATION
            || auth.authentication_method.as_ref() != Some(&method)
        {
            return Err(Some(Refused(ReasonCode::PROTOCOL_ERROR)));
        }
        match authenticator.auth(&connect.client_id, &method, &auth) {
            crate::AuthDecision::Success { data } => return Ok(data),
            crate::AuthDecision::Continue { data } => {
                challenge = Packet::Auth(statehub_mqtt_codec::Auth {
                    reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
                    authentication_method: Some(method.clone()),
                    authentication_data: data,
                    ..Default::default()
                });
            }
            crate::AuthDecision::Deny(code) => return Err(Some(Refused(code))),
        }
    }
}

/// Reads until one whole packet is decoded, the peer closes (Ok(None)), or the deadline.
async fn read_packet(
    stream: &mut TcpStream,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    deadline: Instant,
) -> Result<Option<Packet>, DecodeError> {
    loop {
        if let Some(p) = codec.decode(rbuf)? {
            return Ok(Some(p));
        }
        // The buffer is reserved once bytes are there to read: a socket that stays
        // silent holds none.
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => return Ok(None),
        }
        rbuf.reserve(4096);
        match stream.try_read_buf(rbuf) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return Ok(None),
        }
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
        let mut deadline = Instant::now() + keep_alive;
        let high_water = self.broker.config().socket_write_high_water;
        // Shutdown reaches connections through their signals (the listener asks every
        // attached one to close); one that attached after that sees the token here.
        if self.broker.inner.shutdown.is_cancelled() {
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
        let mut idle = std::pin::pin!(sleep_until(deadline));
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
                    deadline = Instant::now() + keep_alive;
                    if let Err(close) = self.handle_buffered(rbuf).await {
                        return close;
                    }
                }
                () = poll_fn(|_| if signal.take_deliveries() { Poll::Ready(()) } else { Poll::Pending }) => {}
                () = &mut idle, if !keep_alive.is_zero() => {
                    if Instant::now() >= deadline {
                        return Close::ByServer(ReasonCode::KEEP_ALIVE_TIMEOUT, "keep alive timeout");
                    }
                    idle.as_mut().reset(deadline);
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
                        .inner
                        .metrics
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
