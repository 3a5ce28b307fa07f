//! MQTT over a WebSocket (MQTT 5.0 and 3.1.1, section 6), readiness-driven like the
//! plain socket.
//!
//! The MQTT byte stream travels in binary messages, with no alignment between
//! packets and messages [MQTT-6.0.0-2]: a message's payload is handed to the
//! connection as if it had come from a socket, so a packet split over several
//! messages (or fragments) and several packets in one message are both read as a
//! stream. A text message is refused with close 1003 [MQTT-6.0.0-1].
//!
//! tungstenite does the framing on the socket's own readiness (`try_read` and
//! `try_write`, as the TLS transport does with rustls), over a plain socket (`ws://`)
//! or a TLS session on one (`wss://`, a [`Wire`] too): it bounds every frame and
//! message ([`Limits`]), answers pings and drives the closing handshake. Memory per
//! connection: tungstenite's read buffer ([`READ_CHUNK`], plus the frame being read),
//! at most one received message not yet read by the connection, and at most one
//! [`WRITE_CHUNK`] waiting for the socket.

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::net::TcpStream;
use tungstenite::error::{CapacityError, Error as WsError, ProtocolError};
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

use super::tls::TlsStream;
use super::Transport;
use crate::ratelimit::LogLimit;

/// How much tungstenite reads from the socket at a time (its read buffer starts at this
/// size and grows only to hold a larger frame).
pub const READ_CHUNK: usize = 4096;
/// The most bytes of the connection's write buffer sent in one WebSocket message.
pub const WRITE_CHUNK: usize = 64 * 1024;
/// Room a message may take beyond the largest packet, for small packets sent with it.
pub const FRAMING: usize = 16 * 1024;
/// How long our close frame may take to reach a client that does not read.
const CLOSE_FLUSH: Duration = Duration::from_secs(1);
/// How long a dropped connection's input is drained at most (see [`linger`]).
const LINGER: Duration = Duration::from_secs(2);

/// Bounds on what a client sends.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest message (all its fragments) and largest frame, in payload bytes.
    pub max_message: usize,
}

impl Limits {
    /// A message may hold the largest packet the broker accepts plus [`FRAMING`].
    pub fn for_packets(max_packet_size: u32) -> Limits {
        let max_packet = usize::try_from(max_packet_size).unwrap_or(usize::MAX);
        Limits {
            max_message: max_packet.saturating_add(FRAMING),
        }
    }

    fn config(self) -> WebSocketConfig {
        WebSocketConfig::default()
            .read_buffer_size(READ_CHUNK)
            // Each message goes to the socket when written; the connection batches.
            .write_buffer_size(0)
            .max_write_buffer_size(2 * WRITE_CHUNK + 1024)
            .max_message_size(Some(self.max_message))
            .max_frame_size(Some(self.max_message))
    }
}

/// What the WebSocket layer refused, by close code.
#[derive(Debug, Default)]
pub struct Refusals {
    /// Text messages: close 1003.
    pub text: AtomicU64,
    /// Frames or messages over [`Limits::max_message`]: close 1009.
    pub too_big: AtomicU64,
    /// WebSocket protocol violations (unmasked frames, bad opcodes...): close 1002.
    pub protocol: AtomicU64,
}

/// What a WebSocket runs on: a socket, or a TLS session on one.
pub(crate) trait Wire: Transport + std::fmt::Debug {
    /// Reads what is there now into `buf`: `Ok(0)` at the end, `WouldBlock` if nothing.
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize>;

    /// The socket (for its address, and to drain it when closing).
    fn tcp(&self) -> &TcpStream;
}

impl Wire for TcpStream {
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TcpStream::try_read(self, buf)
    }

    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Wire for TlsStream {
    fn try_read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        TlsStream::try_read(self, buf)
    }

    fn tcp(&self) -> &TcpStream {
        TlsStream::tcp(self)
    }
}

/// A WebSocket carrying MQTT, server side, on an upgraded socket.
#[derive(Debug)]
pub(crate) struct WsStream<W: Wire = TcpStream> {
    ws: WebSocket<Socket<W>>,
    /// The rest of a received message the connection has not read yet.
    pending: Bytes,
    /// tungstenite may hold frames already read from the socket: readable at once.
    buffered: bool,
    /// tungstenite holds bytes the socket has not taken (a message, a pong, a close).
    unflushed: bool,
    /// A failure found while returning data, reported on the next read.
    failed: Option<io::ErrorKind>,
    refusals: Arc<Refusals>,
    /// Released when the socket closes, after the lingering close (the HTTP
    /// server's slot under its connection cap).
    hold: Option<Hold>,
}

/// What the caller keeps alive for as long as the socket is open.
pub type Hold = Box<dyn std::any::Any + Send + Sync>;

impl<W: Wire> WsStream<W> {
    /// `read` holds what the client sent after its handshake and the HTTP server read.
    pub fn new(wire: W, read: Bytes, limits: Limits, refusals: Arc<Refusals>, hold: Hold) -> Self {
        let ws = WebSocket::from_partially_read(
            Socket(Some(wire)),
            read.to_vec(),
            Role::Server,
            Some(limits.config()),
        );
        WsStream {
            ws,
            pending: Bytes::new(),
            buffered: !read.is_empty(),
            unflushed: false,
            failed: None,
            refusals,
            hold: Some(hold),
        }
    }

    /// Sends a close frame with `code` and counts and logs (rate-limited) why.
    fn refuse(&mut self, code: CloseCode, error: &dyn std::fmt::Display) -> io::ErrorKind {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let (counter, reason) = match code {
            CloseCode::Unsupported => (&self.refusals.text, "MQTT needs binary frames"),
            CloseCode::Size => (&self.refusals.too_big, "message too big"),
            _ => (&self.refusals.protocol, "WebSocket protocol error"),
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            let peer = self.tcp().and_then(TcpStream::peer_addr).ok();
            tracing::info!(?peer, %error, left_out, "MQTT WebSocket closed: {reason}");
        }
        let frame = CloseFrame {
            code,
            reason: reason.into(),
        };
        if self.ws.can_write() {
            self.unflushed = true;
            let _ = self.ws.close(Some(frame));
        }
        io::ErrorKind::InvalidData
    }

    /// The next message's payload into `pending`; `Ok(false)`: nothing more now
    /// (`WouldBlock`) or the stream ended (`ended` set).
    fn next_message(&mut self, ended: &mut bool) -> Result<bool, io::ErrorKind> {
        loop {
            let error = match self.ws.read() {
                Ok(Message::Binary(payload)) => {
                    self.pending = payload;
                    return Ok(true);
                }
                // A ping's pong (or the answer to a close) is queued in tungstenite.
                Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_)) => {
                    self.unflushed = true;
                    continue;
                }
                Ok(Message::Close(_)) => {
                    self.unflushed = true;
                    *ended = true;
                    return Ok(false);
                }
                Ok(Message::Text(_)) => {
                    return Err(self.refuse(CloseCode::Unsupported, &"a text message"));
                }
                Err(e) => e,
            };
            return match error {
                WsError::Io(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
                WsError::ConnectionClosed
                | WsError::AlreadyClosed
                | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => {
                    *ended = true;
                    Ok(false)
                }
                WsError::Io(e) => Err(e.kind()),
                e @ WsError::Capacity(CapacityError::MessageTooLong { .. }) => {
                    Err(self.refuse(CloseCode::Size, &e))
                }
                e @ WsError::Utf8(_) => Err(self.refuse(CloseCode::Unsupported, &e)),
                e => Err(self.refuse(CloseCode::Protocol, &e)),
            };
        }
    }

    /// Waits until every queued byte is on the socket (or the closing handshake ended).
    async fn flush(&mut self) -> io::Result<()> {
        loop {
            self.try_flush()?;
            if !self.unflushed {
                return Ok(());
            }
            self.wire()?.writable().await?;
        }
    }

    fn wire(&self) -> io::Result<&W> {
        self.ws.get_ref().wire()
    }

    fn tcp(&self) -> io::Result<&TcpStream> {
        Ok(self.wire()?.tcp())
    }
}

impl<W: Wire> Transport for WsStream<W> {
    async fn readable(&self) -> io::Result<()> {
        if self.buffered || self.failed.is_some() || !self.pending.is_empty() {
            return Ok(());
        }
        self.wire()?.readable().await
    }

    async fn writable(&self) -> io::Result<()> {
        self.wire()?.writable().await
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if let Some(kind) = self.failed.take() {
            return Err(kind.into());
        }
        let mut read = 0;
        let mut ended = false;
        loop {
            if !self.pending.is_empty() {
                let room = buf.capacity() - buf.len();
                if room == 0 && read > 0 {
                    // Full: what is left (here or in tungstenite) is read next time.
                    self.buffered = true;
                    return Ok(read);
                }
                let take = self.pending.len().min(room.max(1));
                buf.extend_from_slice(&self.pending.split_to(take));
                read += take;
                continue;
            }
            match self.next_message(&mut ended) {
                Ok(true) => continue,
                Ok(false) => {
                    self.buffered = ended;
                    if read > 0 || ended {
                        return Ok(read);
                    }
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Err(kind) if read > 0 => {
                    self.failed = Some(kind);
                    return Ok(read);
                }
                Err(kind) => return Err(kind.into()),
            }
        }
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.try_flush()?;
        if self.unflushed {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = buf.len().min(WRITE_CHUNK);
        let message = Message::Binary(Bytes::copy_from_slice(&buf[..n]));
        match self.ws.write(message) {
            Ok(()) => {}
            // The frame is kept in tungstenite's buffer until the socket takes it.
            Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(WsError::Io(e)) => return Err(e),
            Err(e) => return Err(io::Error::new(io::ErrorKind::BrokenPipe, e)),
        }
        self.unflushed = true;
        self.try_flush()?;
        Ok(n)
    }

    fn wants_write(&self) -> bool {
        self.unflushed
    }

    fn try_flush(&mut self) -> io::Result<()> {
        if !self.unflushed {
            return Ok(());
        }
        match self.ws.flush() {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => {
                self.unflushed = false;
                Ok(())
            }
            Err(WsError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(WsError::Io(e)) => Err(e),
            Err(e) => Err(io::Error::new(io::ErrorKind::BrokenPipe, e)),
        }
    }

    async fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.try_write(buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.wire()?.writable().await?,
                Err(e) => return Err(e),
            }
        }
        self.flush().await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        if self.ws.can_write() {
            self.unflushed = true;
            let _ = self.ws.close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }));
        }
        // A client that does not read cannot hold the connection open (TLS flushes its
        // close_notify the same way).
        let _ = tokio::time::timeout(CLOSE_FLUSH, self.flush()).await;
        match &mut self.ws.get_mut().0 {
            Some(wire) => tokio::time::timeout(CLOSE_FLUSH, wire.shutdown())
                .await
                .unwrap_or(Ok(())),
            None => Ok(()),
        }
    }
}

impl<W: Wire> Drop for WsStream<W> {
    /// Closes the way the HTTP listener does: a close frame if none was sent (a client
    /// that never sent CONNECT), then a lingering close, so that unread input (the
    /// rest of a refused message) does not make the kernel reset the connection and
    /// discard the close frame before the client reads it.
    fn drop(&mut self) {
        if self.ws.can_write() {
            let _ = self.ws.close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }));
        }
        let Some(wire) = self.ws.get_mut().0.take() else {
            return;
        };
        let hold = self.hold.take();
        // Outside a runtime (the process is exiting) the socket just closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(wire, hold));
        }
    }
}

/// Shuts the socket down for writing (after TLS's close_notify) and drains its input
/// until the peer closes or [`LINGER`] passes; `hold` is released when it closes.
async fn linger<W: Wire>(mut wire: W, hold: Option<Hold>) {
    let _ = tokio::time::timeout(LINGER, async {
        // Already shut down after a closing handshake: drain all the same.
        let _ = wire.shutdown().await;
        let tcp = wire.tcp();
        let mut sink = [0u8; 2048];
        loop {
            if tcp.readable().await.is_err() {
                return;
            }
            match tcp.try_read(&mut sink) {
                Ok(1..) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Ok(0) | Err(_) => return,
            }
        }
    })
    .await;
    drop(wire);
    drop(hold);
}

/// The wire as blocking-style I/O for tungstenite, never blocking: `WouldBlock` when
/// the socket is not ready (which also clears tokio's readiness for it), or when TLS
/// records are still waiting for it on a flush. Always set until the drop hands it to
/// [`linger`].
#[derive(Debug)]
struct Socket<W>(Option<W>);

impl<W: Wire> Socket<W> {
    fn wire(&self) -> io::Result<&W> {
        self.0
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    fn wire_mut(&mut self) -> io::Result<&mut W> {
        self.0
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl<W: Wire> Read for Socket<W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.wire_mut()?.try_read(buf)
    }
}

impl<W: Wire> Write for Socket<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.wire_mut()?.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        let wire = self.wire_mut()?;
        wire.try_flush()?;
        if wire.wants_write() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(())
    }
}
