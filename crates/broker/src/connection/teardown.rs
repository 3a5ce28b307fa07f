//! The end of a connection: the DISCONNECT we owe, detaching from the session,
//! shared-subscription hand-over, the will, and the session's expiry clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use statehub_mqtt_codec::{
    ByteString, Disconnect, LastWill, Packet, ProtocolVersion, Publish, PublishProperties, QoS,
    ReasonCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Close, Conn};
use crate::message::{Delivery, Message};
use crate::session::Session;
use crate::Broker;

impl Conn {
    pub(super) async fn finish(mut self, stream: &mut TcpStream, close: Close) {
        if let Close::ByServer(code, text) = &close {
            if self.version == ProtocolVersion::V5 {
                self.send_disconnect(*code, text);
            }
            tracing::debug!(client = %self.info.client_id, code = code.0, reason = text, "server closes connection");
        }
        if !self.wbuf.is_empty() {
            let _ =
                tokio::time::timeout(Duration::from_secs(1), stream.write_all(&self.wbuf)).await;
        }
        let _ = stream.shutdown().await;
        if matches!(close, Close::ByServer(..)) {
            linger(stream).await;
        }

        let owner = self.detach();
        let shutting_down = self.broker.inner.shutdown.is_cancelled();
        let send_will = !shutting_down && !matches!(close, Close::ByClient { will: false });
        if let (true, Some(will)) = (send_will, self.will.take()) {
            schedule_will(
                &self.broker,
                &self.session,
                self.generation,
                will,
                self.session_expiry,
            );
        }
        if owner {
            self.hand_over_shared();
            let expiry = self.session_expiry;
            if expiry == 0 {
                self.broker.end_session(&self.session);
            } else {
                let never = expiry == u32::MAX;
                schedule_expiry(
                    &self.broker,
                    &self.session,
                    self.generation,
                    (!never).then(|| Duration::from_secs(u64::from(expiry))),
                );
            }
            self.broker.notify_services_closed(&self.info.client_id);
        }
    }

    /// Appends our DISCONNECT, without its reason string if that would exceed the
    /// client's Maximum Packet Size [MQTT-3.14.2-3].
    fn send_disconnect(&mut self, code: ReasonCode, text: &'static str) {
        let start = self.wbuf.len();
        let mut packet = Disconnect {
            reason_code: code,
            reason_string: Some(text.into()),
            ..Default::default()
        };
        let _ = self.send(&Packet::Disconnect(packet.clone()));
        if self.wbuf.len() - start > self.client_max_packet as usize {
            self.wbuf.truncate(start);
            packet.reason_string = None;
            let _ = self.send(&Packet::Disconnect(packet));
        }
    }

    /// Detaches from the session if this connection still owns it.
    fn detach(&mut self) -> bool {
        let mut st = self.session.state.lock();
        if st
            .attached
            .as_ref()
            .is_some_and(|a| a.generation == self.generation)
        {
            st.attached = None;
            st.expiry_interval = self.session_expiry;
            self.session.set_connected(false);
            if self.session_expiry > 0 {
                // Its expiry clock starts now, on disk too (an expiry of 0 ends the
                // session, which forgets it).
                st.save(self.session.client_id(), true);
            }
            true
        } else {
            false
        }
    }

    /// Gives messages that came through shared subscriptions and were not
    /// acknowledged to another member of their group.
    fn hand_over_shared(&self) {
        let taken: Vec<Delivery> = {
            let mut st = self.session.state.lock();
            let mut taken = Vec::new();
            st.inflight.retain(|i| {
                let shared = i.delivery.shared.is_some() && i.delivery.qos != QoS::ExactlyOnce;
                if shared {
                    taken.push(i.delivery.clone());
                }
                !shared
            });
            let queue = std::mem::take(&mut st.queue);
            for d in queue {
                if d.shared.is_some() {
                    taken.push(d);
                } else {
                    st.queue.push_back(d);
                }
            }
            st.queued_bytes = st.queue.iter().map(|d| d.msg.weight()).sum();
            taken
        };
        for d in taken {
            let Some(via) = d.shared.clone() else {
                continue;
            };
            let seq = d.seq;
            if !self
                .broker
                .reroute_shared(&d, &via, self.session.client_id())
            {
                self.broker.offer(&self.session, d);
            }
            // Forgotten here only once recorded where it went (the store keeps order).
            self.session.state.lock().forget(seq);
        }
    }
}

/// After the server's DISCONNECT and FIN, reads and discards what the client
/// still sends (briefly), so closing does not reset the connection before the
/// client has read our DISCONNECT [MQTT-4.13.2-1: the reason must reach it].
async fn linger(stream: &mut TcpStream) {
    let mut sink = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, stream.read(&mut sink)).await {
        if n == 0 {
            break;
        }
    }
}

/// Publishes the will after its delay, unless the session is resumed first; sooner
/// if the session ends first [MQTT-3.1.3-9].
fn schedule_will(
    broker: &Broker,
    session: &Arc<Session>,
    generation: u64,
    will: LastWill,
    expiry: u32,
) {
    let delay = will.properties.will_delay_interval.unwrap_or(0).min(expiry);
    let publisher = session.client_id_bytes().clone();
    if delay == 0 {
        broker.publish(will_message(will, publisher));
        return;
    }
    let broker = broker.clone();
    let session = session.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(u64::from(delay))) => {
                if session.state.lock().last_generation != generation {
                    return;
                }
            }
            () = session.ended.cancelled() => {}
            () = broker.inner.shutdown.cancelled() => return,
        }
        broker.publish(will_message(will, publisher));
    });
}

/// The will as an application message; its expiry counts from now, the moment it
/// is published.
fn will_message(will: LastWill, publisher: ByteString) -> Message {
    let p = will.properties;
    let publish = Publish {
        dup: false,
        qos: will.qos,
        retain: will.retain,
        topic: will.topic,
        packet_id: None,
        payload: will.payload,
        properties: PublishProperties {
            payload_format_utf8: p.payload_format_utf8,
            message_expiry_interval: p.message_expiry_interval,
            response_topic: p.response_topic,
            correlation_data: p.correlation_data,
            user_properties: p.user_properties,
            content_type: p.content_type,
            ..Default::default()
        },
    };
    Message::from_publish(publish, Some(publisher), Instant::now())
}

/// Ends the session when `expires_in` passes without a new connection (`None`:
/// it never expires). `generation` is the last connection's.
pub(crate) fn schedule_expiry(
    broker: &Broker,
    session: &Arc<Session>,
    generation: u64,
    expires_in: Option<Duration>,
) {
    let Some(expires_in) = expires_in else { return };
    let broker = broker.clone();
    let session = session.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(expires_in) => {}
            () = session.ended.cancelled() => return,
        }
        let idle = {
            let st = session.state.lock();
            st.attached.is_none() && st.last_generation == generation
        };
        if idle {
            tracing::debug!(client = session.client_id(), "session expired");
            broker.end_session(&session);
        }
    });
}
