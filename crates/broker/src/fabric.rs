//! Scale-out: the seam through which several brokers act as one.
//!
//! A [`Fabric`] (`statehub-broker-redis`'s, on Redis) carries what one node must tell
//! the others: the messages published here, clients connecting here (so another node's
//! connection with the same client id is taken over) and which shared-subscription
//! groups have members here. Without one nothing changes: the single node checks one
//! `OnceLock` per PUBLISH and pays nothing else.
//!
//! Routing with a fabric, on the publisher's node: the message goes to this node's
//! subscribers at once (`Broker::route_with`), except shared groups the fabric gives to
//! another node ([`SharedPicks`]); then [`Fabric::forward`] hands it, with those picks,
//! to the other nodes, which deliver it to their own subscribers with
//! [`Broker::route_remote_gated`] (and never forward it again). A QoS 1/2 PUBLISH is
//! acknowledged once the forward is accepted.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use statehub_mqtt_codec::ReasonCode;

use crate::message::Message;
use crate::service::BoxFuture;
use crate::session_store::{Gate, SessionStore};
use crate::Broker;

/// Why a message could not be handed to the other nodes.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FabricError {
    /// The other nodes are out of reach (the shared medium is down).
    #[error("the cluster is unavailable: {0}")]
    Unavailable(Arc<str>),
    /// More messages wait to be forwarded than the fabric holds.
    #[error("the cluster's forwarding queue is full")]
    Full,
}

impl FabricError {
    /// The reason code a publisher is answered with.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            FabricError::Unavailable(_) => ReasonCode::UNSPECIFIED_ERROR,
            FabricError::Full => ReasonCode::QUOTA_EXCEEDED,
        }
    }
}

/// Which node delivers a message to each shared-subscription group it matches, cluster
/// wide, so that each message reaches exactly one member of each group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedPicks {
    picks: Vec<SharedPick>,
}

/// One group's pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedPick {
    pub filter: Arc<str>,
    pub group: Arc<str>,
    /// The node whose members get it.
    pub node: Arc<str>,
    /// Whether that node is this one.
    pub here: bool,
}

impl SharedPicks {
    pub fn new(picks: Vec<SharedPick>) -> Self {
        Self { picks }
    }

    pub fn picks(&self) -> &[SharedPick] {
        &self.picks
    }

    /// Whether this node's members of `group` on `filter` get the message: only if the
    /// group was picked for this node (a group the publisher's node did not know of yet
    /// gets nothing here, so that no two nodes both deliver).
    pub fn here(&self, filter: &str, group: &str) -> bool {
        self.picks
            .iter()
            .any(|p| p.here && &*p.filter == filter && &*p.group == group)
    }
}

/// How a message from another node is routed here: shared groups as the
/// publisher's node picked them, and not to the sessions `held_by` names (they moved
/// here holding it already) but through such a group; with `only`, to the sessions
/// it names and no other (not through a shared group).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote<'a> {
    pub picks: &'a SharedPicks,
    pub held_by: &'a [Arc<str>],
    pub only: Option<&'a [Arc<str>]>,
}

impl<'a> Remote<'a> {
    pub(crate) fn picked(picks: &'a SharedPicks) -> Self {
        Remote {
            picks,
            held_by: &[],
            only: None,
        }
    }
}

/// The link between this node and the others (see the module docs).
///
/// Contract: calls come from connection tasks and must not block; messages given to
/// [`forward`](Self::forward) reach the other nodes in the order of the calls (which
/// keeps each publisher's order per topic), and each reaches each node once.
pub trait Fabric: Send + Sync + std::fmt::Debug {
    /// Whether the other nodes are reachable now. When not, a QoS 1/2 PUBLISH is
    /// refused before it is delivered anywhere (see `connection/inbound.rs`).
    fn is_available(&self) -> bool;

    /// The node delivering each shared group that matches `topic`, cluster-wide.
    fn shared_picks(&self, topic: &str) -> SharedPicks;

    /// Hands a message routed on this node to the other nodes; resolves once they
    /// will get it (the shared medium accepted it).
    fn forward(
        &self,
        msg: &Message,
        picks: SharedPicks,
    ) -> BoxFuture<'static, Result<(), FabricError>>;

    /// A connection of `client_id` took its session here, under the client id's lock:
    /// any connection of it on another node must go (0x8E). The CONNACK waits for the
    /// returned future, so that a client connecting elsewhere after it is ordered after
    /// this connection; if it fails (the cluster is out of reach) the client is still
    /// accepted, and the other nodes are not told. `resumed`: the CONNECT had no Clean
    /// Start (another node's persistent session of it is handed over, not ended).
    fn connected(
        &self,
        client_id: &str,
        resumed: bool,
    ) -> BoxFuture<'static, Result<(), FabricError>>;

    /// Whether this node announced a connection of `client_id` that the other nodes
    /// have not ordered yet (it is newer than any takeover being read now).
    fn announcing(&self, client_id: &str) -> bool;

    /// This node's first member of `group` on `filter` arrived, or its last left.
    fn shared_group_changed(&self, filter: &str, group: &str, present: bool);

    /// `msg` was refused to its publisher (its forward failed) and the copies that
    /// `clients`' sessions hold back for it may be taken back: true if the fabric
    /// takes that on, i.e. should the message reach the other nodes after all, this
    /// node gives it to those sessions then, once; false (it reached them already, or
    /// the fabric cannot tell) and the copies go to their subscribers.
    fn withdraw(&self, msg: &Message, clients: &[Arc<str>]) -> bool {
        let _ = (msg, clients);
        false
    }
}

/// A persistent session that left this node: its incarnation and the messages its
/// stored records refer to.
pub type HandedOff = (u64, Vec<Arc<Message>>);

impl Broker {
    /// Joins this broker to other nodes through `fabric`. Call once, before accepting
    /// connections; false if one was installed already.
    pub fn set_fabric(&self, fabric: Arc<dyn Fabric>) -> bool {
        self.fabric_cell().set(fabric).is_ok()
    }

    /// The fabric, if this node is part of a cluster.
    pub(crate) fn fabric(&self) -> Option<&Arc<dyn Fabric>> {
        self.fabric_cell().get()
    }

    /// Delivers a message another node forwarded to this node's subscribers (and makes
    /// it this node's retained message if it is one), with that node's shared picks.
    /// Never forwarded again. The QoS 2 copies that persistent sessions store are
    /// held behind `gate` until the caller opens it: once the store has them, with
    /// how far this node read the other nodes' messages (a subscriber that got a copy
    /// before and lost it with this node would get the message again, under another
    /// packet id, from where the store says this node had read to).
    ///
    /// The sessions of the client ids in `held_by` get no copy but through a shared
    /// group picked for this node: they moved here from another node holding it
    /// already (its forward reached the cluster only after they moved).
    pub fn route_remote_gated(
        &self,
        msg: Message,
        (picks, held_by): (&SharedPicks, &[Arc<str>]),
        gate: &Arc<Gate>,
    ) -> usize {
        self.route_remote_gated_unless(msg, (picks, held_by), gate, |_| false)
    }

    /// [`Broker::route_remote_gated`], but a retained message does not become its
    /// topic's if `skip(topic)`, asked under the retained lock
    /// ([`Broker::apply_retained_unless`]): this node has a newer change of it.
    pub fn route_remote_gated_unless(
        &self,
        msg: Message,
        (picks, held_by): (&SharedPicks, &[Arc<str>]),
        gate: &Arc<Gate>,
        skip: impl FnOnce(&str) -> bool,
    ) -> usize {
        let msg = Arc::new(msg);
        if msg.retain {
            self.apply_retained_unless(&msg, skip);
        }
        let remote = Remote {
            picks,
            held_by,
            only: None,
        };
        self.route_local_gated(&msg, gate, remote)
    }

    /// Delivers `msg`, published on this node and refused to its publisher, to the
    /// sessions of `clients` only (as their subscriptions match it), behind `gate`:
    /// their copies were taken back ([`Broker::withdraw_refused`]) and its entry
    /// reached the other nodes after all. `before` sees the copy before it is stored
    /// (a store names its body after the message's origin).
    pub fn route_withdrawn(
        &self,
        msg: Message,
        clients: &[Arc<str>],
        gate: &Arc<Gate>,
        before: impl FnOnce(&Arc<Message>),
    ) -> usize {
        let msg = Arc::new(msg);
        before(&msg);
        let remote = Remote {
            picks: &SharedPicks::default(),
            held_by: &[],
            only: Some(clients),
        };
        self.route_local_gated(&msg, gate, remote)
    }

    /// The QoS 1/2 PUBLISH whose local copies wait behind `gate` was refused to its
    /// publisher (its forward failed): the copies sessions hold back (persistent or
    /// not, of any QoS) are taken back if the fabric will give the message to them
    /// should it reach the other nodes after all ([`Fabric::withdraw`]); so such a
    /// session gets it once, whichever way it goes, even if it moves to another node
    /// meanwhile (no record names the message), and none if it never lands. What
    /// stays behind the gate (a copy that came through a shared group, one the
    /// fabric already read back) goes once `store` has it: the forward's failure
    /// says nothing of the copies' records.
    pub(crate) fn withdraw_refused(&self, gate: &Arc<Gate>, store: &Arc<dyn SessionStore>) {
        let holders: Vec<_> = gate
            .holders()
            .into_iter()
            .filter_map(|s| s.message_behind(gate).map(|msg| (s, msg)))
            .collect();
        let msg = holders.first().map(|(_, msg)| msg.clone());
        if let (Some(fabric), Some(msg)) = (self.fabric(), msg) {
            let clients: Vec<Arc<str>> =
                holders.iter().map(|(s, _)| s.client_id().into()).collect();
            if fabric.withdraw(&msg, &clients) {
                let taken: usize = holders.iter().map(|(s, _)| s.withdraw(gate)).sum();
                let m = self.metrics();
                m.cluster_withdrawn
                    .fetch_add(taken as u64, Ordering::Relaxed);
            }
        }
        gate.clone().leave_to(&**store);
    }

    /// Another node took `client_id`'s session: a connection here is closed with 0x8E
    /// and the session here ends (it lives there now), unless this node's own newer
    /// connection is still being announced.
    pub fn taken_elsewhere(&self, client_id: &str) -> bool {
        self.end_taken_session(client_id, || {
            self.fabric()
                .is_none_or(|fabric| !fabric.announcing(client_id))
        })
    }

    /// Puts a session kept for another node into this node's table (see
    /// [`SessionStore::fetch`](crate::SessionStore::fetch)): subscriptions indexed,
    /// messages queued to be resent with DUP, expiry clock started. False if the client
    /// id has a session here already.
    ///
    /// Once it joined, `catch_up` runs while no message published on this node is
    /// routed (such publishers wait): what it gives the session
    /// ([`Broker::route_replayed`]), among it this node's own messages forwarded before
    /// the session joined, is queued ahead of every message published here later.
    /// Its error is returned with the session joined.
    pub fn adopt_session<E>(
        &self,
        stored: crate::StoredSession,
        catch_up: impl FnOnce() -> Result<(), E>,
    ) -> Result<bool, E> {
        self.with_forwarding_paused(|| {
            if !self.adopt_stored(stored) {
                return Ok(false);
            }
            catch_up().map(|()| true)
        })
    }

    /// Another node is taking `client_id`'s session with its stored form: a connection
    /// here goes with 0x8E, the session leaves this node, and what is stored of it is
    /// kept. Its incarnation, and the messages its stored records refer to, if it was
    /// persistent (the store then marks it released after every change recorded so
    /// far, and lets go of those messages).
    pub fn hand_off_session(&self, client_id: &str) -> Option<(u64, Vec<Arc<Message>>)> {
        self.hand_off_stored(client_id, || false)
    }

    /// As [`Broker::hand_off_session`], while no message published on this node is
    /// routed (such publishers wait): `settle` runs once the session left, so that
    /// what this node's messages routed to it (before) and what they were not (after)
    /// can be told apart, e.g. by where they are in the cluster's order. Its result is
    /// returned with the hand-off; it does not run if there was nothing to hand off.
    pub fn hand_off_session_settled<T>(
        &self,
        client_id: &str,
        settle: impl FnOnce() -> T,
    ) -> Option<(HandedOff, T)> {
        self.with_forwarding_paused(|| {
            let handed = self.hand_off_stored(client_id, || false)?;
            Some((handed, settle()))
        })
    }

    /// Another node's connection resumed `client_id`'s session (no Clean Start): as
    /// [`Broker::hand_off_session`], unless this node's own newer connection is still
    /// being announced (as [`Broker::taken_elsewhere`]).
    pub fn resumed_elsewhere(&self, client_id: &str) -> Option<(u64, Vec<Arc<Message>>)> {
        self.hand_off_stored(client_id, || {
            self.fabric()
                .is_some_and(|fabric| fabric.announcing(client_id))
        })
    }

    /// Delivers `msg` to `client_id`'s session only, as its subscriptions match it
    /// (a message another node had not yet given to that session when it moved here).
    /// `before` sees the copy that is routed, before the session stores it (a store
    /// may name its body after the message's origin).
    pub fn route_replayed(
        &self,
        client_id: &str,
        msg: Message,
        before: impl FnOnce(&Arc<Message>),
    ) -> usize {
        let msg = Arc::new(msg.for_client(client_id.into()));
        before(&msg);
        self.route_picked(&msg, &SharedPicks::default())
    }
}
