//! Reliable sessions across nodes: each one is mirrored into the cluster's store as its
//! node changes it, so that a client whose node died (or whose reconnect reached
//! another node) recovers it on any node.
//!
//! # What is mirrored
//!
//! A reliable session's hub keeps it as on one node; every change that a recovery needs
//! is also handed to the [`Cluster`] as a [`SessionWrite`] (queued, never waited on):
//! its creation (the reconnection token's digest, subprotocol, user, roles), each
//! grant or revoke of the REST API (its permissions as roles, from then on), each
//! `ce-connectionState` its event handler set, each client stream opened, each
//! fragment a stream accepted (its next expected id) and each stream's end, each
//! sequenced frame, each trim of the replay buffer (the client's `sequenceAck`, an
//! eviction), its groups, each processed `ackId`, its deletion. The store's copy is the
//! replay buffer's copy: it holds what the buffer holds and no more, so the bounds of
//! one node (replay bytes and age) bound it too.
//!
//! # Written before it is seen
//!
//! A sequenced frame reaches the client's socket only once its mirror write (and so
//! everything the node queued before it: the operation it came from, if the node's
//! own) is in the store: each write gets a ticket, the frame waits in the socket's
//! outbound queue behind it ([`Mirror::gate`]), and the writer publishes how far it
//! got after each pipeline, so a subscriber's frames wait for one pipeline shared by
//! every frame queued meanwhile. Otherwise a node that died after the client saw a
//! frame but before the store had it would leave the next node numbering from the
//! copy, giving again ids the client has seen (and drops). A write that cannot be
//! queued ends the session (1008): nothing after it could be numbered safely.
//!
//! # Taking a session over
//!
//! A node that gets a recovery for a session it does not hold asks the cluster to
//! [`Cluster::claim`] it: atomically, the token is checked, the session's epoch is
//! raised (the old owner's writes are refused from then on: the fence) and a
//! `claimed` operation is appended to the operations stream (the old owner, if alive,
//! closes its socket and forgets the session when it reads it). The claim's place in
//! the stream, `K`, splits the work: every operation before `K` that the old owner had
//! not applied to the session is replayed to it by the new owner's reader thread when
//! it reaches `K` ([`crate::WebPubSub::restore`]), every operation after `K` reaches it
//! live. Each mirrored frame records which operation it came from (a stream entry, or
//! the old owner's own operation by its number), so the replay starts after the last
//! operation the store's copy reflects and skips what the old owner delivered itself:
//! each message once, in order per origin.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::ws::Message;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::cluster::{Cluster, ClusterError};
use crate::hub::{Hub, Session, Unrecoverable};
use crate::outbox::Gate;
use crate::protocol::Subprotocol;

/// Which operation a sequenced frame came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// An entry of the operations stream, by its id's two numbers.
    Stream(u64, u64),
    /// This node's own operation, by the number [`Cluster::broadcast`] gave it.
    Own(u64),
    /// Neither (a send that no other node hears of).
    Unknown,
}

thread_local! {
    static CURRENT: Cell<Provenance> = const { Cell::new(Provenance::Unknown) };
}

/// Runs `f` with `provenance` as the origin of every frame it sequences on this thread.
/// The origin is known where an operation is applied (the reader, the broadcasting
/// request), and read where frames are sequenced, a few calls below.
pub(crate) fn with_provenance<R>(provenance: Provenance, f: impl FnOnce() -> R) -> R {
    let before = CURRENT.with(|c| c.replace(provenance));
    let r = f();
    CURRENT.with(|c| c.set(before));
    r
}

fn provenance() -> Provenance {
    CURRENT.with(Cell::get)
}

/// One change of a mirrored session, for [`Cluster::session`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionWrite {
    /// The session was created on this node.
    Open {
        /// SHA-256 (hex) of its reconnection token.
        token: String,
        /// Its subprotocol's name.
        protocol: String,
        /// Its user id.
        user: Option<String>,
        /// The roles of its token.
        roles: Vec<String>,
    },
    /// A sequenced frame (its payload as sent, its deadline in Unix ms, 0: none).
    Frame {
        seq: u64,
        frame: Vec<u8>,
        deadline_ms: u64,
        from: Provenance,
    },
    /// The replay buffer now starts at `first`; the client acknowledged `acked`; the
    /// highest id evicted unacknowledged is `evicted_through`.
    Trim {
        first: u64,
        acked: u64,
        evicted_through: u64,
    },
    /// Its groups now.
    Groups(Vec<String>),
    /// Its permissions now, after a grant or revoke (as `Permissions::mirrored` writes
    /// them; they replace the token's roles).
    Roles(Vec<String>),
    /// An `ackId` it processed; the store keeps the last `keep`.
    Ack { ack_id: u64, keep: usize },
    /// The upstream's `ce-connectionState` for it now (it replaces the last one, so
    /// the copy holds one, bounded by the size of an upstream answer's head).
    State(String),
    /// One of its client streams opened (it expects fragment 1).
    StreamOpened(MirroredStream),
    /// One of its client streams accepted a fragment (or a keepalive, a repeat, a nack
    /// moved its idle deadline): it now expects `expected`, and ends idle at
    /// `deadline_ms` (Unix ms). Only the id and two numbers, whatever the fragment's
    /// size.
    StreamAccepted {
        id: String,
        expected: u64,
        deadline_ms: u64,
    },
    /// One of its client streams ended: forget it.
    StreamClosed(String),
    /// It ended: forget it.
    Delete,
}

/// A session as the cluster's store holds it, for [`crate::WebPubSub::restore`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    pub hub: String,
    pub id: String,
    pub token: String,
    pub protocol: String,
    pub user: Option<String>,
    pub roles: Vec<String>,
    pub groups: Vec<String>,
    pub acks: Vec<u64>,
    /// The next sequence id, the client's last acknowledgement, the highest id
    /// evicted unacknowledged.
    pub next: u64,
    pub acked: u64,
    pub evicted_through: u64,
    /// The buffered frames: sequence id, payload, deadline (Unix ms, 0: none).
    pub frames: Vec<(u64, Vec<u8>, u64)>,
    /// The upstream's `ce-connectionState`, if it set one.
    pub connection_state: Option<String>,
    /// Its open client streams.
    pub streams: Vec<MirroredStream>,
}

/// An open client stream of a mirrored session: what a node that takes the session
/// over needs to go on accepting its fragments where the last node stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MirroredStream {
    pub id: String,
    pub group: String,
    pub no_echo: bool,
    /// Its idle timeout in ms.
    pub idle_ms: u64,
    /// The next `streamSequenceId` it expects.
    pub expected: u64,
    /// When it ends idle unless a fragment or keepalive comes first (Unix ms; 0: not
    /// known, a full idle timeout from its restoration).
    pub deadline_ms: u64,
}

/// A claim refused.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// No such session in the store (or another token or subprotocol).
    #[error("the session is gone")]
    Gone,
    /// It cannot be recovered, for this reason.
    #[error("the session ended: {0}")]
    Ended(String),
    /// The store is out of reach.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The digest of a reconnection token the store keeps (never the token).
pub(crate) fn token_digest(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn unix_ms(deadline: Option<Instant>) -> u64 {
    let Some(d) = deadline else { return 0 };
    let left = d.saturating_duration_since(Instant::now());
    let at = SystemTime::now() + left;
    at.duration_since(UNIX_EPOCH).map_or(1, |t| {
        u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}

pub(crate) fn instant(ms: u64) -> Option<Instant> {
    if ms == 0 {
        return None;
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    Some(Instant::now() + Duration::from_millis(ms.saturating_sub(now)))
}

/// A frame's bytes, for the store.
pub(crate) fn frame_write(seq: u64, frame: &Message, deadline: Option<Instant>) -> SessionWrite {
    let bytes = match frame {
        Message::Text(t) => t.as_str().as_bytes().to_vec(),
        Message::Binary(b) => b.to_vec(),
        _ => Vec::new(),
    };
    SessionWrite::Frame {
        seq,
        frame: bytes,
        deadline_ms: unix_ms(deadline),
        from: provenance(),
    }
}

/// A stored frame as the subprotocol sends it.
pub(crate) fn stored_frame(
    protocol: Subprotocol,
    (seq, bytes, deadline_ms): (u64, Vec<u8>, u64),
) -> Option<(u64, Message, Option<Instant>)> {
    let msg = if protocol.is_protobuf() {
        Message::Binary(bytes.into())
    } else {
        Message::Text(String::from_utf8(bytes).ok()?.into())
    };
    Some((seq, msg, instant(deadline_ms)))
}

/// Recoveries waiting for the reader thread to take their session over.
/// By (hub, connection id): the token the client presented, and where to answer.
pub(crate) type Waiting = Mutex<HashMap<(String, String), (String, Answer)>>;

type Answer = oneshot::Sender<Result<Arc<Session>, Unrecoverable>>;

/// How long a recovery waits for its node's reader to reach its claim.
const CLAIM_WAIT: Duration = Duration::from_secs(20);

/// Why a recovery on this node of a session held elsewhere failed.
#[derive(Debug)]
pub(crate) enum Elsewhere {
    /// The session cannot be recovered (1008).
    Refused(Unrecoverable),
    /// The cluster could not be asked now (1013: the client tries again).
    Later(String),
}

impl crate::WebPubSub {
    /// Recovers a session no hub of this node holds from the cluster's store.
    pub(crate) async fn recover_elsewhere(
        &self,
        hub_name: &str,
        id: &str,
        token: &str,
        protocol: Subprotocol,
    ) -> Result<(Arc<Hub>, Arc<Session>), Elsewhere> {
        let Some(cluster) = self.inner.cluster.get().cloned() else {
            return Err(Elsewhere::Refused(Unrecoverable::Gone));
        };
        let hub = self.hub(hub_name);
        let key = (hub.name().to_owned(), id.to_owned());
        tracing::debug!(
            hub = key.0,
            id = key.1,
            "web pubsub: recovering a session held elsewhere"
        );
        let (tx, rx) = oneshot::channel();
        lock(&self.inner.waiting).insert(key.clone(), (token.to_owned(), tx));
        let (h, i) = key.clone();
        let (digest, name) = (token_digest(token), protocol.name().unwrap_or_default());
        let marker = crate::cluster::claimed_marker(&h, &i);
        let claim =
            tokio::task::spawn_blocking(move || cluster.claim(&h, &i, &digest, name, marker)).await;
        let refused = match claim {
            Ok(Ok(())) => None,
            Ok(Err(ClaimError::Gone)) => Some(Elsewhere::Refused(Unrecoverable::Gone)),
            Ok(Err(ClaimError::Ended(why))) => Some(Elsewhere::Refused(Unrecoverable::Ended(why))),
            Ok(Err(ClaimError::Cluster(e))) => Some(Elsewhere::Later(e.to_string())),
            Err(e) => Some(Elsewhere::Later(e.to_string())),
        };
        if let Some(refused) = refused {
            tracing::debug!(
                hub = key.0,
                id = key.1,
                ?refused,
                "web pubsub: a recovery of a session held elsewhere failed"
            );
            lock(&self.inner.waiting).remove(&key);
            return Err(refused);
        }
        match tokio::time::timeout(CLAIM_WAIT, rx).await {
            Ok(Ok(Ok(session))) => Ok((hub, session)),
            Ok(Ok(Err(why))) => Err(Elsewhere::Refused(why)),
            _ => {
                tracing::debug!(
                    hub = key.0,
                    id = key.1,
                    "web pubsub: a recovery of a session held elsewhere timed out"
                );
                lock(&self.inner.waiting).remove(&key);
                Err(Elsewhere::Later(
                    "the cluster did not answer in time".into(),
                ))
            }
        }
    }

    /// Takes over a session this node claimed (called by the cluster's reader thread
    /// when it reaches the claim, inside the runtime): rebuilds it from `restored`,
    /// applies `replay` (the stream's operations between what the store reflects and the
    /// claim, with their ids) to it alone, then this node's own operations sent since
    /// its claim numbered `claim` (delivered here before it was reachable), then puts it
    /// in its hub. Returns whether a recovery still waited for it.
    pub fn restore(
        &self,
        restored: Restored,
        replay: Vec<((u64, u64), Vec<u8>)>,
        claim: u64,
    ) -> bool {
        let hub = self.hub(&restored.hub);
        let key = (hub.name().to_owned(), restored.id.clone());
        let Some((token, waiter)) = lock(&self.inner.waiting).remove(&key) else {
            return false;
        };
        let Some(protocol) = Subprotocol::from_name(&restored.protocol) else {
            let _ = waiter.send(Err(Unrecoverable::Gone));
            return false;
        };
        let cluster = self.inner.cluster.get().cloned();
        let session = hub.adopt(restored, token, protocol, |session| {
            for (id, op) in replay {
                crate::cluster::apply_to(&hub, session, &op, Provenance::Stream(id.0, id.1));
            }
            match cluster.and_then(|c| c.sent_after(claim)) {
                Some(own) => {
                    // One still waiting for its turn here reaches it live.
                    for (seq, op) in own.into_iter().filter(|(seq, _)| !hub.keeps(*seq)) {
                        crate::cluster::apply_to(&hub, session, &op, Provenance::Own(seq));
                    }
                }
                None => session.shut(
                    crate::hub::CLOSE_POLICY,
                    "too many messages were sent while the session moved to this node",
                ),
            }
        });
        if waiter.send(Ok(session.clone())).is_err() {
            hub.remove(session.id());
            return false;
        }
        true
    }

    /// The claim of `id` cannot be served (the stream no longer holds what it missed):
    /// its recovery is told why, and the store forgets it.
    pub fn restore_failed(&self, hub: &str, id: &str, reason: &str) {
        let key = (hub.to_ascii_lowercase(), id.to_owned());
        if let Some((_, waiter)) = lock(&self.inner.waiting).remove(&key) {
            let _ = waiter.send(Err(Unrecoverable::Ended(reason.to_owned())));
        }
        if let Some(cluster) = self.inner.cluster.get() {
            // Not queued: the copy is marked lost, which refuses its claims just as well.
            let _ = cluster.session(&key.0, id, SessionWrite::Delete);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The session's mirror, if it has one: the cluster and the hub's name.
#[derive(Debug, Clone)]
pub(crate) struct Mirror {
    pub(crate) cluster: Arc<dyn Cluster>,
    pub(crate) hub: Arc<str>,
}

impl Mirror {
    /// Queues `write`: its ticket for [`Mirror::gate`], or `Err` if it could not be
    /// queued (the session must end: its copy is lost).
    pub(crate) fn write(&self, id: &str, write: SessionWrite) -> Result<u64, ClusterError> {
        self.cluster.session(&self.hub, id, write)
    }

    /// What the session's socket waits on before a frame whose mirror write has a
    /// ticket: the frame reaches the client only once another node taking the session
    /// over would number after it.
    pub(crate) fn gate(&self) -> Gate {
        let cluster = Arc::clone(&self.cluster);
        Arc::new(move |ticket| cluster.mirrored(ticket))
    }
}
