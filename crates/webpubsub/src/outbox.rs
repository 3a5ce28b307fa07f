//! The bounded queue between a connection's producers (its own reader, publishers on
//! other connections) and the one task that writes its socket.
//!
//! Bounded in frames and in bytes: a full queue is never waited on by a publisher (one
//! slow subscriber must not stall a group), it is reported so the hub can disconnect the
//! slow consumer. A close request travels beside the queue on a `watch` channel so it
//! overtakes queued frames. A frame may carry a deadline (the REST API's
//! `messageTtlSeconds`): the writer drops it unsent once the deadline has passed.
//!
//! A reliable session's data frames carry their sequence id; once the writer has
//! flushed them to the socket it raises the queue's written watermark, which the
//! session's replay buffer reads to tell frames already written from those still on
//! their way (see `reliable`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::ws::Message;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PushError {
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
pub(crate) struct CloseRequest {
    /// WebSocket close code.
    pub code: u16,
    /// Reason, also the `disconnected` message's text.
    pub reason: String,
}

/// The queue itself: a deque under a mutex, and a `Notify` rung only when a frame
/// lands in an empty queue. A fan-out pushes one frame into each of many queues;
/// compared with a channel per frame (a semaphore permit, a list block, a wake-up
/// each), a push into a queue whose writer is already awake is one uncontended lock,
/// and the writer takes everything queued under one lock per batch.
#[derive(Debug)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Notify,
    /// Live `Outbox` handles: the receiver ends once the last is dropped.
    senders: AtomicUsize,
    /// The highest sequence id flushed to the socket.
    written: AtomicU64,
    max_messages: usize,
    max_bytes: usize,
}

/// A queued frame: its deadline, and its sequence id on a reliable session.
#[derive(Debug)]
struct Queued {
    msg: Message,
    deadline: Option<Instant>,
    seq: Option<u64>,
}

#[derive(Debug, Default)]
struct QueueState {
    frames: VecDeque<Queued>,
    bytes: usize,
    receiver_gone: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The producing side; cheap to clone.
#[derive(Debug)]
pub(crate) struct Outbox {
    queue: Arc<Queue>,
    close: Arc<watch::Sender<Option<CloseRequest>>>,
}

impl Clone for Outbox {
    fn clone(&self) -> Self {
        self.queue.senders.fetch_add(1, Ordering::Relaxed);
        Self {
            queue: Arc::clone(&self.queue),
            close: Arc::clone(&self.close),
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if self.queue.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.queue.ready.notify_one();
        }
    }
}

/// The writer's side.
#[derive(Debug)]
pub(crate) struct OutboxReceiver {
    queue: Arc<Queue>,
    close: watch::Receiver<Option<CloseRequest>>,
}

impl Drop for OutboxReceiver {
    fn drop(&mut self) {
        let mut st = self.queue.lock();
        st.receiver_gone = true;
        st.frames.clear();
        st.bytes = 0;
    }
}

/// A new queue holding at most `max_messages` frames and `max_bytes` bytes.
pub(crate) fn outbox(max_messages: usize, max_bytes: usize) -> (Outbox, OutboxReceiver) {
    let (close_tx, close_rx) = watch::channel(None);
    let queue = Arc::new(Queue {
        state: Mutex::new(QueueState::default()),
        ready: Notify::new(),
        senders: AtomicUsize::new(1),
        written: AtomicU64::new(0),
        max_messages: max_messages.max(1),
        max_bytes,
    });
    (
        Outbox {
            queue: Arc::clone(&queue),
            close: Arc::new(close_tx),
        },
        OutboxReceiver {
            queue,
            close: close_rx,
        },
    )
}

/// The payload bytes of a frame, for byte limits.
pub(crate) fn frame_len(msg: &Message) -> usize {
    match msg {
        Message::Text(t) => t.as_str().len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

impl Outbox {
    /// Queues a frame without waiting.
    pub(crate) fn push(&self, msg: Message) -> Result<(), PushError> {
        self.push_until(msg, None)
    }

    /// Queues a frame that is dropped unsent if still queued at `deadline`.
    pub(crate) fn push_until(
        &self,
        msg: Message,
        deadline: Option<Instant>,
    ) -> Result<(), PushError> {
        self.push_queued(Queued {
            msg,
            deadline,
            seq: None,
        })
    }

    /// Queues a reliable session's data frame with its sequence id.
    pub(crate) fn push_sequenced(
        &self,
        msg: Message,
        deadline: Option<Instant>,
        seq: u64,
    ) -> Result<(), PushError> {
        self.push_queued(Queued {
            msg,
            deadline,
            seq: Some(seq),
        })
    }

    /// The highest sequence id written to the socket so far (0: none).
    pub(crate) fn written(&self) -> u64 {
        self.queue.written.load(Ordering::Acquire)
    }

    fn push_queued(&self, queued: Queued) -> Result<(), PushError> {
        let len = frame_len(&queued.msg);
        let was_empty = {
            let mut st = self.queue.lock();
            if st.receiver_gone {
                return Err(PushError::Closed);
            }
            if st.frames.len() >= self.queue.max_messages || st.bytes + len > self.queue.max_bytes {
                return Err(PushError::Full);
            }
            st.bytes += len;
            st.frames.push_back(queued);
            st.frames.len() == 1
        };
        if was_empty {
            self.queue.ready.notify_one();
        }
        Ok(())
    }

    /// Asks the writer to close the socket; the first request wins. Returns whether
    /// this one was the first.
    pub(crate) fn close(&self, code: u16, reason: impl Into<String>) -> bool {
        let reason = reason.into();
        self.close.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(CloseRequest { code, reason });
            true
        })
    }

    /// A receiver of close requests, for the reader to stop too.
    pub(crate) fn close_watch(&self) -> watch::Receiver<Option<CloseRequest>> {
        self.close.subscribe()
    }
}

impl OutboxReceiver {
    /// The next frame whose deadline has not passed, if one is queued now.
    fn pop(&mut self) -> Option<Frame> {
        let mut st = self.queue.lock();
        loop {
            let q = st.frames.pop_front()?;
            st.bytes -= frame_len(&q.msg);
            if q.deadline.is_none_or(|d| Instant::now() < d) {
                return Some(Frame {
                    msg: q.msg,
                    seq: q.seq,
                });
            }
        }
    }

    /// Records that every frame up to sequence id `seq` was flushed to the socket.
    pub(crate) fn mark_written(&self, seq: u64) {
        self.queue.written.fetch_max(seq, Ordering::AcqRel);
    }

    #[cfg(test)]
    /// The next frame's message whose deadline has not passed; `None` once every
    /// producer is gone.
    pub(crate) async fn recv(&mut self) -> Option<Message> {
        self.recv_frame().await.map(|f| f.msg)
    }

    /// The next frame whose deadline has not passed; `None` once every producer is gone.
    async fn recv_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(msg) = self.pop() {
                return Some(msg);
            }
            if self.queue.senders.load(Ordering::Acquire) == 0 {
                return self.pop();
            }
            self.queue.ready.notified().await;
        }
    }

    #[cfg(test)]
    /// Bytes queued now.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queue.lock().bytes
    }

    #[cfg(test)]
    /// Waits for a close request.
    pub(crate) async fn closed(&mut self) -> CloseRequest {
        wait_close(&mut self.close).await
    }

    /// The next thing for the writer: a close request overtakes queued frames, and
    /// frames past their deadline are skipped.
    pub(crate) async fn next(&mut self) -> Next {
        if self.close.borrow().is_some() {
            return Next::Close(wait_close(&mut self.close).await);
        }
        if let Some(msg) = self.pop() {
            return Next::Frame(msg);
        }
        let mut close = self.close.clone();
        tokio::select! {
            biased;
            req = wait_close(&mut close) => Next::Close(req),
            next = self.recv_frame() => next.map_or(Next::Ended, Next::Frame),
        }
    }

    /// The next queued frame if there is one now, without waiting: lets the writer
    /// put every frame already queued into one socket write. `None` when nothing is
    /// queued or a close request is pending (the writer's `next` then returns it).
    pub(crate) fn try_frame(&mut self) -> Option<Frame> {
        if self.close.borrow().is_some() {
            return None;
        }
        self.pop()
    }
}

/// A frame for the writer, with its sequence id on a reliable session.
#[derive(Debug, PartialEq)]
pub(crate) struct Frame {
    /// The frame.
    pub msg: Message,
    /// Its sequence id, for [`OutboxReceiver::mark_written`].
    pub seq: Option<u64>,
}

/// What [`OutboxReceiver::next`] yields.
#[derive(Debug)]
pub(crate) enum Next {
    /// Close the socket.
    Close(CloseRequest),
    /// Send this frame.
    Frame(Frame),
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
        assert!(matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("keep".into())));
        assert!(
            matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("fresh".into()))
        );
        assert_eq!(rx.queued_bytes(), 0, "dropped frames free their bytes");
    }

    #[tokio::test]
    async fn try_frame_takes_what_is_queued_and_yields_to_a_close() {
        let (out, mut rx) = outbox(8, 100);
        assert_eq!(rx.try_frame(), None);
        out.push(Message::Text("a".into())).unwrap();
        out.push(Message::Text("b".into())).unwrap();
        assert!(matches!(rx.next().await, Next::Frame(f) if f.msg == Message::Text("a".into())));
        assert_eq!(
            rx.try_frame().map(|f| f.msg),
            Some(Message::Text("b".into()))
        );
        assert_eq!(rx.try_frame(), None);
        out.push(Message::Text("c".into())).unwrap();
        out.close(1000, "bye");
        assert_eq!(
            rx.try_frame(),
            None,
            "a pending close overtakes queued frames"
        );
        assert!(matches!(rx.next().await, Next::Close(c) if c.code == 1000));
    }

    #[tokio::test]
    async fn ends_when_every_producer_is_gone_and_refuses_when_the_writer_is() {
        let (out, mut rx) = outbox(8, 100);
        let other = out.clone();
        out.push(Message::Text("x".into())).unwrap();
        drop(out);
        let waiter = tokio::spawn(async move {
            let first = rx.recv().await;
            let second = rx.recv().await;
            (first, second)
        });
        tokio::task::yield_now().await;
        drop(other);
        let (first, second) = waiter.await.unwrap();
        assert_eq!(first, Some(Message::Text("x".into())));
        assert_eq!(second, None);

        let (out, rx) = outbox(8, 100);
        drop(rx);
        assert_eq!(out.push(Message::Text("y".into())), Err(PushError::Closed));
    }

    #[tokio::test]
    async fn sequence_ids_travel_with_frames_to_the_written_watermark() {
        let (out, mut rx) = outbox(8, 100);
        out.push_sequenced(Message::Text("a".into()), None, 7)
            .unwrap();
        out.push(Message::Text("reply".into())).unwrap();
        assert!(matches!(
            rx.next().await,
            Next::Frame(Frame { seq: Some(7), .. })
        ));
        assert_eq!(rx.try_frame().map(|f| f.seq), Some(None));
        assert_eq!(out.written(), 0, "nothing written until the writer says so");
        rx.mark_written(7);
        rx.mark_written(3);
        assert_eq!(out.written(), 7, "the watermark never goes back");
    }

    #[tokio::test]
    async fn first_close_wins() {
        let (out, mut rx) = outbox(1, 10);
        assert!(out.close(1008, "a"));
        assert!(!out.close(1000, "b"));
        assert_eq!(
            rx.closed().await,
            CloseRequest {
                code: 1008,
                reason: "a".into()
            }
        );
    }
}
