//! Deliveries from the session to the socket: flow control (the client's Receive
//! Maximum), server-assigned topic aliases, the client's Maximum Packet Size, and
//! resending what was in flight when a session resumes.

use std::sync::atomic::Ordering;

use statehub_mqtt_codec::{ByteString, Packet, PubResponse, PublishRef, QoS, ReasonCode};

use super::{encode_failed, Close, Conn};
use crate::session::Stage;
use crate::topic;

impl Conn {
    /// On attach: resend unacknowledged PUBLISHes (DUP set) and PUBRELs in their
    /// original order [MQTT-4.4.0-1], before any new message.
    pub(super) fn resume(&mut self) {
        let now = self.broker.now();
        for i in self.session.inflight() {
            let packet = match i.stage {
                Stage::Released => Packet::PubRel(PubResponse::ok(i.packet_id)),
                Stage::Qos1Sent | Stage::Qos2Sent => {
                    Packet::Publish(i.delivery.to_publish(Some(i.packet_id), true, now))
                }
            };
            if self.send(&packet).is_err() {
                return;
            }
        }
    }

    /// Moves queued deliveries into the write buffer while the client's receive
    /// window and our high-water mark allow.
    pub(super) fn drain(&mut self) {
        let high_water = self.broker.config().socket_write_high_water;
        let now = self.broker.now();
        let session = self.session.clone();
        let Some(mut outbox) = session.outbox(self.generation) else {
            // Taken over: the queue belongs to the new connection now.
            return;
        };
        // Counted once per batch: one atomic add per drain, not per message.
        let (mut published, mut published_bytes) = (0, 0);
        while self.wbuf.len() < high_water {
            let Some((d, packet_id)) = outbox.next(self.client_receive_max, now) else {
                break;
            };
            self.reserve_write();
            let (alias, alias_only, new_alias) = self.alias_for(&d.msg.topic);
            // The shared message is written as it is, with this delivery's per-hop
            // fields: no copy of its properties per subscriber.
            let publish = PublishRef {
                dup: d.dup,
                qos: d.qos,
                retain: d.retain,
                topic: if alias_only { "" } else { &d.msg.topic },
                packet_id,
                payload: &d.msg.payload,
                properties: &d.msg.properties,
                message_expiry_interval: d.msg.remaining_expiry(now),
                topic_alias: alias,
                subscription_identifiers: &d.subscription_ids,
            };
            let start = self.wbuf.len();
            if let Err(e) = self.codec.encode_publish(&publish, &mut self.wbuf) {
                self.wbuf.truncate(start);
                let what = format!("PUBLISH on {}", topic::for_log(&d.msg.topic));
                super::encode_failed(&self.broker, &self.info.client_id, &what, &e);
                outbox.discard(&d);
                continue;
            }
            if self.wbuf.len() - start > self.client_max_packet as usize {
                // Over the client's Maximum Packet Size: discard as if delivered [MQTT-3.1.2-25].
                self.wbuf.truncate(start);
                if let Some(topic) = new_alias {
                    self.out_aliases.remove(&topic);
                }
                self.broker
                    .metrics()
                    .oversize_dropped
                    .fetch_add(1, Ordering::Relaxed);
                outbox.discard(&d);
                continue;
            }
            published += 1;
            published_bytes += self.wbuf.len() - start;
            outbox.sent(d, packet_id);
        }
        if published > 0 {
            let m = self.broker.metrics();
            m.packets_out.add(3, published, published_bytes);
        }
        let expired = outbox.expired();
        drop(outbox);
        if expired > 0 {
            // A reply held up past its Message Expiry Interval, a backlog: dropped as
            // the spec says [MQTT-3.3.2-5], and counted.
            self.broker
                .metrics()
                .expired_dropped
                .fetch_add(expired as u64, Ordering::Relaxed);
            tracing::debug!(client = %self.info.client_id, expired, "expired messages dropped unsent");
        }
    }

    /// The topic alias to send `topic` with, for a client that allows them: (alias,
    /// whether the alias alone stands for the topic, the topic if this call assigned
    /// a new alias).
    fn alias_for(&mut self, topic: &ByteString) -> (Option<u16>, bool, Option<ByteString>) {
        if self.client_alias_max == 0 {
            return (None, false, None);
        }
        if let Some(&alias) = self.out_aliases.get(topic) {
            return (Some(alias), true, None);
        }
        let Some(next) = u16::try_from(self.out_aliases.len() + 1)
            .ok()
            .filter(|n| *n <= self.client_alias_max)
        else {
            return (None, false, None);
        };
        // A copy: the message's topic keeps its whole read buffer alive.
        let topic = ByteString::from(&**topic);
        self.out_aliases.insert(topic.clone(), next);
        (Some(next), false, Some(topic))
    }
}

impl Conn {
    /// Appends a PUBACK (QoS 1) or PUBREC (QoS 2) saying Success, as [`Conn::send`]
    /// would, without building the packet.
    pub(super) fn send_success_ack(&mut self, qos: QoS, packet_id: u16) -> Result<(), Close> {
        tracing::trace!(client = %self.info.client_id, ?qos, packet_id, "sending success ack");
        self.reserve_write();
        let start = self.wbuf.len();
        let encoded = self
            .codec
            .encode_success_ack(qos, packet_id, &mut self.wbuf);
        encoded.map_err(|e| {
            encode_failed(&self.broker, &self.info.client_id, "acknowledgement", &e);
            Close::ByServer(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR, "encode failed")
        })?;
        let kind = if qos == QoS::ExactlyOnce { 5 } else { 4 };
        let m = self.broker.metrics();
        m.packets_out.add(kind, 1, self.wbuf.len() - start);
        Ok(())
    }
}

/// `p` without Reason String and User Properties, for a client that asked for no
/// problem information; `None` if it may keep them (PUBLISH, CONNACK, DISCONNECT) or
/// has none.
pub(super) fn without_problem_info(p: &Packet) -> Option<Packet> {
    let mut p = p.clone();
    let (reason, user) = match &mut p {
        Packet::PubAck(a) | Packet::PubRec(a) | Packet::PubRel(a) | Packet::PubComp(a) => {
            (&mut a.reason_string, &mut a.user_properties)
        }
        Packet::SubAck(a) => (&mut a.reason_string, &mut a.user_properties),
        Packet::UnsubAck(a) => (&mut a.reason_string, &mut a.user_properties),
        Packet::Auth(a) => (&mut a.reason_string, &mut a.user_properties),
        _ => return None,
    };
    if reason.is_none() && user.is_empty() {
        return None;
    }
    *reason = None;
    user.clear();
    Some(p)
}
