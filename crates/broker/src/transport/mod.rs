//! What a connection task reads and writes: a plain `TcpStream`, a TLS session over
//! one ([`tls::TlsStream`]), or MQTT over a WebSocket on one ([`ws::WsStream`]).
//!
//! The connection loop is readiness-based (wait until readable, then read what is
//! there without blocking; likewise for writes) so that an idle connection holds no
//! buffer. [`Transport`] is that interface. The connection code is generic over it,
//! so the plain-TCP path is the same machine code as with a bare `TcpStream`: a TLS
//! listener or the WebSocket endpoint costs nothing to the connections of a plain one.

pub mod tls;
pub mod ws;

use std::future::Future;
use std::io;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A byte stream to a client, driven by readiness.
pub(crate) trait Transport: Send + Sync + 'static {
    /// Resolves when [`Transport::try_read_buf`] may make progress.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send + '_;

    /// Resolves when [`Transport::try_write`] or [`Transport::try_flush`] may make
    /// progress.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send + '_;

    /// Appends what can be read now to `buf` (into its spare capacity): `Ok(0)` at the
    /// end of the stream, `WouldBlock` if nothing is there yet.
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize>;

    /// Takes bytes from non-empty `buf` without waiting: how many, or `WouldBlock`.
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize>;

    /// Bytes taken by [`Transport::try_write`] but not on the socket yet (TLS
    /// records): the connection waits for writability until they are.
    fn wants_write(&self) -> bool;

    /// Pushes those bytes out without waiting.
    fn try_flush(&mut self) -> io::Result<()>;

    /// Writes all of `buf` and flushes.
    fn write_all<'a>(
        &'a mut self,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a;

    /// Ends our side of the stream (a WebSocket close frame or TLS close_notify, then FIN).
    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_;
}

impl Transport for TcpStream {
    #[inline]
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        TcpStream::readable(self)
    }

    #[inline]
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        TcpStream::writable(self)
    }

    #[inline]
    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        TcpStream::try_read_buf(self, buf)
    }

    #[inline]
    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        TcpStream::try_write(self, buf)
    }

    #[inline]
    fn wants_write(&self) -> bool {
        false
    }

    #[inline]
    fn try_flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn write_all<'a>(
        &'a mut self,
        buf: &'a [u8],
    ) -> impl Future<Output = io::Result<()>> + Send + 'a {
        AsyncWriteExt::write_all(self, buf)
    }

    fn shutdown(&mut self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        AsyncWriteExt::shutdown(self)
    }
}
