//! Offering a delivery to a session: the queue bounds (the session's own, and what
//! every session holds together), the session store record of a persistent session's
//! copy, and the wake-up of its connection.

use std::sync::Arc;
use std::time::Instant;

use statehub_mqtt_codec::{QoS, ReasonCode};

use super::{Session, SessionState};
use crate::message::Delivery;
use crate::session_store::{Gate, SessionChange};

/// Which bound a delivery hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The session's own queue bounds (`max_queued_messages`, `max_queued_bytes`).
    Session,
    /// What every session holds together (`max_total_queued_*`).
    Broker,
}

/// What happened to a delivery offered to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Queued; `stored`: also recorded in the session store (a persistent session's
    /// QoS 1/2 message), so whoever acknowledges it must await the store's barrier.
    Queued { stored: bool },
    /// QoS 0 while offline, not queued per configuration (not an error: MQTT 5 allows it).
    SkippedOffline,
    /// A bound is reached: QoS 0 dropped (counted) ...
    DroppedQoS0(Bound),
    /// ... or a QoS 1/2 message for an offline session dropped (counted and logged).
    DroppedOffline(Bound),
    /// A bound is reached while connected: the consumer is too slow (or the broker
    /// full) and is being disconnected with 0x97 (Quota exceeded); the message stays
    /// queued for the session.
    SlowConsumer { stored: bool, bound: Bound },
    /// The session ended meanwhile: nobody will read its queue.
    Ended,
}

impl Enqueued {
    /// Whether the delivery was recorded in the session store.
    pub fn stored(self) -> bool {
        matches!(
            self,
            Enqueued::Queued { stored: true } | Enqueued::SlowConsumer { stored: true, .. }
        )
    }
}

/// Queue bounds, copied from the broker config (the offline bounds; a connected
/// session gets 1.5x, see [`Session::enqueue`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub queue_qos0_offline: bool,
}

impl Session {
    /// Offers one delivery at `now`, applying the queue bounds (see [`Enqueued`]).
    pub fn enqueue(
        self: &Arc<Self>,
        mut d: Delivery,
        limits: &QueueLimits,
        now: Instant,
    ) -> Enqueued {
        // A delivery handed over from another session starts afresh here.
        d.seq = 0;
        d.dup = false;
        let gate = d.gate.take();
        let connected = self.is_connected();
        let mut st = self.state.lock();
        if st.ended {
            return Enqueued::Ended;
        }
        if !connected && d.qos == QoS::AtMostOnce && !limits.queue_qos0_offline {
            return Enqueued::SkippedOffline;
        }
        let bound = self.bound(&st, &d, limits, connected);
        if let Some(bound) = bound {
            if d.qos == QoS::AtMostOnce {
                st.dropped_qos0 += 1;
                return Enqueued::DroppedQoS0(bound);
            }
            if !connected {
                st.dropped_offline += 1;
                return Enqueued::DroppedOffline(bound);
            }
            // Kept for the session although a bound is reached (see below).
            self.usage.take(d.msg.weight());
        }
        let stored = st.store_copy(self, &mut d, gate, now);
        st.push_queue(d);
        if let Some(bound) = bound {
            // The consumer is not keeping up: from now on the session is treated as
            // offline (further messages follow the offline bounds), and its
            // connection is closed with 0x97. Reported once per connection.
            self.set_connected(false);
            if let Some(a) = &st.attached {
                // If a close was asked for already, that one stands.
                a.signal.close(ReasonCode::QUOTA_EXCEEDED);
            }
            return Enqueued::SlowConsumer { stored, bound };
        }
        if let Some(a) = st.attached.as_ref().filter(|_| connected) {
            a.signal.deliveries();
        }
        Enqueued::Queued { stored }
    }

    /// The bound `d` would pass, if any; if none, room for it is taken in the
    /// broker-wide usage. A connected session may hold half as much again as an
    /// offline one, so a session that resumes with a full queue has room to drain it;
    /// only a consumer that still falls behind by that much is cut off.
    fn bound(
        &self,
        st: &SessionState,
        d: &Delivery,
        limits: &QueueLimits,
        connected: bool,
    ) -> Option<Bound> {
        let (max_messages, max_bytes) = if connected {
            (
                limits.max_messages + limits.max_messages / 2,
                limits.max_bytes + limits.max_bytes / 2,
            )
        } else {
            (limits.max_messages, limits.max_bytes)
        };
        let weight = d.msg.weight();
        if st.queue.len() + st.inflight.len() >= max_messages
            || st.queued_bytes + weight > max_bytes
        {
            Some(Bound::Session)
        } else if !self.usage.try_take(weight) {
            Some(Bound::Broker)
        } else {
            None
        }
    }

    /// Wakes the attached connection, if any, to look at its queue again.
    pub fn wake(&self) {
        if let Some(a) = &self.state.lock().attached {
            a.signal.deliveries();
        }
    }

    /// Asks the attached connection, if any, to close with `reason`; false if none is
    /// attached or it was already asked to close.
    pub fn kick(&self, reason: ReasonCode) -> bool {
        let st = self.state.lock();
        st.attached.as_ref().is_some_and(|a| a.signal.close(reason))
    }
}

impl SessionState {
    /// Records a persistent session's QoS 1/2 copy in the session store (true if it
    /// did). Only a stored QoS 2 copy needs to wait until the message is durable: it
    /// keeps the `gate`, which wakes `session` when it opens.
    fn store_copy(
        &mut self,
        session: &Arc<Session>,
        d: &mut Delivery,
        gate: Option<Arc<Gate>>,
        now: Instant,
    ) -> bool {
        if self.persist.is_none() || d.qos == QoS::AtMostOnce {
            return false;
        }
        d.gate = gate.filter(|_| d.qos == QoS::ExactlyOnce);
        if let Some(g) = &d.gate {
            g.hold(session.clone());
        }
        self.next_seq += 1;
        d.seq = self.next_seq;
        self.record(|incarnation| SessionChange::Message {
            incarnation,
            seq: d.seq,
            message: d.queued(),
            released: false,
            now,
        });
        true
    }
}
