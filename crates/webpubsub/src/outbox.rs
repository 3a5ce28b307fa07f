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
//!
//! In a cluster, a reliable session's data frame also carries the ticket of its mirror
//! write: the writer holds it (and everything queued behind it) until the [`Gate`] says
//! the cluster's store has that write (see `mirror.rs`). Frames wait in this queue,
//! under its bounds, so a store that stops taking writes ends in the slow-consumer
//! close, never in unbounded memory.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::extract::ws::Message;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Resolves once every mirror write up to a ticket is stored, with how far the writes
/// got (at least that ticket).
pub(crate) type Gate = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = u64> + Send>> + Send + Sync>;

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

/// A queued frame: its deadline, its sequence id on a reliable session and the ticket
/// of its mirror write (0: none).
#[derive(Debug)]
struct Queued {
    msg: Message,
    deadline: Option<Instant>,
    seq: Option<u64>,
    gate: u64,
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
pub(crate) struct OutboxReceiver {
    queue: Arc<Queue>,
    close: watch::Receiver<Option<CloseRequest>>,
    /// What frames with a mirror ticket wait on (none: they do not wait).
    gate: Option<Gate>,
    /// Mirror writes up to this ticket are stored.
    released: u64,
}

impl std::fmt::Debug for OutboxReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxReceiver")
            .field("released", &self.released)
            .finish_non_exhaustive()
    }
}

/// What the head of the queue is.
enum Head {
    /// A frame to write now.
    Frame(Frame),
    /// A frame whose mirror write, this ticket, is not stored yet.
    Held(u64),
    /// Nothing.
    Empty,
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
            gate: None,
            released: 0,
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
    #[cfg(test)]
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
            gate: 0,
        })
    }

    /// Queues a reliable session's data frame with its sequence id, written to the
    /// socket only once the mirror write `gate` is stored (0: at once).
    pub(crate) fn push_sequenced(
        &self,
        msg: Message,
        deadline: Option<Instant>,
        (seq, gate): (u64, u64),
    ) -> Result<(), PushError> {
        self.push_queued(Queued {
            msg,
            deadline,
            seq: Some(seq),
            gate,
        })
    }

    /// Queues a reply that reaches the socket only once the mirror write `gate` is
    /// stored (0: at once), like a sequenced frame but without a sequence id: a
    /// stream's `streamAck` must not promise more than the session's copy holds.
    pub(crate) fn push_held(&self, msg: Message, gate: u64) -> Result<(), PushError> {
        self.push_queued(Queued {
            msg,
            deadline: None,
            seq: None,
            gate,
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
    /// Holds frames with a mirror ticket until `gate` says their write is stored.
    pub(crate) fn set_gate(&mut self, gate: Gate) {
        self.gate = Some(gate);
    }

    /// The head of the queue, skipping frames whose deadline has passed.
    fn head(&mut self) -> Head {
        let mut st = self.queue.lock();
        loop {
            let Some(q) = st.frames.front() else {
                return Head::Empty;
            };
            if q.deadline.is_some_and(|d| Instant::now() >= d) {
                if let Some(q) = st.frames.pop_front() {
                    st.bytes -= frame_len(&q.msg);
                }
                continue;
            }
            if self.gate.is_some() && q.gate > self.released {
                return Head::Held(q.gate);
            }
            let Some(q) = st.frames.pop_front() else {
                return Head::Empty;
            };
            st.bytes -= frame_len(&q.msg);
            return Head::Frame(Frame {
                msg: q.msg,
                seq: q.seq,
            });
        }
    }

    /// Waits until mirror writes up to `ticket` are stored, unless a close request
    /// comes first (returned).
    pub(crate) async fn hold(&mut self, ticket: u64) -> Option<CloseRequest> {
        let gate = self.gate.as_ref().filter(|_| ticket > self.released)?;
        let stored = gate(ticket);
        let mut close = self.close.clone();
        tokio::select! {
            biased;
            req = wait_close(&mut close) => Some(req),
            reached = stored => {
                self.released = self.released.max(reached);
                None
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
        match self.next().await {
            Next::Frame(f) => Some(f.msg),
            _ => None,
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

    /// The next thing for the writer: a close request overtakes queued frames, frames
    /// past their deadline are skipped, and a frame whose mirror write is not stored
    /// yet is waited for (with everything behind it).
    pub(crate) async fn next(&mut self) -> Next {
        loop {
            if self.close.borrow().is_some() {
                return Next::Close(wait_close(&mut self.close).await);
            }
            match self.head() {
                Head::Frame(f) => return Next::Frame(f),
                Head::Held(ticket) => {
                    if let Some(req) = self.hold(ticket).await {
                        return Next::Close(req);
                    }
                }
                Head::Empty => {
                    if self.queue.senders.load(Ordering::Acquire) == 0 {
                        return match self.head() {
                            Head::Frame(f) => Next::Frame(f),
                            Head::Held(_) => continue,
                            Head::Empty => Next::Ended,
                        };
                    }
                    let mut close = self.close.clone();
                    tokio::select! {
                        biased;
                        req = wait_close(&mut close) => return Next::Close(req),
                        () = self.queue.ready.notified() => {}
                    }
                }
            }
        }
    }

    /// The next queued frame if there is one now, without waiting: lets the writer
    /// put every frame already queued into one socket write. `None` when nothing is
    /// queued, the next frame waits for its mirror write, or a close request is pending
    /// (the writer's `next` then returns it).
    pub(crate) fn try_frame(&mut self) -> Option<Frame> {
        if self.close.borrow().is_some() {
            return None;
        }
        match self.head() {
            Head::Frame(f) => Some(f),
            Head::Held(_) | Head::Empty => None,
        }
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
#[path = "outbox_test.rs"]
mod tests;
