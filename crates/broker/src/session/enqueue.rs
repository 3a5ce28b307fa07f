//! Offering a delivery to a session: the queue bounds (the session's own, and what
//! every session holds together) and what a full queue does to a message (the
//! configured [`QueueFull`] policy), the session store record of a persistent
//! session's copy, and the wake-up of its connection.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;
use statehub_mqtt_codec::{QoS, ReasonCode};

use super::{Session, SessionState};
use crate::config::QueueFull;
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
    /// Queued in a full offline session after its `evicted` oldest queued messages
    /// were dropped to make room (drop-oldest; counted and logged).
    EvictedOldest {
        stored: bool,
        evicted: usize,
        bound: Bound,
    },
    /// QoS 0 while offline, not queued per configuration (not an error: MQTT 5 allows it).
    SkippedOffline,
    /// A bound is reached: QoS 0 dropped (counted) ...
    DroppedQoS0(Bound),
    /// ... or a QoS 1/2 message for a full offline session not queued (drop-newest,
    /// or drop-oldest with nothing it may drop; counted and logged).
    DroppedNewest(Bound),
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
            Enqueued::Queued { stored: true }
                | Enqueued::EvictedOldest { stored: true, .. }
                | Enqueued::SlowConsumer { stored: true, .. }
        )
    }
}

/// Queue bounds, copied from the broker config (the offline bounds; a connected
/// session gets 1.5x, see [`Session::enqueue`]), and what a full queue does.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    /// The high-water mark of a connected session's backlog, past which the
    /// publishers routing QoS 1/2 messages to it wait (see `pressure.rs`).
    pub high_messages: usize,
    pub high_bytes: usize,
    pub queue_qos0_offline: bool,
    pub policy: QueueFull,
}

/// Room a session took for one QoS 1/2 delivery before it is queued, so that a
/// message is queued for all its subscribers or for none (the refuse policy):
/// [`Session::reserve`] takes it, [`Session::enqueue_reserved`] or
/// [`Session::cancel`] gives it back, exactly once.
#[derive(Debug)]
#[must_use = "a ticket holds room in the session until it is used or cancelled"]
pub(crate) struct Ticket {
    weight: usize,
    /// The session is connected and over its bound: it keeps the message and is
    /// disconnected as a slow consumer (see [`Session::enqueue`]).
    over: Option<Bound>,
}

impl Session {
    /// Offers one delivery at `now`, applying the queue bounds and, at a full offline
    /// session, the drop policy (see [`Enqueued`]; the refuse policy is the caller's,
    /// with [`Session::reserve`]: here it drops the newest).
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
        let mut evicted = None;
        if let Some(bound) = self.bound(&st, &d, limits, connected) {
            if d.qos == QoS::AtMostOnce {
                st.dropped_qos0 += 1;
                return Enqueued::DroppedQoS0(bound);
            }
            if connected {
                // Kept for the session although a bound is reached (see `queue`).
                self.usage.take(d.msg.weight());
                return self.queue(st, d, gate, (limits, now), Some(bound));
            }
            let room = (limits.policy == QueueFull::DropOldest)
                .then(|| self.make_room(&mut st, &d, limits))
                .flatten();
            let Some(n) = room else {
                st.dropped_offline += 1;
                return Enqueued::DroppedNewest(bound);
            };
            // None at all if another session gave the room back meanwhile.
            evicted = (n > 0).then_some((n, bound));
        }
        match (self.queue(st, d, gate, (limits, now), None), evicted) {
            (Enqueued::Queued { stored }, Some((evicted, bound))) => Enqueued::EvictedOldest {
                stored,
                evicted,
                bound,
            },
            (outcome, _) => outcome,
        }
    }

    /// Takes room for QoS 1/2 delivery `d` ahead of [`Session::enqueue_reserved`];
    /// the bound it would pass if the session is offline and full. A connected
    /// session always has room: past its bound it is a slow consumer.
    pub fn reserve(&self, d: &Delivery, limits: &QueueLimits) -> Result<Ticket, Bound> {
        let connected = self.is_connected();
        let mut st = self.state.lock();
        let weight = d.msg.weight();
        let over = self.bound(&st, d, limits, connected);
        match over {
            Some(bound) if !connected => return Err(bound),
            Some(_) => self.usage.take(weight),
            None => {}
        }
        st.reserved.0 += 1;
        st.reserved.1 += weight;
        Ok(Ticket { weight, over })
    }

    /// Queues `d` in the room `ticket` took (no bound applies any more).
    pub fn enqueue_reserved(
        self: &Arc<Self>,
        mut d: Delivery,
        ticket: Ticket,
        limits: &QueueLimits,
        now: Instant,
    ) -> Enqueued {
        d.seq = 0;
        d.dup = false;
        let gate = d.gate.take();
        let mut st = self.state.lock();
        st.unreserve(&ticket);
        if st.ended {
            self.usage.give(1, ticket.weight);
            return Enqueued::Ended;
        }
        self.queue(st, d, gate, (limits, now), ticket.over)
    }

    /// Gives back the room `ticket` took: its delivery is not coming.
    pub fn cancel(&self, ticket: Ticket) {
        self.state.lock().unreserve(&ticket);
        self.usage.give(1, ticket.weight);
    }

    /// Queues `d`, whose room is taken, and wakes the connection; `over`: the session
    /// is connected but past a bound. The copy waits behind `gate` if the gate holds
    /// copies like it ([`Gate::holds`]): a stored QoS 2 copy until it is durable, in a
    /// cluster every copy until its PUBLISH's forward is done with; the gate wakes the
    /// session when it opens. A connected session that reaches its high-water
    /// mark is pressed (see `pressure.rs`).
    fn queue(
        self: &Arc<Self>,
        mut st: MutexGuard<'_, SessionState>,
        mut d: Delivery,
        gate: Option<Arc<Gate>>,
        (limits, now): (&QueueLimits, Instant),
        over: Option<Bound>,
    ) -> Enqueued {
        d.gate = gate.filter(|g| g.holds(d.qos, st.persist.is_some()));
        if let Some(g) = &d.gate {
            g.hold(self.clone());
        }
        let stored = st.store_copy(&mut d, now);
        st.push_queue(d);
        if let Some(bound) = over {
            // The consumer is not keeping up: from now on the session is treated as
            // offline (further messages follow the offline bounds), and its
            // connection is closed with 0x97. Reported once per connection.
            self.set_connected(false);
            if let Some(a) = &st.attached {
                // If a close was asked for already, that one stands.
                a.signal.close(ReasonCode::QUOTA_EXCEEDED);
            }
            self.unpress(&mut st);
            return Enqueued::SlowConsumer { stored, bound };
        }
        self.press(&mut st, limits, now);
        if let Some(a) = st.attached.as_ref().filter(|_| self.is_connected()) {
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
        let (messages, bytes) = st.counted();
        if messages >= max_messages || bytes + weight > max_bytes {
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
    /// (messages, bytes) the session's bounds apply to: its queue and what is in
    /// flight count as messages, its queue as bytes, and so does the room reserved.
    pub(super) fn counted(&self) -> (usize, usize) {
        (
            self.queue.len() + self.inflight.len() + self.reserved.0,
            self.queued_bytes + self.reserved.1,
        )
    }

    fn unreserve(&mut self, ticket: &Ticket) {
        self.reserved.0 -= 1;
        self.reserved.1 -= ticket.weight;
    }

    /// Records a persistent session's QoS 1/2 copy in the session store (true if it
    /// did).
    fn store_copy(&mut self, d: &mut Delivery, now: Instant) -> bool {
        if self.persist.is_none() || d.qos == QoS::AtMostOnce {
            return false;
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
