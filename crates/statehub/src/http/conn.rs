//! One accepted HTTP connection's socket. It holds the connection's slot under the cap
//! for as long as the socket is open (after a WebSocket upgrade too: hyper hands this
//! same object to the WebSocket), counts the bytes it moves for the idle timeout, and
//! closes with a lingering close.
//!
//! Lingering close: closing a TCP socket that still has unread input makes the kernel
//! send a reset, which discards what we wrote and the peer has not read yet, such as a
//! 408 or 431 response, or the WebSocket close frame 1009 sent after an oversize frame
//! whose payload is never read. So the socket is first shut down for writing (what we
//! wrote goes out, then our FIN), its input read and discarded until the peer closes or
//! [`LINGER`] passes, and only then closed.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

/// How long a closing connection's input is drained at most.
pub const LINGER: Duration = Duration::from_secs(2);

/// An accepted socket with its slot and byte counter.
#[derive(Debug)]
pub struct Conn {
    /// Always set until the drop hands it to the lingering close.
    stream: Option<TcpStream>,
    slot: Option<OwnedSemaphorePermit>,
    activity: Arc<AtomicU64>,
}

impl Conn {
    pub fn new(stream: TcpStream, slot: OwnedSemaphorePermit) -> Conn {
        Conn {
            stream: Some(stream),
            slot: Some(slot),
            activity: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Bytes read and written so far.
    pub fn activity(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.activity)
    }

    /// The socket and its slot, for a protocol that takes the connection over (MQTT
    /// over WebSocket) and closes it its own way; the slot goes with the socket.
    pub fn into_parts(mut self) -> Option<(TcpStream, OwnedSemaphorePermit)> {
        Some((self.stream.take()?, self.slot.take()?))
    }

    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.stream
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }

    fn count<T>(&self, result: &Poll<io::Result<T>>, bytes: impl FnOnce(&T) -> usize) {
        if let Poll::Ready(Ok(done)) = result {
            self.activity
                .fetch_add(bytes(done) as u64, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = self.stream()?.poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.count(&result, |()| read);
        result
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = self.stream()?.poll_write(cx, buf);
        self.count(&result, |n| *n);
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = self.stream()?.poll_write_vectored(cx, bufs);
        self.count(&result, |n| *n);
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        // Outside a runtime (the process is exiting) the socket just closes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(linger(stream, self.slot.take()));
        }
    }
}

/// Answers a connection over the cap with 503 and closes it the same lingering way;
/// `slot` bounds how many are being refused at once.
pub async fn refuse(mut stream: TcpStream, slot: OwnedSemaphorePermit) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\
        content-length: 0\r\nretry-after: 1\r\n\r\n";
    if let Ok(Ok(())) = tokio::time::timeout(LINGER, stream.write_all(BUSY)).await {
        linger(stream, Some(slot)).await;
    }
}

/// Shuts the socket down for writing and drains its input until the peer closes or
/// [`LINGER`] passes; the slot is freed when the socket closes.
async fn linger(mut stream: TcpStream, slot: Option<OwnedSemaphorePermit>) {
    let _ = tokio::time::timeout(LINGER, async {
        if stream.shutdown().await.is_err() {
            return;
        }
        let mut sink = [0u8; 2048];
        while let Ok(1..) = stream.read(&mut sink).await {}
    })
    .await;
    drop(stream);
    drop(slot);
}
