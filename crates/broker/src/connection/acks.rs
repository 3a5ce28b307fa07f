//! The acknowledgements of a connection's QoS 1/2 PUBLISHes, in the order the
//! PUBLISHes were received [MQTT-4.6.0-2, MQTT-4.6.0-3], each sent only once what it
//! acknowledges is durable.
//!
//! A PUBLISH whose acknowledgement waits for writes elsewhere (the cluster's stream
//! append, a retained change, the session store's copies, a built-in service's
//! answer that takes a round trip) is routed (or handed to the service) at once and its
//! acknowledgement queued here with what it waits for; the connection goes on reading
//! and routing the next PUBLISHes meanwhile, so one publisher's messages share the
//! writers' round trips instead of paying one each. The queue is polled from the
//! connection's select loop; an acknowledgement that needs no wait still queues behind
//! the ones that do. A failed wait at the front decides that PUBLISH's answer (a
//! refusal code, or the connection closes and nothing behind it is acknowledged);
//! the ones behind it are answered after it, each by its own outcome. A PUBREL's
//! PUBCOMP, when a persistent session stores the release, queues the same way, and
//! so do the PUBREL answering a client's PUBREC of our QoS 2 PUBLISH while a
//! persistent session stores that the message was released, and a persistent
//! session's SUBACK or UNSUBACK while the store writes the change (a SUBACK's
//! retained messages are offered once it is sent). When
//! the connection closes for anything but a lost socket, the teardown first sends
//! what the queue holds as its waits end, for a while (`teardown.rs`).
//!
//! Bound: QoS 1/2 PUBLISHes not yet acknowledged are what Receive Maximum counts. An
//! MQTT 5 client that sends more gets DISCONNECT 0x93; from an MQTT 3.1.1 one (which
//! has no such limit) the connection stops reading at that many until the front is
//! acknowledged.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use parking_lot::Mutex;
use statehub_mqtt_codec::{Packet, ProtocolVersion, PubResponse, QoS, ReasonCode};

use super::buffers::Deadlines;
use super::{Close, Conn};

use crate::fabric::FabricError;
use crate::message::Delivery;
use crate::retain_store::RetainStoreError;
use crate::service::BoxFuture;
use crate::session_store::{Gate, SessionStore, SessionStoreError};

/// Why an acknowledgement's wait failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum Failed {
    #[error(transparent)]
    Retained(#[from] RetainStoreError),
    #[error(transparent)]
    Forward(#[from] FabricError),
    #[error(transparent)]
    Session(#[from] SessionStoreError),
}

/// Opens a gate when the publish that holds it is done with. Acknowledged (its
/// barrier passed: the copies behind it are stored), at once; failed or dropped
/// unanswered, only once the store has every change recorded so far
/// ([`SessionStore::open_when_stored`]): a copy given before its record is stored has
/// a packet id no node the session moves to knows about, which it would give to
/// another message that a QoS 2 receiver still holding the id then drops. A cluster
/// gate ([`Gate::every_copy`]) dropped unanswered (its connection closed while the
/// forward's outcome was unknown) has its copies taken back as a refused one's
/// ([`crate::Broker::withdraw_refused`]): the fabric gives them if the message reaches
/// the other nodes, so they go once either way, and none if it never does.
pub(super) struct OpenOnDrop {
    gate: Option<Arc<Gate>>,
    store: Arc<dyn SessionStore>,
    broker: crate::Broker,
}

impl std::fmt::Debug for OpenOnDrop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOnDrop")
            .field("gate", &self.gate)
            .finish()
    }
}

impl OpenOnDrop {
    pub fn new(gate: Arc<Gate>, store: Arc<dyn SessionStore>, broker: crate::Broker) -> Self {
        Self {
            gate: Some(gate),
            store,
            broker,
        }
    }

    /// The PUBLISH was acknowledged after the store's barrier: its copies are stored.
    fn stored(mut self) {
        if let Some(gate) = self.gate.take() {
            gate.open();
        }
    }

    /// The PUBLISH was refused because the other nodes could not be given it: its
    /// copies behind the gate are taken back if they can be given again should it
    /// reach them after all (`Broker::withdraw_refused`), the others wait until
    /// they are stored.
    fn refused(mut self) {
        if let Some(gate) = self.gate.take() {
            self.broker.withdraw_refused(&gate, &self.store);
        }
    }
}

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        let Some(gate) = self.gate.take() else { return };
        if gate.takes_every_copy() {
            self.broker.withdraw_refused(&gate, &self.store);
        } else {
            gate.leave_to(&*self.store);
        }
    }
}

/// What a PUBLISH's acknowledgement waits for, in the order it is checked.
#[derive(Default)]
pub(super) struct Wait {
    /// A built-in service's answer ([`crate::Service::start_publish`]).
    pub served: Option<BoxFuture<'static, ()>>,
    /// The retained change's write.
    pub retained: Option<BoxFuture<'static, Result<(), RetainStoreError>>>,
    /// The hand-over to the other nodes.
    pub forwarded: Option<BoxFuture<'static, Result<(), FabricError>>>,
    /// The session store that recorded the copies: its barrier is taken once the
    /// waits before it are over (a copy its subscriber acknowledged meanwhile may
    /// then never be written).
    pub stored: Option<Arc<dyn SessionStore>>,
}

impl Wait {
    fn is_empty(&self) -> bool {
        self.served.is_none()
            && self.retained.is_none()
            && self.forwarded.is_none()
            && self.stored.is_none()
    }

    fn into_future(self) -> BoxFuture<'static, Result<(), Failed>> {
        Box::pin(async move {
            if let Some(served) = self.served {
                served.await;
            }
            if let Some(retained) = self.retained {
                retained.await?;
            }
            if let Some(forwarded) = self.forwarded {
                forwarded.await?;
            }
            if let Some(store) = self.stored {
                store.barrier().await?;
            }
            Ok(())
        })
    }
}

/// One acknowledgement to send: what it answers and its packet id, the reason code it
/// says if its wait succeeds, and the gate its message's held copies wait
/// behind (see [`OpenOnDrop`]).
pub(super) struct Ack {
    pub answers: Answers,
    pub pid: u16,
    pub code: ReasonCode,
    pub gate: Option<OpenOnDrop>,
    /// For [`Answers::Subscription`]: the packet, and what follows it.
    pub reply: Option<Box<Reply>>,
}

/// A SUBACK or UNSUBACK waiting for the session store, and the retained messages its
/// new subscriptions get, offered once it is sent.
pub(super) struct Reply {
    pub packet: Packet,
    pub retained: Vec<Delivery>,
}

/// What an acknowledgement answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answers {
    /// A PUBLISH of this QoS (PUBACK for 1, PUBREC for 2; nothing for 0).
    Publish(QoS),
    /// A PUBREL (PUBCOMP), once the receipt's release is stored.
    Release,
    /// A PUBREC of one of our QoS 2 PUBLISHes (PUBREL), once a persistent session
    /// stored that it was released. Not counted by Receive Maximum: what bounds these
    /// is the client's own window of our messages in flight (see [`Acks::full`]).
    Received,
    /// A SUBSCRIBE or UNSUBSCRIBE ([`Ack::reply`]), once a persistent session stored
    /// the change. Not counted by Receive Maximum either.
    Subscription,
}

impl Answers {
    /// Whether Receive Maximum counts it (it answers a QoS 1/2 PUBLISH or PUBREL).
    fn counted(self) -> bool {
        matches!(self, Answers::Publish(_) | Answers::Release)
    }
}

impl Answers {
    /// The QoS of the exchange it is part of.
    fn qos(self) -> QoS {
        match self {
            Answers::Publish(qos) => qos,
            Answers::Release | Answers::Received | Answers::Subscription => QoS::ExactlyOnce,
        }
    }
}

struct Queued {
    ack: Ack,
    /// In a mutex only to make the connection `Sync` (a `&Conn` is held across
    /// awaits); it is reached through `get_mut`, never locked.
    wait: Option<Mutex<BoxFuture<'static, Result<(), Failed>>>>,
    /// The wait's outcome, once it is over.
    outcome: Option<Result<(), Failed>>,
}

/// The connection's acknowledgements not yet sent, in the order of their PUBLISHes.
#[derive(Default)]
pub(super) struct Acks {
    queue: VecDeque<Queued>,
    /// How many of the queued Receive Maximum does not count ([`Answers::counted`]).
    uncounted: usize,
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acks")
            .field("pending", &self.queue.len())
            .finish()
    }
}

impl Acks {
    /// Acknowledgements of the client's own QoS 1/2 exchanges queued (what Receive
    /// Maximum counts; PUBRELs, SUBACKs and UNSUBACKs are not).
    pub fn inbound(&self) -> usize {
        self.queue.len() - self.uncounted
    }

    /// Whether the queue holds `bound` entries of any kind: the connection then reads
    /// nothing more until the front goes. Only what Receive Maximum does not count can
    /// take it there: a client that answers our QoS 2 PUBLISHes (or sends PUBRECs for
    /// ids it never got), or subscribes, faster than the session store writes.
    pub fn full(&self, bound: usize) -> bool {
        self.queue.len() >= bound
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether `ack` may be sent now: it waits for nothing and nothing is ahead of it.
    /// Otherwise it is queued.
    pub fn admit(&mut self, ack: Ack, wait: Wait) -> Option<Ack> {
        if wait.is_empty() && self.queue.is_empty() {
            return Some(ack);
        }
        let (wait, outcome) = match wait.is_empty() {
            true => (None, Some(Ok(()))),
            false => (Some(Mutex::new(wait.into_future())), None),
        };
        self.uncounted += usize::from(!ack.answers.counted());
        self.queue.push_back(Queued { ack, wait, outcome });
        None
    }

    /// Polls the waits from the front until one is not over (or failed: its answer
    /// may close the connection, so nothing behind it is taken before that is
    /// decided); ready once the front one's is over (see [`Acks::pop_ready`]).
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for queued in self.queue.iter_mut() {
            if queued.outcome.is_none() {
                let Some(wait) = queued.wait.as_mut() else {
                    break;
                };
                match wait.get_mut().as_mut().poll(cx) {
                    Poll::Ready(outcome) => {
                        queued.wait = None;
                        queued.outcome = Some(outcome);
                    }
                    Poll::Pending => break,
                }
            }
            if queued.outcome.as_ref().is_some_and(Result::is_err) {
                break;
            }
        }
        match self.queue.front().is_some_and(|q| q.outcome.is_some()) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    }

    /// Forgets every queued acknowledgement (their gates open).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.uncounted = 0;
    }

    /// The front acknowledgement and its wait's outcome, if that wait is over.
    pub fn pop_ready(&mut self) -> Option<(Ack, Result<(), Failed>)> {
        let outcome = self.queue.front_mut()?.outcome.take()?;
        let queued = self.queue.pop_front()?;
        self.uncounted -= usize::from(!queued.ack.answers.counted());
        Some((queued.ack, outcome))
    }
}

impl Conn {
    /// Sends the acknowledgements whose waits are over; then handles what was left
    /// in the read buffer while too many were pending (see the module docs).
    pub(super) async fn acknowledged(
        &mut self,
        rbuf: &mut BytesMut,
        deadlines: &mut Deadlines,
    ) -> Result<(), Close> {
        self.acknowledge()?;
        if rbuf.is_empty() || self.paused.is_some() || self.held.full() || self.acks_full() {
            return Ok(());
        }
        let handled = self.handle_buffered(rbuf).await?;
        if handled > 0 {
            deadlines.read(self.broker.now(), handled, !rbuf.is_empty());
        }
        Ok(())
    }

    /// Sends every queued acknowledgement as its wait ends, until none is left or one
    /// failed in a way that closes the connection.
    pub(super) async fn settle_acks(&mut self) {
        while !self.acks.is_empty() {
            std::future::poll_fn(|cx| self.acks.poll_ready(cx)).await;
            if self.acknowledge().is_err() {
                return;
            }
        }
    }

    /// Whether an MQTT 3.1.1 client has as many PUBLISHes unacknowledged as Receive
    /// Maximum would allow (an MQTT 5 one past it is disconnected, see `inbound.rs`),
    /// or any client has twice that many acknowledgements of any kind queued: nothing
    /// more is read from it until the front one is sent.
    pub(super) fn acks_full(&self) -> bool {
        let maximum = usize::from(self.broker.config().receive_maximum);
        (self.version != ProtocolVersion::V5 && self.acks.inbound() >= maximum)
            || self.acks.full(2 * maximum)
    }

    /// Sends `ack` now if it waits for nothing and nothing is ahead of it; else queues
    /// it. A QoS 0 PUBLISH has no acknowledgement.
    pub(super) fn queue_ack(&mut self, ack: Ack, wait: Wait) -> Result<(), Close> {
        if ack.answers == Answers::Publish(QoS::AtMostOnce) {
            return Ok(());
        }
        match self.acks.admit(ack, wait) {
            Some(ack) => self.send_answer(ack),
            None => Ok(()),
        }
    }

    /// Sends the acknowledgements whose waits are over, in order: a failed forward is
    /// answered as [`Conn::cluster_refused`] says (and the copies it held back
    /// are taken back, see [`OpenOnDrop::refused`]); any other failure closes the
    /// connection without the acknowledgement (the client resends), and nothing
    /// behind it is acknowledged.
    fn acknowledge(&mut self) -> Result<(), Close> {
        while let Some((mut ack, outcome)) = self.acks.pop_ready() {
            let refused = match outcome {
                Ok(()) => Ok(ack.code),
                Err(Failed::Forward(e)) => {
                    if let Some(gate) = ack.gate.take() {
                        gate.refused();
                    }
                    self.cluster_refused(ack.answers.qos(), ack.pid, &e)
                }
                Err(e) => {
                    tracing::error!("{e}; closing the connection of {}", self.info.client_id);
                    let text = match e {
                        Failed::Retained(_) => "retained message not stored",
                        _ => "session state not stored",
                    };
                    Err(Close::ByServer(ReasonCode::UNSPECIFIED_ERROR, text))
                }
            };
            let code = match refused {
                Ok(code) => code,
                Err(close) => {
                    // Nothing behind it is acknowledged, not even by the teardown.
                    self.acks.clear();
                    return Err(close);
                }
            };
            self.send_answer(Ack { code, ..ack })?;
        }
        Ok(())
    }

    /// Sends an acknowledgement whose wait is over (with `ack.code`); then a
    /// message's held copies may go to their subscribers, and a SUBACK's
    /// retained messages are offered.
    fn send_answer(&mut self, ack: Ack) -> Result<(), Close> {
        match ack.reply {
            None => self.send_ack(ack.answers, ack.pid, ack.code)?,
            Some(reply) => {
                self.send(&reply.packet)?;
                for d in reply.retained {
                    self.broker.offer(&self.session, d);
                }
            }
        }
        if let Some(gate) = ack.gate {
            gate.stored();
        }
        Ok(())
    }

    /// Appends a PUBACK (QoS 1), PUBREC (QoS 2) or PUBCOMP with `code`.
    fn send_ack(&mut self, answers: Answers, pid: u16, code: ReasonCode) -> Result<(), Close> {
        let ack = PubResponse {
            reason_code: code,
            ..PubResponse::ok(pid)
        };
        match answers {
            Answers::Publish(qos) if code == ReasonCode::SUCCESS => self.send_success_ack(qos, pid),
            Answers::Publish(QoS::AtLeastOnce) => self.send(&Packet::PubAck(ack)),
            Answers::Publish(_) => self.send(&Packet::PubRec(ack)),
            Answers::Release => self.send(&Packet::PubComp(ack)),
            Answers::Received => self.send(&Packet::PubRel(ack)),
            // Sent by `send_answer` from its reply.
            Answers::Subscription => Ok(()),
        }
    }
}
