//! The end of a connection: the DISCONNECT we owe, detaching from the session,
//! shared-subscription hand-over, the will, and the session's expiry clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use statehub_mqtt_codec::{
    ByteString, Disconnect, LastWill, Packet, ProtocolVersion, Publish, PublishProperties,
    ReasonCode,
};

use super::{Close, Conn};
use crate::message::Message;
use crate::session::Session;
use crate::transport::Transport;
use crate::Broker;

/// How long the socket of a slow consumer stays open after its DISCONNECT 0x97 for the
/// consumer to read that far.
const SLOW_CONSUMER_FLUSH: Duration = Duration::from_secs(5);

impl Conn {
    pub(super) async fn finish<S: Transport>(mut self: Box<Self>, stream: &mut S, close: Close) {
        let started = tokio::time::Instant::now();
        let mut flush = Duration::from_secs(1);
        if !matches!(close, Close::Lost | Close::Expired) {
            // The PUBLISHes read before what closes the connection (the client's
            // DISCONNECT, or a packet the server refuses by closing) are acknowledged
            // first, as their writes end, for a while. One whose write failed already
            // forgot those behind it (see `acks.rs`).
            let _ = tokio::time::timeout(flush, self.settle_acks()).await;
        }
        if let Close::ByServer(code, text) = &close {
            if *code == ReasonCode::QUOTA_EXCEEDED {
                // A slow consumer: its backlog is what it cannot read. The DISCONNECT
                // goes right after the packet part-written, and the socket stays open
                // longer for the consumer to read that far (what was in flight is
                // resent on resume).
                self.drop_unsent();
                flush = SLOW_CONSUMER_FLUSH;
            }
            if self.version == ProtocolVersion::V5 {
                self.send_disconnect(*code, text);
            }
            tracing::debug!(client = %self.info.client_id, code = code.0, reason = text, "server closes connection");
        }
        if !self.wbuf.is_empty() {
            let _ = tokio::time::timeout(flush, stream.write_all(&self.wbuf)).await;
        }
        let _ = stream.shutdown().await;
        if matches!(close, Close::ByServer(..)) {
            let brief = tokio::time::Instant::now() + Duration::from_millis(500);
            linger(stream, brief.max(started + flush)).await;
        }

        let owner =
            self.broker
                .release_session(&self.session, self.generation, self.session_expiry);
        let shutting_down = self.broker.is_shutting_down();
        let send_will = !shutting_down && !matches!(close, Close::ByClient { will: false });
        // Rules replaced since CONNECT judge the will as it goes.
        let will = self
            .will
            .take()
            .filter(|w| send_will && self.publish_denied(&w.topic).is_none());
        if let Some(will) = will {
            schedule_will(
                &self.broker,
                &self.session,
                self.generation,
                *will,
                self.session_expiry,
            );
        }
        if owner {
            self.broker.notify_services_closed(&self.info.client_id);
        }
    }

    /// Appends our DISCONNECT, without its reason string if the client asked for no
    /// problem information (Request Problem Information 0: the spec allows one on a
    /// DISCONNECT, the client asked not to get it) or if it would exceed the client's
    /// Maximum Packet Size [MQTT-3.14.2-3].
    fn send_disconnect(&mut self, code: ReasonCode, text: &'static str) {
        let start = self.wbuf.len();
        let mut packet = Disconnect {
            reason_code: code,
            reason_string: self.problem_info.then(|| text.into()),
            ..Default::default()
        };
        let _ = self.send(&Packet::Disconnect(packet.clone()));
        if self.wbuf.len() - start > self.client_max_packet as usize {
            self.wbuf.truncate(start);
            packet.reason_string = None;
            let _ = self.send(&Packet::Disconnect(packet));
        }
    }
}

/// After the server's DISCONNECT and FIN, reads and discards what the client
/// still sends until it closes or `deadline`, so closing does not reset the
/// connection before the client has read our DISCONNECT [MQTT-4.13.2-1: the reason
/// must reach it] (a reset makes the client's system drop what it had not read).
async fn linger<S: Transport>(stream: &mut S, deadline: tokio::time::Instant) {
    let mut sink = BytesMut::with_capacity(4096);
    while let Ok(Ok(())) = tokio::time::timeout_at(deadline, stream.readable()).await {
        sink.clear();
        match stream.try_read_buf(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
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
        broker.publish(will_message(will, publisher, broker.now()));
        return;
    }
    let broker = broker.clone();
    let session = session.clone();
    let shutdown = broker.shutdown_token();
    tokio::spawn(async move {
        tokio::select! {
            () = broker.clock().sleep(Duration::from_secs(u64::from(delay))) => {
                if !session.last_attached(generation) {
                    return;
                }
            }
            () = session.ended() => {}
            () = shutdown.cancelled() => return,
        }
        broker.publish(will_message(will, publisher, broker.now()));
    });
}

/// The will as an application message; its expiry counts from now, the moment it
/// is published.
fn will_message(will: LastWill, publisher: ByteString, now: Instant) -> Message {
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
    Message::from_publish(publish, Some(publisher), now)
}
