//! What wakes a connection task besides its socket: deliveries queued in its session,
//! and a request to close (a takeover, a slow consumer, a service, shutdown).
//!
//! Why not a `Notify`, an `mpsc` channel and the shutdown token's `cancelled()` future:
//! the connection's `select!` polls every branch on every turn of its loop, and each of
//! those three takes a mutex to re-register its waker, about 900 instructions a turn
//! (callgrind, one state store request a turn). A [`Signal`] is one per connection, so
//! its poll is an atomic waker registration and two atomic loads.
//!
//! The protocol is the usual one for an atomic waker: a producer sets its flag, then
//! wakes; the task registers its waker, then reads the flags. A wake that finds no
//! waker registered (the task is running) is not lost: the flag is read after the next
//! registration.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use statehub_mqtt_codec::ReasonCode;

/// One connection's wake-up: see the module docs.
#[derive(Debug, Default)]
pub struct Signal {
    waker: AtomicWaker,
    deliveries: AtomicBool,
    /// 0 while nobody asked the connection to close; else the reason code (every
    /// reason a server closes with is at least 0x80, so never 0).
    close: AtomicU8,
}

impl Signal {
    /// Deliveries were queued: wake the connection to write them.
    pub fn deliveries(&self) {
        self.deliveries.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Asks the connection to close with `reason`. The first request wins; false if
    /// one was already made.
    pub fn close(&self, reason: ReasonCode) -> bool {
        debug_assert!(reason.0 != 0, "a close reason is never 0");
        let first = self
            .close
            .compare_exchange(0, reason.0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        self.waker.wake();
        first
    }

    /// The close reason asked for, if any.
    pub fn close_reason(&self) -> Option<ReasonCode> {
        match self.close.load(Ordering::Acquire) {
            0 => None,
            code => Some(ReasonCode(code)),
        }
    }

    /// Clears the delivery flag; true if it was set. The connection clears it before
    /// it drains its queue (the drain covers every delivery queued before it) and when
    /// it waits ([`Signal::poll_close`] registers the waker that makes this safe).
    pub fn take_deliveries(&self) -> bool {
        self.deliveries.swap(false, Ordering::AcqRel)
    }

    /// Registers the task's waker, then is ready with the close reason if one was asked
    /// for. A task that calls this in the same poll as [`Signal::take_deliveries`] is
    /// woken by deliveries too.
    pub fn poll_close(&self, cx: &mut Context<'_>) -> Poll<ReasonCode> {
        self.waker.register(cx.waker());
        match self.close_reason() {
            Some(reason) => Poll::Ready(reason),
            None => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::sync::Arc;
    use std::time::Duration;

    /// Waits as the connection does: for a close request or deliveries.
    async fn wait(s: &Signal) -> Option<ReasonCode> {
        poll_fn(|cx| match s.poll_close(cx) {
            Poll::Ready(reason) => Poll::Ready(Some(reason)),
            Poll::Pending if s.take_deliveries() => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await
    }

    #[tokio::test]
    async fn a_wake_before_the_wait_is_kept_and_consumed_once() {
        let s = Signal::default();
        s.deliveries();
        assert_eq!(wait(&s).await, None);
        assert!(tokio::time::timeout(Duration::from_millis(20), wait(&s))
            .await
            .is_err());
    }

    #[tokio::test]
    async fn a_wake_from_another_thread_ends_the_wait() {
        let s = Arc::new(Signal::default());
        let producer = s.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            producer.deliveries();
        });
        assert_eq!(wait(&s).await, None);
        t.join().unwrap();
        let closer = s.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            closer.close(ReasonCode::SERVER_SHUTTING_DOWN);
        });
        assert_eq!(wait(&s).await, Some(ReasonCode::SERVER_SHUTTING_DOWN));
        t.join().unwrap();
    }

    #[tokio::test]
    async fn close_wins_over_deliveries_and_the_first_reason_stays() {
        let s = Signal::default();
        s.deliveries();
        assert!(s.close(ReasonCode::SESSION_TAKEN_OVER));
        assert!(!s.close(ReasonCode::QUOTA_EXCEEDED));
        assert_eq!(wait(&s).await, Some(ReasonCode::SESSION_TAKEN_OVER));
        assert_eq!(s.close_reason(), Some(ReasonCode::SESSION_TAKEN_OVER));
    }
}
