//! Persistent sessions beyond the process.
//!
//! The broker keeps sessions in memory; a [`SessionStore`] (`statehub-broker-durable`'s, on
//! the data directory) is told of every change to a session that must survive a restart (one
//! whose Session Expiry Interval is above 0), and the broker acknowledges only once
//! what it acknowledges is durable: CONNACK once the session exists on disk, SUBACK and
//! UNSUBACK once the subscriptions do, PUBACK/PUBREC once the message sits in every
//! persistent subscriber's stored queue, PUBREL once the stored message says so, PUBCOMP
//! once the receipt is gone.
//! Without a store, nothing changes: the in-memory default pays nothing.
//!
//! Packet ids need no writes of their own: a stored message's id is derived from its
//! sequence number in the session ([`packet_id_for`]), so after a restart every
//! message is resent under the id it had, and a QoS 2 receiver recognises it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use statehub_mqtt_codec::{ByteString, QoS};

use crate::message::{Message, SharedVia};
use crate::service::BoxFuture;
use crate::session::{Session, Subscription};

/// Why a session change could not be made durable.
#[derive(Debug, Clone, thiserror::Error)]
#[error("session state not stored: {0}")]
pub struct SessionStoreError(pub Arc<dyn std::error::Error + Send + Sync>);

/// One change to a persistent session. `incarnation` tells apart two sessions that
/// had the same client id one after the other (a Clean Start ends the first).
#[derive(Debug)]
pub enum SessionChange<'a> {
    /// The session exists with these subscriptions and this expiry; `disconnected`
    /// is `None` while a connection is attached (its expiry clock is not running).
    Saved {
        client_id: &'a str,
        incarnation: u64,
        expiry_interval: u32,
        disconnected: bool,
        subscriptions: Vec<(&'a ByteString, Subscription)>,
    },
    /// The session ended: forget it, its messages (by sequence number, with the
    /// message each was recorded with) and its QoS 2 receipts.
    Ended {
        incarnation: u64,
        messages: Vec<(u64, &'a Arc<Message>)>,
        incoming_qos2: Vec<u16>,
    },
    /// A message queued for the session (or, `released`, one whose PUBREL is sent).
    Message {
        incarnation: u64,
        seq: u64,
        message: QueuedRef<'a>,
        released: bool,
        now: Instant,
    },
    /// The message was acknowledged, expired or handed to someone else; `msg` is the
    /// one it was recorded with.
    MessageDone {
        incarnation: u64,
        seq: u64,
        msg: &'a Arc<Message>,
    },
    /// The message was taken back before it reached the client (its publisher was
    /// refused: [`Gate`]): its record goes, and nothing may say the session had it.
    MessageWithdrawn {
        incarnation: u64,
        seq: u64,
        msg: &'a Arc<Message>,
    },
    /// A QoS 2 PUBLISH from the client was received (PUBREC sent) or released.
    IncomingQos2 {
        incarnation: u64,
        packet_id: u16,
        pending: bool,
    },
}

/// Where persistent sessions are kept.
///
/// Contract:
/// * [`record`](Self::record) may be called with a session's lock (and the session
///   table's shard lock) held; it must not block: stage the write and return. Changes
///   are made durable in the order they are recorded.
/// * [`barrier`](Self::barrier) resolves once every change recorded before the call is
///   durable under the store's sync policy, or fails if one never will be (the broker
///   then withholds the acknowledgement and closes the connection).
/// * What [`SessionStore`] users load at start-up is a [`StoredSession`] per session
///   that had not expired, with its messages in sequence order.
/// * Changes recorded between [`begin_group`](Self::begin_group) and the matching
///   [`end_group`](Self::end_group) (from any thread, groups may overlap) are made
///   durable atomically: after a crash, all of them or none. The broker opens a group
///   around routing a QoS 2 PUBLISH and recording its receipt, so a restart never
///   keeps the copies without the receipt (the resent PUBLISH would be routed twice)
///   or the receipt without the copies (the message would be lost). A group never
///   spans an `.await`. A barrier taken while a group is open covers the group.
/// * A message queued for several sessions is one `Arc<Message>`: the changes that
///   record and forget each session's copy ([`SessionChange::Message`],
///   [`SessionChange::MessageDone`], [`SessionChange::Ended`]) name it, so a store can
///   keep the message once and know when no copy refers to it any more. A restored
///   session's copies share the `Arc` the store loaded them with.
/// * [`fetch`](Self::fetch) is for a store shared by several nodes: before a CONNECT
///   without Clean Start takes a client id that has no session on this node, the broker
///   awaits it; a store that keeps the client's session for another node moves it here
///   ([`Broker::adopt_session`](crate::Broker::adopt_session)) before it resolves, so
///   the CONNECT resumes it, and resolves to true. An error refuses the CONNECT (0x80);
///   the client retries.
pub trait SessionStore: Send + Sync + std::fmt::Debug {
    fn record(&self, change: SessionChange<'_>);
    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>>;
    fn begin_group(&self);
    fn end_group(&self);
    /// Opens `gate` once every change recorded before the call is stored, or never
    /// will be because another node owns its session now (its client left this
    /// one), however long the store is out of reach: the QoS 2 copies behind a gate
    /// whose publisher's barrier failed reach their subscribers only with their
    /// records (see [`Gate`]). A store that does not move sessions between nodes
    /// may open it at once.
    fn open_when_stored(&self, gate: Arc<Gate>) {
        gate.open();
    }
    fn fetch(
        &self,
        _broker: &crate::Broker,
        _client_id: &str,
    ) -> BoxFuture<'static, Result<bool, SessionStoreError>> {
        Box::pin(async { Ok(false) })
    }
}

/// An open group of changes (see [`SessionStore::begin_group`]), closed on drop.
pub(crate) struct Group(Arc<dyn SessionStore>);

impl Group {
    pub fn open(store: Arc<dyn SessionStore>) -> Group {
        store.begin_group();
        Group(store)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.0.end_group();
    }
}

/// A session as loaded from a store at start-up.
#[derive(Debug)]
pub struct StoredSession {
    pub client_id: ByteString,
    pub incarnation: u64,
    pub expiry_interval: u32,
    /// Time left before it expires (from now); `None`: it never expires.
    pub expires_in: Option<Duration>,
    pub subscriptions: Vec<(ByteString, Subscription)>,
    /// In sequence order.
    pub messages: Vec<StoredMessage>,
    pub incoming_qos2: Vec<u16>,
}

/// One subscriber's copy of a message as a session queues it: the message, shared by
/// every subscriber, and what is particular to this one.
#[derive(Debug, Clone, Copy)]
pub struct QueuedRef<'a> {
    pub msg: &'a Arc<Message>,
    /// min(message QoS, subscription QoS).
    pub qos: QoS,
    /// The RETAIN flag as it goes to this subscriber.
    pub retain: bool,
    pub subscription_ids: &'a [u32],
    /// The shared-subscription group it came through, if any.
    pub shared: Option<&'a SharedVia>,
}

/// A message of a stored session's queue, as loaded at start-up.
#[derive(Debug)]
pub struct StoredMessage {
    pub seq: u64,
    pub msg: Arc<Message>,
    pub qos: QoS,
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    pub shared: Option<SharedVia>,
    /// PUBREL was sent for it (QoS 2): it waits for PUBCOMP only.
    pub released: bool,
}

/// The packet id a stored message is sent with: its sequence number modulo the id
/// space, never 0. Sequence numbers grow by one per stored message of a session, so
/// two messages in flight share an id only if one waited for 65,535 newer ones; the
/// sender then waits for the old one's acknowledgement (see `outbound.rs`).
pub fn packet_id_for(seq: u64) -> u16 {
    ((seq.wrapping_sub(1) % 65_535) + 1) as u16
}

/// Holds the stored QoS 2 copies of one message back from their subscribers until the
/// message is durable. Otherwise a subscriber could receive a copy (under the packet
/// id of its sequence number), the server die before the copy reached the disk, the
/// publisher resend the message, and the new copy arrive under another packet id: a
/// QoS 2 receiver would deliver it twice. The publisher's connection opens the gate
/// after the barrier that precedes its PUBREC. If that barrier or the forward to the
/// other nodes failed (the copies still behind it are then taken back first, when
/// the fabric can give them again: `Broker::withdraw_refused`), the store opens it
/// once the copies' records are stored ([`SessionStore::open_when_stored`]): a copy
/// given unstored would carry a packet id that a node its session moves to gives to
/// another message, which a QoS 2 receiver still holding the id drops. A fabric opens the gate of a message
/// from another node once the copies, and how far it read, are stored
/// ([`Broker::route_remote_gated`](crate::Broker::route_remote_gated)).
///
/// In a cluster a QoS 1/2 PUBLISH's gate holds every local copy, whatever its
/// session and QoS ([`Gate::every_copy`]): none goes before the other nodes took the
/// message, so a PUBLISH the cluster refused reaches no subscriber here either.
#[derive(Debug, Default)]
pub struct Gate {
    open: AtomicBool,
    /// Holds every copy, not only the stored QoS 2 ones.
    every_copy: bool,
    /// Sessions holding a copy, woken when the gate opens.
    waiting: parking_lot::Mutex<Vec<Arc<Session>>>,
}

impl Gate {
    /// A gate every local copy of the message waits behind, until its forward's
    /// outcome is known (and, for a persistent session's copy, its record stored).
    pub fn every_copy() -> Self {
        Self {
            every_copy: true,
            ..Self::default()
        }
    }

    /// Whether a copy of `qos` for a session with or without a store waits behind it.
    pub(crate) fn holds(&self, qos: QoS, persistent: bool) -> bool {
        self.every_copy || (persistent && qos == QoS::ExactlyOnce)
    }

    /// Whether it holds every copy ([`Gate::every_copy`]), not only stored QoS 2 ones.
    pub(crate) fn takes_every_copy(&self) -> bool {
        self.every_copy
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    pub(crate) fn hold(&self, session: Arc<Session>) {
        self.waiting.lock().push(session);
    }

    /// The sessions that took a copy behind it while it was shut.
    pub(crate) fn holders(&self) -> Vec<Arc<Session>> {
        self.waiting.lock().clone()
    }

    /// Leaves the gate to `store` to open once every change recorded so far is stored
    /// ([`SessionStore::open_when_stored`]), unless no session still holds a copy
    /// behind it: then nothing behind it can go out unstored, and it opens now. So what
    /// a failing store keeps is bounded by the copies sessions queue (their queues'
    /// bounds), not by how many PUBLISHes were refused meanwhile.
    pub(crate) fn leave_to(self: Arc<Self>, store: &dyn SessionStore) {
        let held = self.holders().iter().any(|s| s.holds_behind(&self));
        if held {
            store.open_when_stored(self);
        } else {
            self.open();
        }
    }

    /// Lets the copies behind it go to their subscribers.
    pub fn open(&self) {
        self.open.store(true, Ordering::Release);
        // Woken outside the lock: a session queueing a copy takes its own lock, then
        // this one ([`Gate::hold`]); one that holds after the take wakes itself.
        let waiting = std::mem::take(&mut *self.waiting.lock());
        for session in waiting {
            session.wake();
        }
    }
}

/// The session's link to the store, when it is persistent.
#[derive(Debug, Clone)]
pub(crate) struct Persist {
    pub store: Arc<dyn SessionStore>,
    pub incarnation: u64,
}

#[cfg(test)]
mod tests {
    use super::packet_id_for;

    #[test]
    fn packet_ids_cycle_through_1_to_65535() {
        assert_eq!(packet_id_for(1), 1);
        assert_eq!(packet_id_for(65_535), 65_535);
        assert_eq!(packet_id_for(65_536), 1);
        assert!((0..200_000u64)
            .chain([u64::MAX])
            .all(|s| packet_id_for(s) != 0));
    }
}
