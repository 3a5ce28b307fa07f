//! Session state: what survives a client's network connection (MQTT 5 section 4.1).
//!
//! Ownership: a [`Session`] lives in the broker's session table behind an `Arc`. Its
//! mutable state sits behind a `parking_lot::Mutex` held only for short, non-async
//! critical sections (enqueue one delivery, drain a batch into a socket buffer), so
//! a blocking mutex is cheaper than an async one here. Producers (the router,
//! built-in services) push [`Delivery`]s and wake the attached connection task through
//! its [`Signal`]; the connection task is the only consumer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use statehub_mqtt_codec::{ByteString, QoS, ReasonCode, SubscriptionOptions};
use tokio_util::sync::CancellationToken;

use crate::message::Delivery;
use crate::session_store::{Persist, SessionChange};
use crate::signal::Signal;

/// A subscription as the session remembers it (for resume and UNSUBSCRIBE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscription {
    pub options: SubscriptionOptions,
    pub identifier: Option<u32>,
}

/// Where an outgoing QoS 1/2 message stands: the packet it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    Qos1Sent,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    Qos2Sent,
    /// PUBREL sent, waiting for PUBCOMP.
    Released,
}

#[derive(Debug, Clone)]
pub struct Inflight {
    pub packet_id: u16,
    pub stage: Stage,
    pub delivery: Delivery,
}

/// The link from a session to the connection currently attached to it.
#[derive(Debug)]
pub struct Attachment {
    /// Unique per connection, so a late cleanup of an old connection can tell it no
    /// longer owns the session.
    pub generation: u64,
    /// Wakes the connection for deliveries, or asks it to close.
    pub signal: Arc<Signal>,
}

/// What happened to a delivery offered to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Queued; `stored`: also recorded in the session store (a persistent session's
    /// QoS 1/2 message), so whoever acknowledges it must await the store's barrier.
    Queued { stored: bool },
    /// QoS 0 while offline, not queued per configuration (not an error: MQTT 5 allows it).
    SkippedOffline,
    /// The queue is full: QoS 0 dropped (counted) ...
    DroppedQoS0,
    /// ... or a QoS 1/2 message for an offline session dropped (counted and logged).
    DroppedOffline,
    /// Full while connected: the consumer is too slow and is being disconnected
    /// with 0x97 (Quota exceeded); the message stays queued for the session.
    SlowConsumer { stored: bool },
}

impl Enqueued {
    /// Whether the delivery was recorded in the session store.
    pub fn stored(self) -> bool {
        matches!(
            self,
            Enqueued::Queued { stored: true } | Enqueued::SlowConsumer { stored: true }
        )
    }
}

/// Mutable session state; see the module docs for who locks it.
#[derive(Debug, Default)]
pub struct SessionState {
    pub subscriptions: HashMap<ByteString, Subscription>,
    /// Deliveries not yet written to the client.
    pub queue: VecDeque<Delivery>,
    pub queued_bytes: usize,
    /// QoS 1/2 deliveries written and not yet completed, in send order.
    pub inflight: VecDeque<Inflight>,
    next_packet_id: u16,
    /// QoS 2 packet ids received (PUBREC sent) awaiting PUBREL.
    pub incoming_qos2: HashSet<u16>,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    pub expiry_interval: u32,
    pub attached: Option<Attachment>,
    /// Generation of the last connection attached (see [`Attachment`]).
    pub last_generation: u64,
    /// Counters for what was not delivered.
    pub dropped_qos0: u64,
    pub dropped_offline: u64,
    /// The session store, while the session is persistent (expiry above 0 and a
    /// store configured); see `session_store.rs`.
    pub(crate) persist: Option<Persist>,
    /// Sequence number of the last stored delivery.
    pub next_seq: u64,
}

impl SessionState {
    /// A packet id not used by any in-flight message [MQTT-2.2.1-3].
    pub fn next_packet_id(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id == 0 {
                continue;
            }
            let id = self.next_packet_id;
            if !self.inflight.iter().any(|i| i.packet_id == id) {
                return id;
            }
        }
    }

    pub fn inflight_position(&self, packet_id: u16) -> Option<usize> {
        self.inflight.iter().position(|i| i.packet_id == packet_id)
    }

    pub fn pop_queue(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.queued_bytes = self.queued_bytes.saturating_sub(d.msg.weight());
        Some(d)
    }

    /// Puts back a delivery just popped (it could not be sent yet).
    pub fn unpop_queue(&mut self, d: Delivery) {
        self.queued_bytes += d.msg.weight();
        self.queue.push_front(d);
    }

    pub fn is_persistent(&self) -> bool {
        self.persist.is_some()
    }

    /// Records a change of this persistent session (nothing if it is not one).
    pub(crate) fn record<'a>(&self, change: impl FnOnce(u64) -> SessionChange<'a>) {
        if let Some(p) = &self.persist {
            p.store.record(change(p.incarnation));
        }
    }

    /// The stored message `seq` is done with (acknowledged, expired, dropped, handed
    /// over): its record goes.
    pub fn forget(&self, seq: u64) {
        if seq != 0 {
            self.record(|incarnation| SessionChange::MessageDone { incarnation, seq });
        }
    }

    /// Records the session's subscriptions and expiry as they are now.
    pub(crate) fn save(&self, client_id: &str, disconnected: bool) {
        if let Some(p) = &self.persist {
            let subscriptions = self.subscriptions.iter().map(|(f, s)| (f, *s)).collect();
            p.store.record(SessionChange::Saved {
                client_id,
                incarnation: p.incarnation,
                expiry_interval: self.expiry_interval,
                disconnected,
                subscriptions,
            });
        }
    }

    /// Forgets every stored record of the session and stops storing it.
    pub(crate) fn unpersist(&mut self) {
        if let Some(p) = self.persist.take() {
            let messages = self
                .queue
                .iter()
                .map(|d| d.seq)
                .chain(self.inflight.iter().map(|i| i.delivery.seq));
            p.store.record(SessionChange::Ended {
                incarnation: p.incarnation,
                messages: messages.filter(|&s| s != 0).collect(),
                incoming_qos2: self.incoming_qos2.iter().copied().collect(),
            });
        }
    }
}

/// A session: identity, connection flag, state and the wake-up for its connection.
#[derive(Debug)]
pub struct Session {
    client_id: ByteString,
    connected: AtomicBool,
    pub state: Mutex<SessionState>,
    /// Cancelled when the session ends (expiry, clean start, takeover by a new
    /// session); a delayed will waits on it.
    pub ended: CancellationToken,
}

/// Queue bounds, copied from the broker config (the offline bounds; a connected
/// session gets 1.5x, see [`Session::enqueue`]).
#[derive(Debug, Clone, Copy)]
pub struct QueueLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub queue_qos0_offline: bool,
}

impl Session {
    pub fn new(client_id: ByteString, expiry_interval: u32) -> Session {
        Session {
            client_id,
            connected: AtomicBool::new(false),
            state: Mutex::new(SessionState {
                expiry_interval,
                ..Default::default()
            }),
            ended: CancellationToken::new(),
        }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    pub fn client_id_bytes(&self) -> &ByteString {
        &self.client_id
    }

    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    pub fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Release);
    }

    /// Offers one delivery, applying the queue bounds (see [`Enqueued`]).
    pub fn enqueue(self: &Arc<Self>, mut d: Delivery, limits: &QueueLimits) -> Enqueued {
        // A delivery handed over from another session starts afresh here.
        d.seq = 0;
        d.dup = false;
        let gate = d.gate.take();
        let connected = self.is_connected();
        let mut st = self.state.lock();
        if !connected && d.qos == QoS::AtMostOnce && !limits.queue_qos0_offline {
            return Enqueued::SkippedOffline;
        }
        // A connected session may hold half as much again as an offline one, so a
        // session that resumes with a full queue has room to drain it; only a
        // consumer that still falls behind by that much is cut off.
        let (max_messages, max_bytes) = if connected {
            (
                limits.max_messages + limits.max_messages / 2,
                limits.max_bytes + limits.max_bytes / 2,
            )
        } else {
            (limits.max_messages, limits.max_bytes)
        };
        let full = st.queue.len() + st.inflight.len() >= max_messages
            || st.queued_bytes + d.msg.weight() > max_bytes;
        if full && d.qos == QoS::AtMostOnce {
            st.dropped_qos0 += 1;
            Enqueued::DroppedQoS0
        } else if full && !connected {
            st.dropped_offline += 1;
            Enqueued::DroppedOffline
        } else {
            let stored = st.persist.is_some() && d.qos != QoS::AtMostOnce;
            if stored {
                // Only a stored QoS 2 copy needs to wait until it is durable; the
                // gate wakes this session when it opens.
                d.gate = gate.filter(|_| d.qos == QoS::ExactlyOnce);
                if let Some(g) = &d.gate {
                    g.hold(self.clone());
                }
                st.next_seq += 1;
                d.seq = st.next_seq;
                let now = std::time::Instant::now();
                st.record(|incarnation| SessionChange::Message {
                    incarnation,
                    seq: d.seq,
                    delivery: &d,
                    released: false,
                    now,
                });
            }
            st.queued_bytes += d.msg.weight();
            st.queue.push_back(d);
            if full {
                // The consumer is not keeping up: from now on the session is treated
                // as offline (further messages follow the offline bounds), and its
                // connection is closed with 0x97. Reported once per connection.
                self.set_connected(false);
                if let Some(a) = &st.attached {
                    // If a close was asked for already, that one stands.
                    a.signal.close(ReasonCode::QUOTA_EXCEEDED);
                }
                Enqueued::SlowConsumer { stored }
            } else {
                if let Some(a) = st.attached.as_ref().filter(|_| connected) {
                    a.signal.deliveries();
                }
                Enqueued::Queued { stored }
            }
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
