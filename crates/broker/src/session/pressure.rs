//! The session's side of publisher back-pressure: a connected session whose backlog
//! (queued and in flight) passes the high-water mark is *pressed*; the publishers that
//! routed QoS 1/2 messages to it wait (they stop reading, see
//! `connection/pressure.rs`) until it drains to the low-water mark, leaves, or stays
//! pressed for `slow_consumer_timeout_secs` and is cut off as a slow consumer.
//!
//! Why a mark with hysteresis and a list of waiting publishers: a publisher re-checks a
//! session only when woken, and it is woken once per drain from high to low (half the
//! mark), not once per acknowledgement, so a pause costs two wake-ups however many
//! messages flow meanwhile.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use statehub_mqtt_codec::ReasonCode;

use super::{QueueLimits, Session, SessionState};
use crate::signal::Signal;

/// Where a pressed session drains to before its publishers go on: (messages, bytes).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Pressed {
    since: Option<Instant>,
    low: (usize, usize),
}

impl Session {
    /// Whether the session is connected and past its high-water mark (a relaxed read:
    /// the publisher re-checks under the lock before it waits, see [`Session::hold`]).
    pub fn is_pressed(&self) -> bool {
        self.pressed.load(Ordering::Acquire)
    }

    /// Since when the session has been past its high-water mark, if it is.
    pub fn pressed_since(&self) -> Option<Instant> {
        self.state.lock().pressed.since
    }

    /// If the session is still pressed (and connected), registers `waiter` to be woken
    /// when that ends and returns since when it has been; `None`: go on.
    pub fn hold(&self, waiter: &Arc<Signal>) -> Option<Instant> {
        let mut st = self.state.lock();
        let since = st.pressed.since.filter(|_| self.is_connected())?;
        if !st.waiters.iter().any(|w| Arc::ptr_eq(w, waiter)) {
            st.waiters.push(waiter.clone());
        }
        Some(since)
    }

    /// Cuts the session's connection off as a slow consumer (DISCONNECT 0x97) if it has
    /// been pressed for `timeout` at `now`; true if this call did (count it once). The
    /// session keeps its queue (a persistent one under `queue_full_policy` from now on)
    /// and its waiting publishers go on.
    pub fn cut_off_slow(&self, now: Instant, timeout: Duration) -> bool {
        let mut st = self.state.lock();
        let due = st
            .pressed
            .since
            .is_some_and(|since| now.saturating_duration_since(since) >= timeout);
        if !due || !self.is_connected() {
            return false;
        }
        self.set_connected(false);
        let first = st
            .attached
            .as_ref()
            .is_some_and(|a| a.signal.close(ReasonCode::QUOTA_EXCEEDED));
        self.unpress(&mut st);
        first
    }

    /// Marks the session pressed if it is connected and its backlog reached the mark.
    pub(super) fn press(&self, st: &mut SessionState, limits: &QueueLimits, now: Instant) {
        if st.pressed.since.is_some() || !self.is_connected() {
            return;
        }
        let (messages, bytes) = st.counted();
        if messages >= limits.high_messages || bytes >= limits.high_bytes {
            st.pressed = Pressed {
                since: Some(now),
                low: (limits.high_messages / 2, limits.high_bytes / 2),
            };
            self.pressed.store(true, Ordering::Release);
        }
    }

    /// Ends the pressure once the backlog is down to the low-water mark (call after it
    /// shrank): the waiting publishers are woken.
    pub(super) fn relieve(&self, st: &mut SessionState) {
        if st.pressed.since.is_none() {
            return;
        }
        let (messages, bytes) = st.counted();
        if messages <= st.pressed.low.0 && bytes <= st.pressed.low.1 {
            self.unpress(st);
        }
    }

    /// Ends the pressure whatever the backlog (the session left, ended, or was cut
    /// off: an offline session never holds a publisher) and wakes who waits.
    pub(super) fn unpress(&self, st: &mut SessionState) {
        st.pressed = Pressed::default();
        self.pressed.store(false, Ordering::Release);
        for w in st.waiters.drain(..) {
            w.deliveries();
        }
    }
}
