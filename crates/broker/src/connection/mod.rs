//! One task per client connection; the only place that touches its socket.
//!
//! The task reads and writes concurrently from one `select!` loop (on the readiness
//! of its [`Transport`]: a `TcpStream`, TLS over one, or a WebSocket on one): decoded packets are handled in place and their answers
//! appended to one write buffer, and deliveries from the session queue are encoded
//! into the same buffer, so many packets leave in one `write` call. The loop stops
//! draining the session queue while the write buffer is above its high-water mark;
//! the queue then fills and the session's bounds decide (see `session/mod.rs`).

mod acks;
mod authn;
mod authorize;
mod buffers;
mod handshake;
mod inbound;
mod outbound;
mod pressure;
mod subscribe;
mod teardown;

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use statehub_mqtt_codec::{
    ByteString, Codec, DecodeError, EncodeError, LastWill, Packet, ProtocolVersion, ReasonCode,
};

use crate::auth::{Authenticator, Peer};
use crate::authz::Grants;
use crate::clock::Timer;
use crate::metrics::packet_type;
use crate::pending::Admission;
use crate::rate::{Bandwidth, ByteBucket};
use crate::ratelimit::LogLimit;
use crate::service::ClientInfo;
use crate::session::Session;
use crate::signal::Signal;
use crate::transport::Transport;
use crate::Broker;
use buffers::Deadlines;

/// Why a connection ends; decides the DISCONNECT sent and whether the will goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Close {
    /// The client sent DISCONNECT; `will` is true for reason 0x04.
    ByClient { will: bool },
    /// The server closes with this reason code (MQTT 5 peers get a DISCONNECT).
    ByServer(ReasonCode, &'static str),
    /// The socket closed or failed without a DISCONNECT.
    Lost,
    /// The client's credential expired without a re-authentication: the network
    /// connection is closed without a DISCONNECT, as the AIO broker does (the client
    /// reconnects with its current credential).
    Expired,
}

impl Close {
    fn from_decode(e: &DecodeError) -> Close {
        Close::ByServer(e.reason_code(), "malformed or invalid packet")
    }
}

/// What one read of the socket did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// No whole packet was handled (nothing there, or only part of one).
    Nothing,
    /// Packets were handled, and the read took less than the room it had: the
    /// socket was empty then.
    Drained,
    /// Packets were handled, and the read filled the room it had: the socket may
    /// hold more.
    Filled,
}

/// The state of one accepted connection.
#[derive(Debug)]
pub(crate) struct Conn {
    broker: Broker,
    codec: Codec,
    wbuf: BytesMut,
    /// Bytes of the packet at the front of `wbuf` not yet written (0: it starts a
    /// packet).
    wbuf_front_left: usize,
    session: Arc<Session>,
    generation: u64,
    info: ClientInfo,
    /// What the authorization rules grant this client, kept current (`authz.rs`).
    grants: Grants,
    /// The peer and the authenticator that admitted it (for re-authentication).
    origin: authn::Origin,
    /// When the credential the client authenticated with expires (broker clock): the
    /// connection closes then unless a re-authentication moved it.
    credential_at: Option<std::time::Instant>,
    version: ProtocolVersion,
    client_receive_max: u16,
    client_max_packet: u32,
    client_alias_max: u16,
    out_aliases: HashMap<ByteString, u16>,
    in_aliases: HashMap<u16, ByteString>,
    /// Boxed: most clients have none, and a `LastWill` is 216 bytes.
    will: Option<Box<LastWill>>,
    auth_method: Option<ByteString>,
    /// Request Problem Information: false if the client asked for none (no Reason
    /// String or User Property on anything but PUBLISH, CONNACK, DISCONNECT
    /// [MQTT-3.1.2-29]).
    problem_info: bool,
    session_expiry: u32,
    connect_expiry_zero: bool,
    signal: Arc<Signal>,
    keep_alive: Duration,
    /// `max_publish_rate`'s bucket (`None`: no limit).
    publish_rate: Option<crate::rate::Bucket>,
    /// `max_reauth_per_minute`'s bucket.
    reauth_rate: crate::rate::Bucket,
    /// The listener's `max_bytes_per_second` bucket (`None`: no limit).
    bandwidth: Option<ByteBucket>,
    /// Handling no PUBLISH: subscribers are past their high-water mark (`pressure.rs`).
    paused: Option<Box<pressure::Pause>>,
    /// What was read while paused, to be handled when the pause ends.
    held: pressure::Held,
    /// Acknowledgements of QoS 1/2 PUBLISHes not sent yet, in order (`acks.rs`).
    acks: acks::Acks,
}

/// Serves one connection until it closes, with the `[mqtt]` table's bandwidth
/// limit. Never panics on peer input.
///
/// Not an `async fn` around [`serve_limited`]: a wrapper's future would hold the
/// arguments beside the inner future for the connection's whole life.
pub(crate) fn serve<S: Transport>(
    broker: Broker,
    stream: S,
    peer: Peer,
    admission: Admission,
    authenticator: Arc<dyn Authenticator>,
) -> impl std::future::Future<Output = ()> {
    let bandwidth = Bandwidth::of(broker.config());
    serve_limited(broker, stream, peer, admission, authenticator, bandwidth)
}

/// Serves one connection until it closes, reading at most `bandwidth` from it.
pub(crate) async fn serve_limited<S: Transport>(
    broker: Broker,
    mut stream: S,
    peer: Peer,
    admission: Admission,
    authenticator: Arc<dyn Authenticator>,
    bandwidth: Option<Bandwidth>,
) {
    let origin = authn::Origin {
        peer,
        authenticator,
    };
    // The handshake and the teardown are boxed: a task's future is as large as its
    // largest state, and an idle connection should not carry theirs. The connection's
    // state is boxed too, so that passing it from phase to phase moves a pointer
    // (a moved-from local may keep its room in the future).
    let connected = Box::pin(handshake::connect(&broker, &mut stream, admission, origin)).await;
    if let Some((conn, rbuf, _open)) = connected {
        run(conn, &mut stream, rbuf, bandwidth).await;
    }
}

/// The connected phase: the select loop, then teardown.
async fn run<S: Transport>(
    mut conn: Box<Conn>,
    stream: &mut S,
    mut rbuf: BytesMut,
    bandwidth: Option<Bandwidth>,
) {
    conn.bandwidth = bandwidth.map(|limit| ByteBucket::new(limit, conn.broker.now()));
    let peer = conn.origin.peer.addr;
    let about = crate::session::PeerInfo {
        addr: peer,
        protocol: conn.version,
    };
    conn.session.set_peer(conn.generation, about);
    tracing::debug!(%peer, client = %conn.info.client_id, "client connected");
    conn.resume();
    let close = conn.pump(stream, &mut rbuf).await;
    drop(rbuf);
    let client = conn.info.client_id.clone();
    Box::pin(conn.finish(stream, close)).await;
    tracing::debug!(%peer, client = %client, "client gone");
}

impl Conn {
    async fn pump<S: Transport>(&mut self, stream: &mut S, rbuf: &mut BytesMut) -> Close {
        let signal = self.signal.clone();
        let high_water = self.broker.config().socket_write_high_water;
        let clock = self.broker.clock().clone();
        let (mut deadlines, mut timer, far) = match self.start_pump(rbuf).await {
            Ok(started) => started,
            Err(close) => return close,
        };
        // Whether to let the worker's other tasks run before reading again.
        let mut yield_turn = false;
        loop {
            let turn = self.turn(stream, rbuf, (&mut deadlines, &mut timer), yield_turn);
            if let Err(close) = turn.await {
                return close;
            }
            yield_turn = false;
            let writing = !self.wbuf.is_empty() || stream.wants_write();
            let reading = self.wbuf.len() < 4 * high_water
                && !deadlines.throttled()
                && !self.held.full()
                && !self.acks_full();
            let acking = !self.acks.is_empty();
            tokio::select! {
                biased;
                // Registers the task with the signal, so the deliveries branch below
                // needs no registration of its own.
                code = poll_fn(|cx| signal.poll_close(cx)) => return Close::ByServer(code, close_text(code)),
                r = stream.writable(), if writing => {
                    let written = r.map_err(|_| Close::Lost).and_then(|()| self.write_some(stream));
                    tracing::trace!(client = %self.info.client_id, left = self.wbuf.len(), "write");
                    if let Err(close) = written {
                        return close;
                    }
                }
                r = stream.readable(), if reading => {
                    if r.is_err() {
                        return Close::Lost;
                    }
                    match self.read_some(stream, rbuf, &mut deadlines).await {
                        // A read that filled its room (the socket may hold more) ends
                        // the turn once its packets are answered. One that did not
                        // leaves the socket empty, so the next read usually finds
                        // nothing and the task waits: a client with one request in
                        // flight costs no extra wake-up.
                        Ok(read) => yield_turn = read == Read::Filled,
                        Err(close) => return close,
                    }
                    if let Some(at) = deadlines.next().filter(|at| *at < timer.deadline()) {
                        timer.reset(at);
                    }
                }
                () = poll_fn(|cx| self.acks.poll_ready(cx)), if acking => {
                    if let Err(close) = self.acknowledged(rbuf, &mut deadlines).await {
                        return close;
                    }
                }
                () = poll_fn(|_| if signal.take_deliveries() { Poll::Ready(()) } else { Poll::Pending }) => {}
                () = poll_fn(|cx| timer.poll_elapsed(cx)), if deadlines.next().is_some() => {
                    deadlines.unthrottle(clock.now());
                    if let Some(close) = self.deadline_passed(&deadlines) {
                        return close;
                    }
                    timer.reset(deadlines.next().unwrap_or(far));
                }
            }
        }
    }

    /// The connection's deadlines, its one timer and the far deadline that timer
    /// rests at, once the packets the client pipelined behind CONNECT are handled.
    async fn start_pump(
        &mut self,
        rbuf: &mut BytesMut,
    ) -> Result<(Deadlines, Timer, std::time::Instant), Close> {
        let cfg = self.broker.config();
        let packet_timeout = Duration::from_secs(cfg.packet_read_timeout_secs);
        let clock = self.broker.clock().clone();
        let mut deadlines =
            Deadlines::new(self.keep_alive.mul_f32(1.5), packet_timeout, clock.now());
        deadlines.credential(self.credential_at);
        // Shutdown reaches connections through their signals (the listener asks every
        // attached one to close); one that attached after that sees the token here.
        if self.broker.is_shutting_down() {
            return Err(Close::ByServer(
                ReasonCode::SERVER_SHUTTING_DOWN,
                "server shutting down",
            ));
        }
        // Packets the client pipelined behind CONNECT are already in the buffer.
        let n = self.handle_buffered(rbuf).await?;
        deadlines.read(clock.now(), n, !rbuf.is_empty());
        // One timer for the connection's life (keep alive and packet deadline), moved
        // only when it fires early or a packet deadline comes before it: a fresh
        // `sleep_until` per turn of the loop inserted into and removed from the timer
        // wheel for every packet.
        let far = clock.now() + Duration::from_secs(86_400 * 365);
        let timer = Timer::new(clock, deadlines.next().unwrap_or(far));
        Ok((deadlines, timer, far))
    }

    /// What a turn of [`Conn::pump`] does before it waits: a pause settled,
    /// the queued deliveries drained and written while the socket is known to be
    /// writable, and (`yield_turn`, after a read that filled its room) the worker's
    /// other tasks let run.
    async fn turn<S: Transport>(
        &mut self,
        stream: &mut S,
        rbuf: &mut BytesMut,
        (deadlines, timer): (&mut Deadlines, &mut Timer),
        yield_turn: bool,
    ) -> Result<(), Close> {
        if self.paused.is_some() {
            // Boxed: a task's future is as large as its largest state (see `serve`).
            Box::pin(self.settle_pause(rbuf, deadlines, timer)).await?;
        }
        // A wake-up that came before this drain is covered by it: drop it, so that a
        // delivery this task queued itself (a service's reply to this client) does not
        // cost another turn of the loop. One that comes after is kept for the select.
        self.signal.take_deliveries();
        if self.wbuf.len() < self.broker.config().socket_write_high_water {
            self.drain();
        }
        // Write what is buffered now, while the socket is known to be writable: the
        // common case (a request's PUBACK and reply) then needs no turn of the select
        // for its write. The select below waits when the socket is full.
        if !self.wbuf.is_empty() {
            self.write_some(stream)?;
        }
        if yield_turn {
            // The packets just read are answered above; the worker's other
            // connections get their turn before this one reads again. Without it, a
            // client that kept its socket full (more pipelined requests than one
            // read takes) was served read after read for a whole cooperative
            // budget while the others waited.
            tokio::task::yield_now().await;
        }
        self.release_idle(rbuf);
        Ok(())
    }

    /// Writes what the socket takes now of the write buffer (and of what the transport
    /// holds).
    fn write_some<S: Transport>(&mut self, stream: &mut S) -> Result<(), Close> {
        if self.wbuf.is_empty() {
            return stream.try_flush().map_err(|_| Close::Lost);
        }
        match stream.try_write(&self.wbuf) {
            Ok(n) if n > 0 => self.written(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return Err(Close::Lost),
        }
        Ok(())
    }

    /// Reads what the socket has and handles the whole packets in it.
    async fn read_some<S: Transport>(
        &mut self,
        stream: &mut S,
        rbuf: &mut BytesMut,
        deadlines: &mut Deadlines,
    ) -> Result<Read, Close> {
        self.reserve_read(rbuf);
        let room = rbuf.capacity() - rbuf.len();
        let n = match stream.try_read_buf(rbuf) {
            Ok(n) if n > 0 => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Read::Nothing),
            _ => return Err(Close::Lost),
        };
        let handled = self.handle_buffered(rbuf).await?;
        let now = self.broker.now();
        deadlines.read(now, handled, !rbuf.is_empty());
        if let Some(until) = self.bandwidth.as_mut().and_then(|b| b.spend(n, now)) {
            self.throttled(now, until);
            deadlines.throttle(now, until);
        }
        // A re-authentication among those packets moved it.
        deadlines.credential(self.credential_at);
        Ok(match handled {
            0 => Read::Nothing,
            _ if n == room => Read::Filled,
            _ => Read::Drained,
        })
    }

    /// Counts (and logs, rate-limited) a pause in reading for the bandwidth limit.
    fn throttled(&self, now: std::time::Instant, until: std::time::Instant) {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let m = self.broker.metrics();
        m.bandwidth_throttles.fetch_add(1, Ordering::Relaxed);
        let micros = until.saturating_duration_since(now).as_micros();
        let micros = u64::try_from(micros).unwrap_or(u64::MAX);
        m.bandwidth_throttled_micros
            .fetch_add(micros, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::info!(
                peer = %self.origin.peer.addr,
                client = %self.info.client_id,
                pause_ms = micros / 1000,
                left_out,
                "client sends faster than max_bytes_per_second; not reading its socket meanwhile"
            );
        }
    }

    /// The close a deadline that passed asks for (a late packet is counted); a pause's
    /// deadline cuts off the slow consumers it waits for.
    fn deadline_passed(&mut self, deadlines: &Deadlines) -> Option<Close> {
        let now = self.broker.now();
        if deadlines.pause_due(now) {
            self.cut_off_slow();
        }
        let close = deadlines.expired(now)?;
        if close == Close::Expired {
            let expired = &self.broker.metrics().credentials_expired;
            expired.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                peer = %self.origin.peer.addr,
                client = %self.info.client_id,
                "credential expired without re-authentication; closing the connection"
            );
        } else if deadlines.packet_late(now) {
            let timeouts = &self.broker.metrics().packet_read_timeouts;
            timeouts.fetch_add(1, Ordering::Relaxed);
        }
        Some(close)
    }

    /// Decodes and handles every whole packet in `rbuf`; returns how many.
    async fn handle_buffered(&mut self, rbuf: &mut BytesMut) -> Result<usize, Close> {
        let mut handled = 0;
        loop {
            match self.step(rbuf)? {
                Step::Empty => return Ok(handled),
                Step::Handled => {}
                Step::Wait(handling) => handling.await?,
            }
            handled += 1;
            if self.held.full() || self.acks_full() {
                // The rest waits in the buffer until the pause ends or the
                // acknowledgements ahead of it are sent.
                return Ok(handled);
            }
        }
    }

    /// Decodes the next packet in `rbuf` and handles it, or returns its handling when
    /// that may wait. Not async, so that the decoded packet and the handler's state
    /// are on the thread's stack: a connection's future is as large as its largest
    /// state, for its whole life, and most packets never wait.
    fn step(&mut self, rbuf: &mut BytesMut) -> Result<Step<'_>, Close> {
        let before = rbuf.len();
        match self.codec.decode(rbuf) {
            Ok(Some(p)) => {
                let m = self.broker.metrics();
                m.packets_in.add(packet_type(&p), 1, before - rbuf.len());
                if self.must_hold(&p) {
                    self.hold(p, before - rbuf.len());
                    return Ok(Step::Handled);
                }
                match self.handling(&p) {
                    (true, served) => self.handle_now(p, served).map(|()| Step::Handled),
                    (false, served) => Ok(Step::Wait(Box::pin(self.handle(p, served)))),
                }
            }
            Ok(None) => Ok(Step::Empty),
            Err(e) => {
                tracing::debug!(client = %self.info.client_id, error = %e, "decode error");
                self.broker
                    .metrics()
                    .protocol_errors
                    .fetch_add(1, Ordering::Relaxed);
                Err(Close::from_decode(&e))
            }
        }
    }

    /// Appends one packet to the write buffer. An encode failure is our bug, not the
    /// peer's: it is counted and logged, and closes the connection with 0x83.
    fn send(&mut self, p: &Packet) -> Result<(), Close> {
        tracing::trace!(client = %self.info.client_id, packet = ?p, "sending");
        let stripped;
        let p = match self.problem_info {
            true => p,
            false => {
                stripped = outbound::without_problem_info(p);
                stripped.as_ref().unwrap_or(p)
            }
        };
        self.reserve_write();
        let start = self.wbuf.len();
        self.codec.encode(p, &mut self.wbuf).map_err(|e| {
            encode_failed(&self.broker, &self.info.client_id, "packet", &e);
            Close::ByServer(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR, "encode failed")
        })?;
        let m = self.broker.metrics();
        m.packets_out
            .add(packet_type(p), 1, self.wbuf.len() - start);
        Ok(())
    }
}

/// What [`Conn::step`] did with the next packet in the read buffer.
enum Step<'a> {
    /// There is no whole packet in it.
    Empty,
    /// Handled (or held for the end of a pause).
    Handled,
    /// Its handling, which may wait.
    Wait(Pin<Box<dyn Future<Output = Result<(), Close>> + Send + 'a>>),
}

/// Counts an outbound packet that could not be encoded and logs it, rate-limited:
/// nothing the broker fails to send goes unnoticed.
pub(super) fn encode_failed(broker: &Broker, client: &str, what: &str, e: &EncodeError) {
    static LOG: LogLimit = LogLimit::per_secs(10);
    broker
        .metrics()
        .encode_failures
        .fetch_add(1, Ordering::Relaxed);
    if let Some(left_out) = LOG.allow() {
        tracing::warn!(client, error = %e, left_out, "{what} not sent: it cannot be encoded");
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

#[cfg(test)]
mod tests {
    /// A connection's task is allocated at its largest state's size for its whole life,
    /// and its state (`Conn`) is a second allocation: together they are most of what an
    /// idle connection costs. The handshake, the teardown, the pause and every packet
    /// whose handling may wait are boxed; the packets that never wait are handled on
    /// the thread's stack. 1,120 bytes of future and 560 of `Conn` (in a debug build);
    /// 6,488 bytes of future with `Conn` inside before the boxing.
    #[tokio::test]
    async fn a_connection_task_is_small() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (stream, peer) = l.accept().await.unwrap();
        let broker = crate::Broker::new(crate::BrokerConfig::default());
        let pending = crate::pending::Pending::new(1, 1, broker.clock().clone());
        let admission = pending.admit(peer.ip(), broker.metrics()).unwrap();
        let auth = std::sync::Arc::new(crate::AllowAll);
        let peer = crate::Peer::plain(peer);
        let task = super::serve(broker.clone(), stream, peer, admission, auth);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1200, "a connection's future takes {size} bytes");
        let conn = std::mem::size_of::<super::Conn>();
        assert!(conn <= 600, "a connection's state takes {conn} bytes");
    }
}
