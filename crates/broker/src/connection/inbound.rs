//! Packets from the client, once connected.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use smallvec::SmallVec;
use statehub_mqtt_codec::{
    validate, ByteString, Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode,
};

use super::acks::{Ack, Answers, OpenOnDrop, Wait};
use super::{Close, Conn};
use crate::broker::{Blockers, Routed};
use crate::config::QueueFull;
use crate::fabric::FabricError;
use crate::message::Message;
use crate::ratelimit::LogLimit;
use crate::service::Service;
use crate::session::{IncomingQos2, PubRec, Session, Stage};
use crate::session_store::{Gate, Group};
use crate::topic;

/// The service a PUBLISH goes to, if [`Conn::handling`] decided it already.
pub(super) enum Served {
    Decided(Option<Arc<dyn Service>>),
    Undecided,
}

impl Conn {
    /// How `p` is handled: whether its handling never waits (a PUBLISH to no service
    /// that may wait, or a PUBREL or PUBREC: what the answer waits for is queued, see
    /// `acks.rs`; not one of the rare packets
    /// whose handlers are boxed; such a packet is handled by [`Conn::handle_now`]),
    /// and, for a PUBLISH, the service that owns its topic, decided here once.
    pub(super) fn handling(&self, p: &Packet) -> (bool, Served) {
        match p {
            Packet::Publish(p) => {
                let service = self.service_of(p);
                let in_place = service.as_ref().is_none_or(|s| s.answers_in_place());
                (in_place, Served::Decided(service))
            }
            Packet::Subscribe(_) | Packet::Unsubscribe(_) | Packet::Auth(_) => {
                (false, Served::Undecided)
            }
            _ => (true, Served::Undecided),
        }
    }

    /// The service that owns a PUBLISH's topic (its alias resolved), if any. An unknown
    /// alias has none: the PUBLISH is refused before any service could see it.
    fn service_of(&self, p: &Publish) -> Option<Arc<dyn Service>> {
        let topic = match (p.topic.is_empty(), p.properties.topic_alias) {
            (true, Some(alias)) => self.in_aliases.get(&alias).map(|t| &**t),
            _ => Some(&*p.topic),
        };
        topic.and_then(|t| self.broker.service_for(t))
    }

    /// Handles a packet whose handling [`Conn::handling`] found never waits, polling its
    /// handler once on this thread's stack instead of in the connection's future.
    pub(super) fn handle_now(&mut self, p: Packet, served: Served) -> Result<(), Close> {
        let mut cx = Context::from_waker(Waker::noop());
        let polled = pin!(self.handle(p, served)).poll(&mut cx);
        match polled {
            Poll::Ready(done) => done,
            Poll::Pending => {
                // `handling` let through a packet whose handling waits: our bug.
                static LOG: LogLimit = LogLimit::per_secs(10);
                if let Some(left_out) = LOG.allow() {
                    tracing::error!(client = %self.info.client_id, left_out, "a packet's handling waited where it cannot; closing the connection");
                }
                Err(Close::ByServer(
                    ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
                    "internal error",
                ))
            }
        }
    }

    /// Handles one packet; `served` is what [`Conn::handling`] found, if it was asked.
    pub(super) async fn handle(&mut self, p: Packet, served: Served) -> Result<(), Close> {
        tracing::trace!(client = %self.info.client_id, packet = ?p, "received");
        match p {
            Packet::Publish(p) => {
                let service = match served {
                    Served::Decided(service) => service,
                    Served::Undecided => self.service_of(&p),
                };
                self.on_publish(p, service).await
            }
            Packet::PubAck(a) => {
                self.session.complete(a.packet_id, Stage::Qos1Sent);
                Ok(())
            }
            Packet::PubRec(r) => self.on_pubrec(r),
            Packet::PubRel(r) => {
                let released = self.session.release_qos2(r.packet_id);
                let code = if released.is_some() {
                    ReasonCode::SUCCESS
                } else {
                    ReasonCode::PACKET_IDENTIFIER_NOT_FOUND
                };
                // A PUBCOMP frees the id for the client's next message: a restart must
                // not take that one for a duplicate. Queued like a PUBACK, so the
                // connection reads on meanwhile.
                let ack = Ack {
                    answers: Answers::Release,
                    pid: r.packet_id,
                    code,
                    gate: None,
                    reply: None,
                };
                let wait = self.stored_wait(released == Some(true));
                self.queue_ack(ack, wait)
            }
            Packet::PubComp(c) => {
                self.session.complete(c.packet_id, Stage::Released);
                Ok(())
            }
            // The rare packets' handlers are boxed: a connection's future is as large
            // as its largest state, for its whole life (see `serve`).
            Packet::Subscribe(s) => Box::pin(self.on_subscribe(s)).await,
            Packet::Unsubscribe(u) => Box::pin(self.on_unsubscribe(u)).await,
            Packet::PingReq => self.send(&Packet::PingResp),
            Packet::Disconnect(d) => {
                Err(self.on_disconnect(d.reason_code, d.session_expiry_interval))
            }
            Packet::Auth(a) => Box::pin(self.on_auth(a)).await,
            Packet::Connect(_) => Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "second CONNECT [MQTT-3.1.0-2]",
            )),
            Packet::ConnAck(_) | Packet::SubAck(_) | Packet::UnsubAck(_) | Packet::PingResp => {
                Err(Close::ByServer(
                    ReasonCode::PROTOCOL_ERROR,
                    "server-to-client packet sent by a client",
                ))
            }
        }
    }

    async fn on_publish(
        &mut self,
        mut p: Publish,
        service: Option<Arc<dyn Service>>,
    ) -> Result<(), Close> {
        self.within_publish_rate()?;
        // The topic is valid: the codec checked every non-empty one [MQTT-3.3.2-2], and
        // an alias stands for a topic checked when the alias was set.
        self.resolve_alias(&mut p)?;
        if p.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| validate::topic_name(t).is_err())
        {
            return Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "invalid Response Topic [MQTT-3.3.2-14]",
            ));
        }
        let pid = p.packet_id.unwrap_or(0);
        if p.qos != QoS::AtMostOnce {
            self.within_receive_maximum()?;
        }
        if p.qos == QoS::ExactlyOnce && self.qos2_duplicate(pid)? {
            return Ok(());
        }
        if topic::too_deep(&p.topic, self.broker.config().max_topic_levels) {
            let text = "topic has more levels than max_topic_levels";
            if p.qos == QoS::AtMostOnce {
                return Err(Close::ByServer(ReasonCode::TOPIC_NAME_INVALID, text));
            }
            tracing::debug!(client = %self.info.client_id, "{text}; answering 0x90");
            return self.ack_publish(p.qos, pid, ReasonCode::TOPIC_NAME_INVALID, false);
        }
        if let Err(code) = validate::payload_utf8(&p) {
            if p.qos == QoS::AtMostOnce {
                return Err(Close::ByServer(code, "payload is not UTF-8 [MQTT-3.3.2-4]"));
            }
            return self.ack_publish(p.qos, pid, code, false);
        }
        if let Some(reason) = self.publish_denied(&p.topic) {
            return self.deny_publish(p.qos, pid, reason);
        }
        let qos = p.qos;
        // Opened once this publish is acknowledged (after its waits) or failed.
        let gate = (self.publish_gate(qos))
            .filter(|_| service.is_none())
            .map(Arc::new);
        let store = self.broker.session_store().filter(|_| gate.is_some());
        let open_when_done = (gate.clone())
            .zip(store)
            .map(|(g, s)| OpenOnDrop::new(g, s, self.broker.clone()));
        let (code, wait) = if let Some(service) = service {
            (ReasonCode::SUCCESS, self.serve(service, &p, pid).await)
        } else {
            match self.route_publish(p, pid, gate.as_ref())? {
                Some(routed) => routed,
                None => return Ok(()),
            }
        };
        let ack = Ack {
            answers: Answers::Publish(qos),
            pid,
            code,
            gate: open_when_done,
            reply: None,
        };
        self.queue_ack(ack, wait)
    }

    /// The gate this PUBLISH's local copies wait behind ([`Gate`]): in a cluster every
    /// copy of a QoS 1/2 message, until the other nodes took it (or were refused it:
    /// then the copies are taken back, `Broker::withdraw_refused`); with a session
    /// store, a QoS 2 message's stored copies, until they are durable.
    fn publish_gate(&self, qos: QoS) -> Option<Gate> {
        self.broker.session_store()?;
        match (qos, self.broker.fabric().is_some()) {
            (QoS::AtMostOnce, _) | (QoS::AtLeastOnce, false) => None,
            (_, true) => Some(Gate::every_copy()),
            (QoS::ExactlyOnce, false) => Some(Gate::default()),
        }
    }

    /// Hands a PUBLISH to the service that owns its topic; what its acknowledgement
    /// waits for. Taken over at once where the service can (the connection reads on,
    /// and the acknowledgement waits in order for the service's answer), else awaited
    /// here.
    async fn serve(&mut self, service: Arc<dyn Service>, p: &Publish, pid: u16) -> Wait {
        self.refresh_service_access();
        let served = match p.qos == QoS::AtMostOnce || service.answers_in_place() {
            true => None,
            false => service.clone().start_publish(&self.broker, &self.info, p),
        };
        if served.is_none() {
            service.on_publish(&self.broker, &self.info, p).await;
        }
        let stored = p.qos == QoS::ExactlyOnce && self.session.receive_qos2(pid);
        Wait {
            served,
            ..self.stored_wait(stored)
        }
    }

    /// An MQTT 5 client may have Receive Maximum QoS 1/2 PUBLISHes unacknowledged; one
    /// more closes its connection with 0x93 (an MQTT 3.1.1 one is not read past that,
    /// see `acks.rs`).
    fn within_receive_maximum(&self) -> Result<(), Close> {
        let maximum = usize::from(self.broker.config().receive_maximum);
        if self.version != ProtocolVersion::V5 || self.acks.inbound() < maximum {
            return Ok(());
        }
        Err(Close::ByServer(
            ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
            "receive maximum exceeded [MQTT-3.3.4-9]",
        ))
    }

    /// A QoS 2 PUBLISH whose packet id is still held is a duplicate: answered PUBREC
    /// again and not delivered twice (`Ok(true)`); one past Receive Maximum closes the
    /// connection.
    fn qos2_duplicate(&mut self, pid: u16) -> Result<bool, Close> {
        let maximum = self.broker.config().receive_maximum;
        match self.session.incoming_qos2(pid, maximum) {
            IncomingQos2::Duplicate => {
                // Behind the original's PUBREC if that still waits.
                self.ack_publish(QoS::ExactlyOnce, pid, ReasonCode::SUCCESS, false)?;
                Ok(true)
            }
            IncomingQos2::OverMaximum => Err(Close::ByServer(
                ReasonCode::RECEIVE_MAXIMUM_EXCEEDED,
                "receive maximum exceeded [MQTT-3.3.4-9]",
            )),
            IncomingQos2::New => Ok(false),
        }
    }

    /// Routes a client's PUBLISH to the sessions it matches (and keeps it if retained):
    /// the acknowledgement's code and what it waits for (the retained change, the
    /// other nodes, the copies persistent sessions stored), or `None` when it was
    /// refused (already answered).
    fn route_publish(
        &mut self,
        p: Publish,
        pid: u16,
        gate: Option<&Arc<Gate>>,
    ) -> Result<Option<(ReasonCode, Wait)>, Close> {
        let qos = p.qos;
        if qos != QoS::AtMostOnce && self.broker.fabric().is_some_and(|f| !f.is_available()) {
            // Refused before any node delivers it, so the client's resend duplicates
            // nothing.
            let e = FabricError::Unavailable("not connected".into());
            let code = self.cluster_refused(qos, pid, &e)?;
            self.ack_publish(qos, pid, code, false)?;
            return Ok(None);
        }
        let msg = Arc::new(Message::from_publish(
            p,
            Some(self.info.client_id.clone()),
            self.broker.now(),
        ));
        let mut durable = None;
        let (mut routed, pressed) = self.route_and_receive(&msg, pid, gate, || {
            if msg.retain {
                durable = self.broker.store_retained(&msg);
            }
        });
        self.pause_for(pressed);
        if routed.refused {
            self.refuse_publish(qos, pid)?;
            return Ok(None);
        }
        if qos == QoS::AtMostOnce {
            return Ok(Some((ReasonCode::SUCCESS, Wait::default())));
        }
        // With a retain store, the ack waits until the retained change is durable; in a
        // cluster, until the other nodes will get it (whether any of them has a
        // subscriber is not known here).
        let mut wait = self.stored_wait(routed.stored);
        wait.retained = durable;
        wait.forwarded = routed.forwarded.take();
        let code = match routed.sessions {
            0 if self.broker.fabric().is_none() => ReasonCode::NO_MATCHING_SUBSCRIBERS,
            _ => ReasonCode::SUCCESS,
        };
        Ok(Some((code, wait)))
    }

    /// A QoS 1/2 PUBLISH the other nodes cannot be given: the reason code an MQTT 5
    /// client is answered with; an MQTT 3.1.1 one cannot be told, so its connection
    /// closes without the acknowledgement and it resends the message when it
    /// reconnects.
    pub(super) fn cluster_refused(
        &mut self,
        qos: QoS,
        pid: u16,
        e: &FabricError,
    ) -> Result<ReasonCode, Close> {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let m = self.broker.metrics();
        m.cluster_refused.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(client = %self.info.client_id, left_out, "PUBLISH refused: {e}");
        }
        // A refused QoS 2 message is not received: the same packet id may come again.
        if qos == QoS::ExactlyOnce {
            self.session.release_qos2(pid);
        }
        if self.version == ProtocolVersion::V5 {
            return Ok(e.reason_code());
        }
        Err(Close::ByServer(
            ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
            "the cluster is unavailable (MQTT 3.1.1 cannot say so)",
        ))
    }

    /// Takes a token from `max_publish_rate`'s bucket; with none left the connection
    /// closes with 0x96 Message rate too high (counted, logged rate-limited).
    fn within_publish_rate(&mut self) -> Result<(), Close> {
        let Some(bucket) = &mut self.publish_rate else {
            return Ok(());
        };
        let rate = self.broker.config().max_publish_rate;
        if bucket.take(self.broker.now(), rate, rate) {
            return Ok(());
        }
        static LOG: LogLimit = LogLimit::per_secs(10);
        let m = self.broker.metrics();
        m.publish_rate_exceeded.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                client = %self.info.client_id,
                left_out,
                "PUBLISH rate above max_publish_rate; DISCONNECT 0x96"
            );
        }
        Err(Close::ByServer(
            ReasonCode::MESSAGE_RATE_TOO_HIGH,
            "PUBLISH rate above max_publish_rate",
        ))
    }

    /// Answers a PUBLISH the client may not make, which goes nowhere: PUBACK/PUBREC
    /// 0x87 for MQTT 5 (nothing for QoS 0); for MQTT 3.1.1, which has no way to say so,
    /// the normal acknowledgement [MQTT-3.3.5-2].
    fn deny_publish(&mut self, qos: QoS, pid: u16, reason: &str) -> Result<(), Close> {
        tracing::debug!(client = %self.info.client_id, reason, "PUBLISH dropped");
        if self.version == ProtocolVersion::V5 {
            return self.ack_publish(qos, pid, ReasonCode::NOT_AUTHORIZED, false);
        }
        // A QoS 2 receipt is kept, so the client's PUBREL finds it.
        let stored = qos == QoS::ExactlyOnce && self.session.receive_qos2(pid);
        self.ack_publish(qos, pid, ReasonCode::SUCCESS, stored)
    }

    /// Routes a client's message (`accepted` runs unless it is refused, see
    /// [`Broker::route_with`]) and, for QoS 2, records its receipt (so a resent
    /// PUBLISH is known for a duplicate), the two atomically in the session store.
    /// Also returns the sessions past their high-water mark it went to, which this
    /// connection waits for (see `pressure.rs`).
    fn route_and_receive(
        &self,
        msg: &Arc<Message>,
        pid: u16,
        gate: Option<&Arc<Gate>>,
        accepted: impl FnOnce(),
    ) -> (Routed, SmallVec<[Arc<Session>; 2]>) {
        let all_or_nothing =
            msg.qos != QoS::AtMostOnce && self.broker.queue_limits().policy == QueueFull::Refuse;
        let mut blockers = Blockers::new(&self.session);
        let pressure = (msg.qos != QoS::AtMostOnce && self.slow_consumer_timeout().is_some())
            .then_some(&mut blockers);
        if msg.qos != QoS::ExactlyOnce {
            let routed = (self.broker).route_with(msg, gate, all_or_nothing, pressure, accepted);
            return (routed, blockers.pressed);
        }
        let store = self
            .broker
            .session_store()
            .filter(|_| self.session.is_persistent());
        let _group = store.map(Group::open);
        let mut routed = (self.broker).route_with(msg, gate, all_or_nothing, pressure, accepted);
        if !routed.refused {
            routed.stored |= self.session.receive_qos2(pid);
        }
        (routed, blockers.pressed)
    }

    /// Answers a PUBLISH that a full queue refused: 0x97 to an MQTT 5 client. An MQTT
    /// 3.1.1 one cannot be told: its connection closes without the acknowledgement,
    /// and it resends the message when it reconnects.
    fn refuse_publish(&mut self, qos: QoS, pid: u16) -> Result<(), Close> {
        if self.version == ProtocolVersion::V5 {
            return self.ack_publish(qos, pid, ReasonCode::QUOTA_EXCEEDED, false);
        }
        let m = self.broker.metrics();
        m.refused_quota_closed.fetch_add(1, Ordering::Relaxed);
        Err(Close::ByServer(
            ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR,
            "a subscriber's queue is full (MQTT 3.1.1 cannot say Quota exceeded)",
        ))
    }

    /// Acknowledges a PUBLISH, once what the acknowledgement promises is durable
    /// (`stored`: the copies queued for persistent sessions and, for QoS 2, the
    /// receipt), after the acknowledgements of the PUBLISHes before it.
    fn ack_publish(
        &mut self,
        qos: QoS,
        pid: u16,
        code: ReasonCode,
        stored: bool,
    ) -> Result<(), Close> {
        let wait = match qos {
            QoS::AtMostOnce => Wait::default(),
            _ => self.stored_wait(stored),
        };
        let gate = None;
        self.queue_ack(
            Ack {
                answers: Answers::Publish(qos),
                pid,
                code,
                gate,
                reply: None,
            },
            wait,
        )
    }

    /// What an acknowledgement waits for when the session store recorded what it
    /// acknowledges (`stored`): a barrier, after those records.
    fn stored_wait(&self, stored: bool) -> Wait {
        Wait {
            stored: stored.then(|| self.broker.session_store()).flatten(),
            ..Wait::default()
        }
    }

    /// Applies an incoming Topic Alias [MQTT-3.3.2-7..12].
    fn resolve_alias(&mut self, p: &mut Publish) -> Result<(), Close> {
        let Some(alias) = p.properties.topic_alias.take() else {
            if p.topic.is_empty() {
                return Err(Close::ByServer(
                    ReasonCode::PROTOCOL_ERROR,
                    "empty topic without alias [MQTT-3.3.2-1]",
                ));
            }
            return Ok(());
        };
        if alias == 0 || alias > self.broker.config().topic_alias_maximum {
            return Err(Close::ByServer(
                ReasonCode::TOPIC_ALIAS_INVALID,
                "topic alias out of range [MQTT-3.3.2-9]",
            ));
        }
        if p.topic.is_empty() {
            match self.in_aliases.get(&alias) {
                Some(t) => p.topic = t.clone(),
                None => {
                    return Err(Close::ByServer(
                        ReasonCode::PROTOCOL_ERROR,
                        "unknown topic alias (MQTT 5.0 section 3.3.4)",
                    ))
                }
            }
        } else {
            // A copy: the topic is a slice of the read buffer, which it would keep
            // alive for the connection's life.
            self.in_aliases.insert(alias, ByteString::from(&*p.topic));
        }
        Ok(())
    }

    /// Answers a PUBREC of our QoS 2 PUBLISH with a PUBREL, queued like a PUBACK (in
    /// the order of the PUBRECs [MQTT-4.6.0-4]) while a persistent session stores that
    /// the message was released, so the connection reads on meanwhile.
    fn on_pubrec(&mut self, r: PubResponse) -> Result<(), Close> {
        let accepted = r.reason_code.is_success();
        let (code, stored) = match self
            .session
            .pubrec(r.packet_id, accepted, self.broker.now())
        {
            PubRec::Refused => return Ok(()),
            PubRec::Unknown => (ReasonCode::PACKET_IDENTIFIER_NOT_FOUND, false),
            PubRec::Released { stored } => (ReasonCode::SUCCESS, stored),
        };
        let ack = Ack {
            answers: Answers::Received,
            pid: r.packet_id,
            code,
            gate: None,
            reply: None,
        };
        let wait = self.stored_wait(stored);
        self.queue_ack(ack, wait)
    }

    fn on_disconnect(&mut self, code: ReasonCode, expiry: Option<u32>) -> Close {
        if let Some(e) = expiry {
            if self.connect_expiry_zero && e != 0 {
                return Close::ByServer(
                    ReasonCode::PROTOCOL_ERROR,
                    "session expiry set on DISCONNECT after 0 at CONNECT [MQTT-3.14.2-2]",
                );
            }
            self.session_expiry = e.min(self.broker.config().max_session_expiry);
        }
        Close::ByClient {
            will: code == ReasonCode::DISCONNECT_WITH_WILL,
        }
    }
}
