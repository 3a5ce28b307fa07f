//! The bounded queue between a connection's producers (its own reader, publishers on
//! other connections) and the one task that writes its socket.
//!
//! Bounded in frames and in bytes: a full queue is never waited on by a publisher (one
//! slow subscriber must not stall a group), it is reported so the hub can disconnect the
//! slow consumer. A close request travels beside the queue on a `watch` channel so it
//! overtakes queued frames. A frame may carry a deadline (the REST API's
//! `messageTtlSeconds`): the writer drops it unsent once the deadline has passed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::ws::Message;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// The queue is at its frame or byte limit: the consumer is too slow.
    #[error("outbound queue full")]
    Full,
    /// The writer is gone.
    #[error("connection closed")]
    Closed,
}

/// A request to close the socket with this code, after a `disconnected` message on
/// JSON subprotocols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloseRequest {
    /// WebSocket close code.
    pub code: u16,
    /// Reason, also the `disconnected` message's text.
    pub reason: String,
}

/// The producing side; cheap to clone.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<(Message, Option<Instant>)>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
    close: Arc<watch::Sender<Option<CloseRequest>>>,
}

/// The writer's side.
#[derive(Debug)]
pub struct OutboxReceiver {
    rx: mpsc::Receiver<(Message, Option<Instant>)>,
    bytes: Arc<AtomicUsize>,
    close: watch::Receiver<Option<CloseRequest>>,
}

/// A new queue holding at most `max_messages` frames and `max_bytes` bytes.
pub fn outbox(max_messages: usize, max_bytes: usize) -> (Outbox, OutboxReceiver) {
    let (tx, rx) = mpsc::channel(max_messages.max(1));
    let (close_tx, close_rx) = watch::channel(None);
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            bytes: bytes.clone(),
            max_bytes,
            close: Arc::new(close_tx),
        },
        OutboxReceiver {
            rx,
            bytes,
            close: close_rx,
        },
    )
}

/// The payload bytes of a frame, for byte limits.
pub fn frame_len(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.as_str().len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

impl Outbox {
    /// Queues a frame without waiting.
    pub fn push(&self, msg: Message) -> Result<(), PushError> {
        self.push_until(msg, None)
    }

    /// Queues a frame that is dropped unsent if still queued at `deadline`.
    pub fn push_until(&self, msg: Message, deadline: Option<Instant>) -> Result<(), PushError> {
        let len = frame_len(&msg);
        if self.bytes.load(Ordering::Relaxed) + len > self.max_bytes {
            return Err(PushError::Full);
        }
        self.bytes.fetch_add(len, Ordering::Relaxed);
        self.tx.try_send((msg, deadline)).map_err(|e| {
            self.bytes.fetch_sub(len, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => PushError::Full,
                mpsc::error::TrySendError::Closed(_) => PushError::Closed,
            }
        })
    }

    /// Asks the writer to close the socket; the first request wins.
    pub fn close(&self, code: u16, reason: impl Into<String>) {
        let reason = reason.into();
        self.close.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(CloseRequest { code, reason });
            true
        });
    }

    /// A receiver of close requests, for the reader to stop too.
    pub fn close_watch(&self) -> watch::Receiver<Option<CloseRequest>> {
        self.close.subscribe()
    }
}

impl OutboxReceiver {
    /// The next frame whose deadline has not passed; `None` once every producer is gone.
    pub async fn recv(&mut self) -> Option<Message> {
        loop {
            let (msg, deadline) = self.rx.recv().await?;
            self.bytes.fetch_sub(frame_len(&msg), Ordering::Relaxed);
            if deadline.is_none_or(|d| Instant::now() < d) {
                return Some(msg);
            }
        }
    }

    /// Waits for a close request.
    pub async fn closed(&mut self) -> CloseRequest {
        wait_close(&mut self.close).await
    }

    /// The next thing for the writer: a close request overtakes queued frames, and
    /// frames past their deadline are skipped.
    pub async fn next(&mut self) -> Next {
        loop {
            let next = tokio::select! {
                biased;
                req = wait_close(&mut self.close) => return Next::Close(req),
                next = self.rx.recv() => next,
            };
            let Some((msg, deadline)) = next else {
                return Next::Ended;
            };
            self.bytes.fetch_sub(frame_len(&msg), Ordering::Relaxed);
            if deadline.is_none_or(|d| Instant::now() < d) {
                return Next::Frame(msg);
            }
        }
    }
}

/// What [`OutboxReceiver::next`] yields.
#[derive(Debug)]
pub enum Next {
    /// Close the socket.
    Close(CloseRequest),
    /// Send this frame.
    Frame(Message),
    /// Every producer is gone.
    Ended,
}

async fn wait_close(close: &mut watch::Receiver<Option<CloseRequest>>) -> CloseRequest {
    loop {
        if let Some(req) = close.borrow_and_update().clone() {
            return req;
        }
        if close.changed().await.is_err() {
            return CloseRequest {
                code: 1011,
                reason: "shutting down".into(),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_in_frames_and_bytes() {
        let (out, mut rx) = outbox(2, 10);
        out.push(Message::Text("12345".into())).unwrap();
        assert_eq!(
            out.push(Message::Text("123456".into())),
            Err(PushError::Full)
        );
        out.push(Message::Text("1".into())).unwrap();
        assert_eq!(out.push(Message::Text("1".into())), Err(PushError::Full));
        assert_eq!(rx.recv().await, Some(Message::Text("12345".into())));
        out.push(Message::Text("1234".into())).unwrap();
        drop(rx);
        assert_eq!(out.push(Message::Text("x".into())), Err(PushError::Closed));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_frames_are_dropped_unsent() {
        let (out, mut rx) = outbox(8, 100);
        let soon = Instant::now() + std::time::Duration::from_secs(1);
        out.push_until(Message::Text("old".into()), Some(soon))
            .unwrap();
        out.push(Message::Text("keep".into())).unwrap();
        out.push_until(
            Message::Text("fresh".into()),
            Some(soon + std::time::Duration::from_secs(9)),
        )
        .unwrap();
        tokio::time::advance(std::time::Duration::from_secs(2)).await;
        assert!(matches!(rx.next().await, Next::Frame(m) if m == Message::Text("keep".into())));
        assert!(matches!(rx.next().await, Next::Frame(m) if m == Message::Text("fresh".into())));
        assert_eq!(
            rx.bytes.load(Ordering::Relaxed),
            0,
            "dropped frames free their bytes"
        );
    }

    #[tokio::test]
    async fn first_close_wins() {
        let (out, mut rx) = outbox(1, 10);
        out.close(1008, "a");
        out.close(1000, "b");
        assert_eq!(
            rx.closed().await,
            CloseRequest {
                code: 1008,
                reason: "a".into()
            }
        );
    }
}
