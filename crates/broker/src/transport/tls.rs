//! TLS over a `TcpStream`, readiness-driven like the plain socket.
//!
//! The handshake is tokio-rustls's; the established session is then driven here
//! directly on rustls's [`ServerConnection`]: records are read from and written to the
//! socket with non-blocking `try_read`/`try_write`, so the connection loop waits on
//! the socket's own readiness and never holds a buffer of ours while idle. rustls
//! keeps at most one record of received plaintext and a bounded queue of records to
//! send (its default 64 KiB limit); the connection loop stops handing it plaintext
//! while records are waiting for the socket.

use std::future::Future;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rustls::ServerConnection;
use tokio::net::TcpStream;

use super::Transport;

/// The most plaintext copied out of rustls per read (one record's worth).
const READ_MAX: usize = 16 * 1024;

/// Gives the current server configuration of a TLS listener; replacing what it
/// returns (a reloaded certificate) affects new handshakes only.
pub trait TlsSource: Send + Sync + std::fmt::Debug + 'static {
    fn server_config(&self) -> Arc<rustls::ServerConfig>;
}

/// An established TLS session on a socket.
#[derive(Debug)]
pub(crate) struct TlsStream {
    tcp: TcpStream,
    tls: Box<ServerConnection>,
    /// rustls holds decrypted bytes (or a close) not yet read: readable at once.
    buffered: bool,
}

impl TlsStream {
    /// Runs the TLS handshake on `tcp`.
    pub async fn accept(tcp: TcpStream, config: Arc<rustls::ServerConfig>) -> io::Result<Self> {
        let stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
        let (tcp, tls) = stream.into_inner();
        Ok(TlsStream::from_parts(tcp, tls))
    }

    /// An established session another server ran the handshake (and maybe more) of.
    pub fn from_parts(tcp: TcpStream, tls: ServerConnection) -> Self {
        let mut stream = TlsStream {
            tcp,
            tls: Box::new(tls),
            buffered: false,
        };
        // Application data sent with the handshake's last flight is already in rustls.
        stream.buffered = stream.has_plaintext();
        stream
    }

    /// The socket under the session.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Copies decrypted bytes into `out` without waiting: how many (`Ok(0)` at the end
    /// of the stream), or `WouldBlock`.
    pub fn try_read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let mut eof = false;
        loop {
            match self.tls.reader().read(out) {
                Ok(n) => {
                    self.buffered = n > 0 && self.has_plaintext();
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.buffered = false,
                // The peer closed the socket without close_notify.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if eof {
                return Ok(0);
            }
            eof = self.read_records()? == 0;
            // A key update or an alert rustls wants to answer.
            if self.tls.wants_write() {
                let _ = self.try_flush();
            }
        }
    }

    /// The certificate chain the client presented (and the verifier accepted).
    pub fn peer_certificates(&self) -> Vec<Bytes> {
        self.tls.peer_certificates().map_or_else(Vec::new, |chain| {
            chain
                .iter()
                .map(|c| Bytes::copy_from_slice(c.as_ref()))
                .collect()
        })
    }

    fn has_plaintext(&mut self) -> bool {
        self.tls.process_new_packets().map_or(true, |state| {
            state.plaintext_bytes_to_read() > 0 || state.peer_has_closed()
        })
    }

    /// Reads records from the socket into rustls and decrypts them.
    fn read_records(&mut self) -> io::Result<usize> {
        let n = self.tls.read_tls(&mut Socket(&self.tcp))?;
        if let Err(e) = self.tls.process_new_packets() {
            // The alert rustls queued tells the peer why, if the socket takes it.
            let _ = self.try_flush();
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        Ok(n)
    }
}

impl Transport for TlsStream {
    async fn readable(&self) -> io::Result<()> {
        if self.buffered {
            return Ok(());
        }
        self.tcp.readable().await
    }

    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send + '_ {
        self.tcp.writable()
    }

    fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        let start = buf.len();
        let room = (buf.capacity() - start).clamp(1, READ_MAX);
        buf.resize(start + room, 0);
        let read = self.try_read(&mut buf[start..]);
        buf.truncate(start + *read.as_ref().unwrap_or(&0));
        read
    }

    fn try_write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.try_flush()?;
        if self.tls.wants_write() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.tls.writer().write(buf)?;
        self.try_flush()?;
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn wants_write(&self) -> bool {
        self.tls.wants_write()
    }

    fn try_flush(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut Socket(&self.tcp)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    async fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.try_write(buf) {
                Ok(n) => buf = &buf[n..],
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
        self.flush().await
    }

    async fn shutdown(&mut self) -> io::Result<()> {
        self.tls.send_close_notify();
        self.flush().await?;
        tokio::io::AsyncWriteExt::shutdown(&mut self.tcp).await
    }
}

impl TlsStream {
    /// Waits until every queued record is on the socket.
    async fn flush(&mut self) -> io::Result<()> {
        loop {
            self.try_flush()?;
            if !self.tls.wants_write() {
                return Ok(());
            }
            self.tcp.writable().await?;
        }
    }
}

/// The socket as blocking-style I/O for rustls, never blocking: `WouldBlock` when
/// the socket is not ready (which also clears tokio's readiness for it).
struct Socket<'a>(&'a TcpStream);

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl Write for Socket<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
