//! Web PubSub across several statehub nodes: the seam.
//!
//! A hub's sessions live on the node their socket reached; groups and users span nodes.
//! What one node's REST API or clients do to connections elsewhere travels as an
//! [`Operation`]: encoded here, handed to the [`Cluster`] (which carries it to every other
//! node, in the order this node handed them over), and applied there by
//! [`crate::WebPubSub::apply_remote`] to that node's own sessions. The origin applies it to
//! its own sessions directly. So a send reaches every member once: its own node's
//! members from the origin, every other node's from that node.
//!
//! What the other nodes hold (does a connection, a user, a group exist; may a
//! connection do something; who is in a group) is asked of them ([`Cluster::ask`],
//! `ask.rs`): the question travels in the same order as the operations, so each node
//! answers after applying every operation acknowledged before it was asked.
//!
//! Without a cluster (a single node, the default) a hub has no [`Cluster`] and nothing
//! here runs: every check is one `Option` test.

mod ask;
mod operation;

use std::fmt::Debug;
use std::time::Duration;
use std::{future::Future, pin::Pin};

use serde::{Deserialize, Serialize};

use crate::hub::admin::Target;
use crate::hub::{Delivery, Hub, Numbered, Session};
use crate::mirror::{with_provenance, ClaimError, Provenance, SessionWrite};
use crate::protocol::json::{DataMessageRef, MessageSource, StreamInfo};
use crate::protocol::Payload;

pub(crate) use ask::Question;
pub(crate) use operation::{apply_to, claimed_marker, Operation};

/// Carries operations and questions to the other nodes.
/// Implemented over Redis by `statehub-webpubsub-redis`.
pub trait Cluster: Send + Sync + Debug {
    /// Hands an encoded operation to every other node, after every one handed over
    /// before. Must not block: it queues. An `Err` means the other nodes will not get
    /// it (the caller refuses the request).
    /// Returns the operation's number among this node's (from 1, in the order handed
    /// over).
    fn broadcast(&self, operation: Vec<u8>) -> Result<u64, ClusterError>;
    /// [`Cluster::broadcast`] of a client stream's fragment (or end) with its stream's
    /// new state for the publisher's mirrored session ([`Cluster::session`] of `write`,
    /// a [`SessionWrite::StreamAccepted`] or [`SessionWrite::StreamClosed`]) as one
    /// step: the store takes both or neither, so a node that takes the session over
    /// never publishes the fragment again nor skips it. Both are fenced like any session
    /// write: once another node claimed the session, the operation does not go out
    /// either, the write's ticket is never released to the old socket (which is closed
    /// first, as a handed-over session's), and the returned [`Taken`] resolves `false`
    /// (`true` once the store has both), for this node's members, who get the fragment
    /// only then. Must not block. Returns the operation's number and the write's
    /// ticket. By default, one after the other, always taken.
    fn broadcast_with(
        &self,
        operation: Vec<u8>,
        (hub, id, write): (&str, &str, SessionWrite),
    ) -> Result<(u64, u64, Taken), ClusterError> {
        let seq = self.broadcast(operation)?;
        let ticket = self.session(hub, id, write)?;
        Ok((seq, ticket, Box::pin(std::future::ready(true))))
    }
    /// Whether this node still holds mirrored session `id` of `hub`, asked of the store
    /// after every write handed over before: `false` once another node claimed it (the
    /// session is then handed over here first, as for a fenced write). An upstream
    /// event with an `ackId` is posted only after `true`: one the old node takes after
    /// the claim would be posted there and again where the client sends it next. Must
    /// not block. By default, always held.
    fn still_held(&self, hub: &str, id: &str) -> Taken {
        let _ = (hub, id);
        Box::pin(std::future::ready(true))
    }
    /// Resolves once this node's operations up to `seq` are where the other nodes read
    /// them (they survive this process); `Err` if that cannot be known in time.
    fn written(&self, seq: u64) -> Written;
    /// Hands `question` (an encoded operation naming `id`) to every live node, this one
    /// included (see [`crate::WebPubSub::answer_own`]), after every operation handed
    /// over before, and collects their answers (see [`Cluster::answer`]) until
    /// `settles` says one decides it or every node that was alive when asked answered
    /// or died (this one always answers). `Err` if one that is still alive did not
    /// answer in time: a silent node is never taken for a "no". May block (called on a
    /// blocking thread).
    fn ask(
        &self,
        id: &str,
        question: Vec<u8>,
        settles: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<Vec<u8>>, ClusterError>;
    /// Answers question `id`, after every write handed over before.
    /// Must not block (called as the operations are applied).
    fn answer(&self, id: &str, answer: Vec<u8>);
    /// Mirrors a change of a reliable session this node holds (see `mirror.rs`), after
    /// every write and operation handed over before. Must not block (called under the
    /// session's lock). Returns the write's number among this node's session writes
    /// (from 1, in the order handed over), for [`Cluster::mirrored`]; `Err` if it could
    /// not be queued: the mirror then refuses the session's recovery elsewhere rather
    /// than serve it incomplete, and the session ends.
    fn session(&self, hub: &str, id: &str, write: SessionWrite) -> Result<u64, ClusterError>;
    /// Resolves once this node's session writes up to `ticket` (see [`Cluster::session`])
    /// are where another node would take the session over from, with the number they
    /// have reached (at least `ticket`; `u64::MAX` if the cluster is gone). A reliable
    /// session's frame reaches its socket only then. Never gives up: what waits for it
    /// is bounded by the connection's outbound queue. A [`Cluster::broadcast_with`]
    /// write that was fenced is reported like any other, but only after its session was
    /// handed over here ([`crate::WebPubSub::claimed_elsewhere`]), so its socket's close
    /// overtakes whatever waits for it.
    fn mirrored(&self, ticket: u64) -> Mirrored;
    /// Takes the mirrored session `id` over for this node: checks the token's digest
    /// and subprotocol, fences its previous owner and appends `marker` (a `claimed`
    /// operation) to the operations, after every operation this node handed over
    /// before. On success this node's reader later hands the session to
    /// [`crate::WebPubSub::restore`]. May block.
    fn claim(
        &self,
        hub: &str,
        id: &str,
        token_digest: &str,
        protocol: &str,
        marker: Vec<u8>,
    ) -> Result<(), ClaimError>;
    /// Stops applying other nodes' operations and stops counting as a live node (its
    /// questions unanswered); returns once no operation is being applied any more. For
    /// a shutdown that hands this node's reliable sessions to other nodes: what it did
    /// not apply, their next nodes replay. May block.
    fn stop_reading(&self);
    /// Returns once everything handed over so far is written (`false`: not within
    /// `within`). May block.
    fn flush(&self, within: Duration) -> bool;
    /// Stops the cluster's work for this node (at shutdown, after [`Cluster::flush`]).
    fn stop(&self);
    /// This node's operations handed over since its claim numbered `claim` (not yet
    /// served by the reader), with their numbers, in order; `None` if more were handed
    /// over than it keeps.
    fn sent_after(&self, claim: u64) -> Option<Vec<(u64, Vec<u8>)>>;
}

/// What [`Cluster::written`] returns.
pub type Written = Pin<Box<dyn Future<Output = Result<(), ClusterError>> + Send>>;

/// What [`Cluster::mirrored`] returns.
pub type Mirrored = Pin<Box<dyn Future<Output = u64> + Send>>;

/// Whether the store took a [`Cluster::broadcast_with`] (`false`: fenced out, or it
/// will never be written).
pub type Taken = Pin<Box<dyn Future<Output = bool> + Send>>;

/// The other nodes cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster's store is out of reach.
    #[error("the cluster is unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A node that is alive did not answer a question in time.
    #[error("node {0} did not answer in time")]
    NoAnswer(String),
    /// More operations wait to be handed over than the queue holds.
    #[error("{0} operations already wait to reach the other nodes")]
    Backlog(usize),
}

/// Whom an operation names, as it travels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum To {
    All,
    Group(String),
    User(String),
    Connection(String),
}

impl To {
    pub(crate) fn from(target: Target<'_>) -> Self {
        match target {
            Target::All => To::All,
            Target::Group(g) => To::Group(g.to_owned()),
            Target::User(u) => To::User(u.to_owned()),
            Target::Connection(c) => To::Connection(c.to_owned()),
        }
    }

    pub(crate) fn target(&self) -> Target<'_> {
        match self {
            To::All => Target::All,
            To::Group(g) => Target::Group(g),
            To::User(u) => Target::User(u),
            To::Connection(c) => Target::Connection(c),
        }
    }
}

/// A send's selection as it travels: the filter's text, re-parsed on each node.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SentSelection<'a> {
    pub excluded: &'a [String],
    pub filter: Option<&'a str>,
}

impl crate::WebPubSub {
    /// Applies an operation another node broadcast (see [`Cluster::broadcast`]) to this
    /// node's sessions. Call it in the order the operations were broadcast, inside the
    /// Tokio runtime. An operation for a hub this node has no session of does nothing.
    /// `entry` is its place in the cluster's order, which the frames it produces for
    /// mirrored sessions record (see `mirror.rs`).
    pub fn apply_remote(&self, operation: &[u8], entry: (u64, u64)) {
        let operation: Operation = match serde_json::from_slice(operation) {
            Ok(op) => op,
            Err(error) => {
                tracing::warn!(%error, "web pubsub: an operation from another node is invalid");
                return;
            }
        };
        if let Operation::Ask { hub, id, question } = &operation {
            return self.answer(hub, id, question);
        }
        if let Some(hub) = self.existing_hub(operation.hub()) {
            with_provenance(Provenance::Stream(entry.0, entry.1), || {
                operation.apply(&hub)
            });
        }
    }

    /// The store fenced out a write of session `id` of `hub` (another node claimed
    /// it): it is handed over here at once, as when the claim is read, so its socket is
    /// closed before anything held behind that write could be released to it. Call it
    /// before the cluster reports the write stored.
    pub fn claimed_elsewhere(&self, hub: &str, id: &str) {
        if let Some(hub) = self.existing_hub(hub) {
            hub.hand_over(id);
        }
    }

    /// Answers this node's own question (an operation of this node, read back from the
    /// cluster in its order; anything else is ignored): so its answer, like the other
    /// nodes', reflects every operation before the question.
    pub fn answer_own(&self, operation: &[u8]) {
        if !operation.starts_with(br#"{"op":"ask""#) {
            return;
        }
        if let Ok(Operation::Ask { hub, id, question }) = serde_json::from_slice(operation) {
            self.answer(&hub, &id, &question);
        }
    }

    fn answer(&self, hub: &str, id: &str, question: &Question) {
        let answer = question.answer(self.existing_hub(hub).as_deref());
        if let Some(cluster) = self.inner.cluster.get() {
            cluster.answer(id, answer);
        }
    }

    /// Returns once every send of this node numbered up to `through` has delivered
    /// here (or was fenced out) and none is between its broadcast and its local
    /// delivery: what this node's own operations read back from the cluster produced
    /// here is then queued for the mirror, before anything the caller queues next.
    pub fn settled(&self, through: u64) {
        for hub in self.hubs_now() {
            hub.settled_through(through);
        }
    }
}

impl Hub {
    /// Hands `operation` to the other nodes (nothing to do on a single node).
    /// Returns the operation's number among this node's (0 on a single node).
    pub(crate) fn broadcast(&self, operation: &Operation) -> Result<u64, ClusterError> {
        let Some(cluster) = self.cluster() else {
            return Ok(0);
        };
        let bytes =
            serde_json::to_vec(operation).map_err(|e| ClusterError::Unavailable(Box::new(e)))?;
        cluster.broadcast(bytes)
    }

    /// [`Hub::broadcast`], then [`Hub::written`]: an answer after it survives this node.
    pub(crate) async fn broadcast_written(
        &self,
        operation: &Operation,
    ) -> Result<(), ClusterError> {
        let seq = self.broadcast(operation)?;
        self.written(seq).await
    }

    /// Resolves once operation `seq` of [`Hub::broadcast`] is in Redis (single node: 0).
    pub(crate) async fn written(&self, seq: u64) -> Result<(), ClusterError> {
        match self.cluster() {
            Some(cluster) if seq > 0 => cluster.written(seq).await,
            _ => Ok(()),
        }
    }

    /// A client's message to `group` (`stream`: a fragment of one of its streams), to
    /// this node's members and, through the cluster, every other node's; `no_echo`
    /// leaves the sender out wherever it is applied (a session taken over by another
    /// node may be). `state`: the fragment's stream's new state for the sender's
    /// mirrored session, handed over with the operation as one
    /// ([`Cluster::broadcast_with`]); this node's members then get it once the store
    /// took both (see `hub/lane.rs`). Returns the operation's number and the state's
    /// mirror ticket (0: none; both 0 on a single node); `Err` (the cluster refused
    /// it, the state included) before anything was delivered.
    pub(crate) fn publish_to_group(
        &self,
        session: &Session,
        group: &str,
        no_echo: bool,
        payload: &Payload,
        (stream, state): (Option<&StreamInfo>, Option<SessionWrite>),
    ) -> Result<(u64, u64), ClusterError> {
        let _order = self.sending();
        let exclude = no_echo.then(|| session.id());
        let user = session.user_id();
        let now = || {
            let msg = DataMessageRef {
                from: MessageSource::Group,
                group: Some(group),
                from_user_id: user,
                payload,
                stream,
            };
            self.send_to_group(group, &msg, exclude);
        };
        let later = || -> Delivery {
            let (group, payload) = (group.to_owned(), payload.clone());
            let (stream, user) = (stream.cloned(), user.map(str::to_owned));
            let exclude = exclude.map(str::to_owned);
            Box::new(move |hub: &Hub| {
                let msg = DataMessageRef {
                    from: MessageSource::Group,
                    group: Some(&group),
                    from_user_id: user.as_deref(),
                    payload: &payload,
                    stream: stream.as_ref(),
                };
                hub.send_to_group(&group, &msg, exclude.as_deref());
            })
        };
        let number = || self.number_group_send(session, (group, no_echo), payload, stream, state);
        self.send_own(number, now, later)
    }

    /// Hands a client's message to `group` to the other nodes (see
    /// [`Hub::publish_to_group`]): its numbers, its frames' origin, and whether the
    /// store took it when it may be fenced out.
    fn number_group_send(
        &self,
        session: &Session,
        (group, no_echo): (&str, bool),
        payload: &Payload,
        stream: Option<&StreamInfo>,
        state: Option<SessionWrite>,
    ) -> Result<Numbered<(u64, u64)>, ClusterError> {
        let Some(cluster) = self.cluster() else {
            return Ok(((0, 0), Provenance::Unknown, None));
        };
        let me = [session.id().to_owned()];
        let sel = SentSelection {
            excluded: if no_echo { &me } else { &[] },
            filter: None,
        };
        let mut sent = Operation::send(
            self,
            Target::Group(group),
            &sel,
            payload,
            None,
            session.user_id(),
        );
        if let Operation::Send { stream: s, .. } = &mut sent {
            *s = stream.cloned();
        }
        match state.filter(|_| session.is_mirrored()) {
            Some(write) => {
                let bytes = serde_json::to_vec(&sent)
                    .map_err(|e| ClusterError::Unavailable(Box::new(e)))?;
                let (seq, ticket, taken) =
                    cluster.broadcast_with(bytes, (self.name(), session.id(), write))?;
                Ok(((seq, ticket), Provenance::Own(seq), Some(taken)))
            }
            None => {
                let seq = self.broadcast(&sent)?;
                Ok(((seq, 0), Provenance::Own(seq), None))
            }
        }
    }
}
