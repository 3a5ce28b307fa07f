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

mod enqueue;
mod evict;
mod exchange;
mod outbox;
mod pressure;
mod snapshot;
mod usage;
mod withdraw;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use statehub_mqtt_codec::{ByteString, ReasonCode, SubscriptionOptions};
use tokio_util::sync::CancellationToken;

use crate::message::{Delivery, Message};
use crate::session_store::{packet_id_for, Persist, SessionChange, SessionStore, StoredSession};
use crate::signal::Signal;

pub(crate) use enqueue::{Bound, Enqueued, QueueLimits, Ticket};
pub(crate) use exchange::{IncomingQos2, PubRec};
pub use snapshot::SessionSnapshot;
pub(crate) use usage::Usage;

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

/// The network side of the connection attached last: its address and protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerInfo {
    pub addr: std::net::SocketAddr,
    pub protocol: statehub_mqtt_codec::ProtocolVersion,
}

/// Mutable session state; see the module docs for who locks it.
#[derive(Debug, Default)]
struct SessionState {
    subscriptions: HashMap<ByteString, Subscription>,
    /// Deliveries not yet written to the client.
    queue: VecDeque<Delivery>,
    queued_bytes: usize,
    /// Room taken for deliveries on their way in (see [`Ticket`]): messages, bytes.
    reserved: (usize, usize),
    /// QoS 1/2 deliveries written and not yet completed, in send order.
    inflight: VecDeque<Inflight>,
    /// The packet ids of `inflight`, so that taking a free id and finding a stored
    /// message's id take one lookup each, not a scan of the window (a client's Receive
    /// Maximum may let 65,535 messages be in flight).
    inflight_ids: InflightIds,
    next_packet_id: u16,
    /// QoS 2 packet ids received (PUBREC sent) awaiting PUBREL.
    incoming_qos2: HashSet<u16>,
    /// Session Expiry Interval in seconds (u32::MAX: never).
    expiry_interval: u32,
    attached: Option<Attachment>,
    /// Generation of the last connection attached (see [`Attachment`]).
    last_generation: u64,
    /// Where the last connection came from and what it spoke (for the admin view).
    peer: Option<PeerInfo>,
    /// Counters for what was not delivered.
    dropped_qos0: u64,
    dropped_offline: u64,
    /// The session store, while the session is persistent (expiry above 0 and a
    /// store configured); see `session_store.rs`.
    persist: Option<Persist>,
    /// Sequence number of the last stored delivery.
    next_seq: u64,
    /// The session ended: it takes no more deliveries (its queue was dropped).
    ended: bool,
    /// Past the high-water mark while connected (see `pressure.rs`).
    pressed: pressure::Pressed,
    /// Publishers' connections waiting for the session to drain (see `pressure.rs`).
    waiters: Vec<Arc<Signal>>,
}

/// A set of packet ids (see [`SessionState::inflight_ids`]).
type InflightIds = std::collections::HashSet<u16, foldhash::fast::FixedState>;

impl SessionState {
    fn push_queue(&mut self, d: Delivery) {
        self.queued_bytes += d.msg.weight();
        self.queue.push_back(d);
    }

    /// (messages, bytes) the session holds, queued and in flight (not the room
    /// reserved for deliveries on their way in, which their tickets give back).
    fn holding(&self) -> (usize, usize) {
        let inflight: usize = self.inflight.iter().map(|i| i.delivery.msg.weight()).sum();
        (
            self.queue.len() + self.inflight.len(),
            self.queued_bytes + inflight,
        )
    }

    fn is_persistent(&self) -> bool {
        self.persist.is_some()
    }

    /// Where `packet_id` is in flight: one lookup when it is not, and the front for a
    /// client that acknowledges in order, as MQTT asks of QoS 1 [MQTT-4.6.0-2].
    fn inflight_position(&self, packet_id: u16) -> Option<usize> {
        if !self.inflight_ids.contains(&packet_id) {
            return None;
        }
        self.inflight.iter().position(|i| i.packet_id == packet_id)
    }

    /// Puts a message in flight (its id is free: see [`SessionState::inflight_position`]).
    fn push_inflight(&mut self, i: Inflight) {
        self.inflight_ids.insert(i.packet_id);
        self.inflight.push_back(i);
    }

    /// Takes the message at `position` out of flight.
    fn remove_inflight(&mut self, position: usize) -> Option<Inflight> {
        let done = self.inflight.remove(position)?;
        self.inflight_ids.remove(&done.packet_id);
        if self.inflight.is_empty() && self.inflight_ids.capacity() > 64 {
            // A burst's window is not kept for the session's life.
            self.inflight_ids = InflightIds::default();
        }
        Some(done)
    }

    /// Takes every message out of flight.
    fn clear_inflight(&mut self) {
        self.inflight.clear();
        self.inflight_ids = InflightIds::default();
    }

    /// Records a change of this persistent session (nothing if it is not one).
    fn record<'a>(&self, change: impl FnOnce(u64) -> SessionChange<'a>) {
        if let Some(p) = &self.persist {
            p.store.record(change(p.incarnation));
        }
    }

    /// The stored message `seq` (`msg`) is done with (acknowledged, expired, dropped,
    /// handed over): its record goes.
    fn forget(&self, seq: u64, msg: &Arc<Message>) {
        if seq != 0 {
            self.record(|incarnation| SessionChange::MessageDone {
                incarnation,
                seq,
                msg,
            });
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
                .chain(self.inflight.iter().map(|i| &i.delivery))
                .filter(|d| d.seq != 0)
                .map(|d| (d.seq, &d.msg));
            p.store.record(SessionChange::Ended {
                incarnation: p.incarnation,
                messages: messages.collect(),
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
    /// Whether `SessionState::pressed` is set, for the publish path to read without
    /// the lock.
    pressed: AtomicBool,
    /// Counted against the broker's bound on persistent sessions (see the table).
    counted: AtomicBool,
    state: Mutex<SessionState>,
    /// What every session's queue holds (see `usage.rs`).
    usage: Arc<Usage>,
    /// Cancelled when the session ends (expiry, clean start, takeover by a new
    /// session); a delayed will waits on it.
    ended: CancellationToken,
}

impl Session {
    /// A session whose deliveries count in `usage`.
    pub fn with_usage(client_id: ByteString, expiry_interval: u32, usage: Arc<Usage>) -> Session {
        Session {
            client_id,
            connected: AtomicBool::new(false),
            pressed: AtomicBool::new(false),
            counted: AtomicBool::new(false),
            state: Mutex::new(SessionState {
                expiry_interval,
                ..Default::default()
            }),
            usage,
            ended: CancellationToken::new(),
        }
    }

    /// A session of its own, unbounded usage (for unit tests).
    #[cfg(test)]
    pub fn new(client_id: ByteString, expiry_interval: u32) -> Session {
        let usage = Arc::new(Usage::new(usize::MAX, usize::MAX));
        Session::with_usage(client_id, expiry_interval, usage)
    }

    /// A session as `store` kept it: its messages queued (to be sent with DUP set,
    /// under their old packet ids), released QoS 2 messages back in flight, its
    /// subscriptions and QoS 2 receipts as they were. The caller indexes the
    /// subscriptions and starts the expiry clock. Its messages count in `usage`
    /// whatever the bounds say (they were accepted before the restart).
    pub fn restore(
        stored: StoredSession,
        store: Arc<dyn SessionStore>,
        usage: Arc<Usage>,
    ) -> Session {
        let session = Session::with_usage(stored.client_id, stored.expiry_interval, usage);
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
                session.usage.take(delivery.msg.weight());
                if released {
                    let packet_id = packet_id_for(delivery.seq);
                    st.push_inflight(Inflight {
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
        let kicked = {
            let mut st = self.state.lock();
            self.unpress(&mut st);
            st.attached.take()
        };
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
        self.unpress(&mut st);
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
            st.ended = true;
            let (messages, bytes) = st.holding();
            self.usage.give(messages, bytes);
            st.queue.clear();
            st.clear_inflight();
            st.queued_bytes = 0;
            self.unpress(&mut st);
            st.subscriptions.keys().cloned().collect()
        };
        self.ended.cancel();
        filters
    }

    /// Stops recording the session's changes without forgetting its stored form (it
    /// moves to another node, which loads it); its incarnation and the messages its
    /// store records refer to, if it was persistent.
    pub fn stop_storing(&self) -> Option<(u64, Vec<Arc<Message>>)> {
        let mut st = self.state.lock();
        let p = st.persist.take()?;
        let messages = st
            .queue
            .iter()
            .chain(st.inflight.iter().map(|i| &i.delivery))
            .filter(|d| d.seq != 0)
            .map(|d| d.msg.clone())
            .collect();
        Some((p.incarnation, messages))
    }

    /// Marks the session as counted against the bound on persistent sessions (or
    /// not); true if that changed.
    pub fn set_counted(&self, on: bool) -> bool {
        self.counted.swap(on, Ordering::AcqRel) != on
    }

    /// Whether the session counts against the bound on persistent sessions.
    pub fn is_counted(&self) -> bool {
        self.counted.load(Ordering::Acquire)
    }

    /// Whether the session is persistent (kept in the session store).
    pub fn is_persistent(&self) -> bool {
        self.state.lock().is_persistent()
    }
}
