//! Session state: what survives a client's network connection (MQTT 5 section 4.1).
//!
//! Ownership: a [`Session`] lives in the broker's session table behind an `Arc`. Its
//! mutable state sits behind a `parking_lot::Mutex` held only for short, non-async
//! critical sections (enqueue one delivery, drain a batch into a socket buffer), so
//! a blocking mutex is cheaper than an async one here. Producers (the router,
//! built-in services) push [`Delivery`]s and wake the attached connection task through
//! its [`Signal`]; the connection task is the only consumer.
//!
//! The state is private to this module: every change goes through a method of
//! [`Session`] that makes it in memory and records it in the session store (when the
//! session is persistent) under the same lock, so the store sees changes in the order
//! they happen. A method whose change the client is about to be told of returns
//! whether it was stored: the caller then awaits the store's barrier first.
//! `exchange.rs` holds the QoS 1/2 exchanges and subscriptions, `outbox.rs` the
//! connection's side (drain, resume, hand-over).

mod exchange;
mod outbox;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use statehub_mqtt_codec::{ByteString, QoS, ReasonCode, SubscriptionOptions};
use tokio_util::sync::CancellationToken;

use crate::message::Delivery;
use crate::session_store::{packet_id_for, Persist, SessionChange, SessionStore, StoredSession};
use crate::signal::Signal;

pub(crate) use exchange::{IncomingQos2, PubRec};

/// A subscription as the session remembers it (for resume and UNSUBSCRIBE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subscription {
    pub options: SubscriptionOptions,
    pub identifier: Option<u32>,
}

/// Where an outgoing QoS 1/2 message stands: the packet it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// QoS 1 PUBLISH sent, waiting for PUBACK.
    Qos1Sent,
    /// QoS 2 PUBLISH sent, waiting for PUBREC.
    Qos2Sent,
    /// PUBREL sent, waiting for PUBCOMP.
    Released,
}

#[derive(Debug, Clone)]
pub(crate) struct Inflight {
    pub packet_id: u16,
    pub stage: Stage,
    pub delivery: Delivery,
}

/// The link from a session to the connection currently attached to it.
#[derive(Debug)]
struct Attachment {
    /// Unique per connection, so a late cleanup of an old connection can tell it no
    /// longer owns the session.
    generation: u64,
    /// Wakes the connection for deliveries, or asks it to close.
    signal: Arc<Signal>,
}

/// What happened to a delivery offered to a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
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

/// Queue bounds, copied from the broker config (the offline bounds; a connected
/// session gets 1.5x, see [`Session::enqueue`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueLimits {
    pub max_messages: usize,
    pub max_bytes: usize,
    pub queue_qos0_offline: bool,
}

/// Mutable session state; see the module docs for who locks it.
#[derive(Debug, Default)]
struct SessionState {
    subscriptions: HashMap<ByteString, Subscription>,
    /// Deliveries not yet written to the client.
    queue: VecDeque<Delivery>,
    queued_bytes: usize,
    /// QoS 1/2 deliveries written and not yet completed, in send order.
    inflight: VecDeque<Inflight>,
    next_packet_id: u16,
    /// QoS 2 packet ids received (PUBREC sent) awaiting PUBREL.
    incoming_qos2: HashSet<u16>,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    expiry_interval: u32,
    attached: Option<Attachment>,
    /// Generation of the last connection attached (see [`Attachment`]).
    last_generation: u64,
    /// Counters for what was not delivered.
    dropped_qos0: u64,
    dropped_offline: u64,
    /// The session store, while the session is persistent (expiry above 0 and a
    /// store configured); see `session_store.rs`.
    persist: Option<Persist>,
    /// Sequence number of the last stored delivery.
    next_seq: u64,
}

impl SessionState {
    fn push_queue(&mut self, d: Delivery) {
        self.queued_bytes += d.msg.weight();
        self.queue.push_back(d);
    }

    fn is_persistent(&self) -> bool {
        self.persist.is_some()
    }

    fn inflight_position(&self, packet_id: u16) -> Option<usize> {
        self.inflight.iter().position(|i| i.packet_id == packet_id)
    }

    /// Records a change of this persistent session (nothing if it is not one).
    fn record<'a>(&self, change: impl FnOnce(u64) -> SessionChange<'a>) {
        if let Some(p) = &self.persist {
            p.store.record(change(p.incarnation));
        }
    }

    /// The stored message `seq` is done with (acknowledged, expired, dropped, handed
    /// over): its record goes.
    fn forget(&self, seq: u64) {
        if seq != 0 {
            self.record(|incarnation| SessionChange::MessageDone { incarnation, seq });
        }
    }

    /// Records the session's subscriptions and expiry as they are now; true if it is
    /// persistent (the record was made).
    fn save(&self, client_id: &str, disconnected: bool) -> bool {
        let Some(p) = &self.persist else {
            return false;
        };
        let subscriptions = self.subscriptions.iter().map(|(f, s)| (f, *s)).collect();
        p.store.record(SessionChange::Saved {
            client_id,
            incarnation: p.incarnation,
            expiry_interval: self.expiry_interval,
            disconnected,
            subscriptions,
        });
        true
    }

    /// Forgets every stored record of the session and stops storing it.
    fn unpersist(&mut self) {
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
pub(crate) struct Session {
    client_id: ByteString,
    connected: AtomicBool,
    state: Mutex<SessionState>,
    /// Cancelled when the session ends (expiry, clean start, takeover by a new
    /// session); a delayed will waits on it.
    ended: CancellationToken,
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

    /// A session as `store` kept it: its messages queued (to be sent with DUP set,
    /// under their old packet ids), released QoS 2 messages back in flight, its
    /// subscriptions and QoS 2 receipts as they were. The caller indexes the
    /// subscriptions and starts the expiry clock.
    pub fn restore(stored: StoredSession, store: Arc<dyn SessionStore>) -> Session {
        let session = Session::new(stored.client_id, stored.expiry_interval);
        {
            let mut st = session.state.lock();
            st.persist = Some(Persist {
                store,
                incarnation: stored.incarnation,
            });
            for m in stored.messages {
                st.next_seq = st.next_seq.max(m.seq);
                let released = m.released;
                let delivery = Delivery::restored(m);
                if released {
                    let packet_id = packet_id_for(delivery.seq);
                    st.inflight.push_back(Inflight {
                        packet_id,
                        stage: Stage::Released,
                        delivery,
                    });
                } else {
                    st.push_queue(delivery);
                }
            }
            st.incoming_qos2.extend(stored.incoming_qos2);
            st.subscriptions.extend(stored.subscriptions);
        }
        session
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

    fn set_connected(&self, on: bool) {
        self.connected.store(on, Ordering::Release);
    }

    /// Resolves once the session has ended.
    pub async fn ended(&self) {
        self.ended.cancelled().await;
    }

    /// Attaches a new connection (`generation`, woken through `signal`) with the
    /// Session Expiry it negotiated. With a session store the session becomes
    /// persistent (expiry above 0) or stops being so (expiry 0). True if a change was
    /// recorded that the CONNACK must wait for.
    pub fn attach(
        &self,
        generation: u64,
        signal: Arc<Signal>,
        expiry: u32,
        store: Option<Arc<dyn SessionStore>>,
    ) -> bool {
        let stored = {
            let mut st = self.state.lock();
            st.expiry_interval = expiry;
            st.last_generation = generation;
            st.attached = Some(Attachment { generation, signal });
            match store {
                None => false,
                Some(_) if expiry == 0 => {
                    // It ends with this connection: nothing of it needs to survive a
                    // restart.
                    st.unpersist();
                    false
                }
                Some(store) => {
                    if st.persist.is_none() {
                        st.persist = Some(Persist {
                            store,
                            incarnation: rand::random::<u64>(),
                        });
                    }
                    st.save(&self.client_id, false)
                }
            }
        };
        self.set_connected(true);
        stored
    }

    /// Detaches the connection attached now, if any, asking it to close with 0x8E
    /// (Session taken over); true if one was attached.
    pub fn take_over(&self) -> bool {
        let kicked = self.state.lock().attached.take();
        if let Some(a) = &kicked {
            a.signal.close(ReasonCode::SESSION_TAKEN_OVER);
        }
        self.set_connected(false);
        kicked.is_some()
    }

    /// Detaches connection `generation` if it still owns the session, leaving the
    /// session with `expiry` (recorded, with its expiry clock running, if the session
    /// is persistent). False if another connection took the session over.
    pub fn detach(&self, generation: u64, expiry: u32) -> bool {
        let mut st = self.state.lock();
        if st
            .attached
            .as_ref()
            .is_none_or(|a| a.generation != generation)
        {
            return false;
        }
        st.attached = None;
        st.expiry_interval = expiry;
        self.set_connected(false);
        if expiry > 0 {
            // Its expiry clock starts now, on disk too (an expiry of 0 ends the
            // session, which forgets it).
            st.save(&self.client_id, true);
        }
        true
    }

    /// Whether no connection attached since connection `generation` left.
    pub fn idle_since(&self, generation: u64) -> bool {
        let st = self.state.lock();
        st.attached.is_none() && st.last_generation == generation
    }

    /// Whether connection `generation` was the last one attached.
    pub fn last_attached(&self, generation: u64) -> bool {
        self.state.lock().last_generation == generation
    }

    /// Ends the session: its stored form is forgotten, whoever waits on
    /// [`Session::ended`] is told, and its subscription filters are returned for the
    /// caller to remove from the index.
    pub fn end(&self) -> Vec<ByteString> {
        let filters = {
            let mut st = self.state.lock();
            st.unpersist();
            st.subscriptions.keys().cloned().collect()
        };
        self.ended.cancel();
        filters
    }

    /// Whether the session is persistent (kept in the session store).
    pub fn is_persistent(&self) -> bool {
        self.state.lock().is_persistent()
    }

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
            return Enqueued::DroppedQoS0;
        }
        if full && !connected {
            st.dropped_offline += 1;
            return Enqueued::DroppedOffline;
        }
        let stored = st.persist.is_some() && d.qos != QoS::AtMostOnce;
        if stored {
            // Only a stored QoS 2 copy needs to wait until it is durable; the gate
            // wakes this session when it opens.
            d.gate = gate.filter(|_| d.qos == QoS::ExactlyOnce);
            if let Some(g) = &d.gate {
                g.hold(self.clone());
            }
            st.next_seq += 1;
            d.seq = st.next_seq;
            st.record(|incarnation| SessionChange::Message {
                incarnation,
                seq: d.seq,
                message: d.queued(),
                released: false,
                now,
            });
        }
        st.push_queue(d);
        if full {
            // The consumer is not keeping up: from now on the session is treated as
            // offline (further messages follow the offline bounds), and its
            // connection is closed with 0x97. Reported once per connection.
            self.set_connected(false);
            if let Some(a) = &st.attached {
                // If a close was asked for already, that one stands.
                a.signal.close(ReasonCode::QUOTA_EXCEEDED);
            }
            return Enqueued::SlowConsumer { stored };
        }
        if let Some(a) = st.attached.as_ref().filter(|_| connected) {
            a.signal.deliveries();
        }
        Enqueued::Queued { stored }
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
