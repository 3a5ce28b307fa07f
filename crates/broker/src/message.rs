//! An application message as the broker routes it, and one delivery of it to one
//! session. A [`Message`] is built once per PUBLISH received and shared by `Arc`
//! across every subscriber: the payload and properties are never copied per
//! subscriber, only the few per-delivery fields (QoS, subscription ids) differ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use statehub_mqtt_codec::{ByteString, Publish, PublishProperties, QoS};

/// A message in flight through the broker.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: ByteString,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// As received, minus Topic Alias and Subscription Identifiers (per-hop fields).
    pub properties: PublishProperties,
    /// Deadline from the Message Expiry Interval, counted from receipt.
    pub expires_at: Option<Instant>,
    /// Client id of the publisher (for No Local); `None` for broker-made messages.
    pub publisher: Option<ByteString>,
    /// Set on a broker-made answer to one client (a state store response): it goes to
    /// that client's matching subscriptions only, never to another client's, whatever
    /// they subscribed to (`#` included).
    pub recipient: Option<ByteString>,
}

impl Message {
    /// Builds the routed form of a received PUBLISH (topic alias already resolved).
    pub fn from_publish(p: Publish, publisher: Option<ByteString>, now: Instant) -> Message {
        let mut properties = p.properties;
        properties.topic_alias = None;
        properties.subscription_identifiers.clear();
        // An interval too far out for the clock (where `Instant` would overflow) is as
        // good as none.
        let expires_at = properties
            .message_expiry_interval
            .and_then(|s| now.checked_add(Duration::from_secs(u64::from(s))));
        Message {
            topic: p.topic,
            payload: p.payload,
            qos: p.qos,
            retain: p.retain,
            properties,
            expires_at,
            publisher,
            recipient: None,
        }
    }

    /// This message, for `client_id` alone (see [`Message::recipient`]).
    pub fn for_client(mut self, client_id: ByteString) -> Message {
        self.recipient = Some(client_id);
        self
    }

    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }

    /// Seconds left of the Message Expiry Interval, rounded up so a message is never
    /// forwarded with 0 (which would read as "no expiry" to nobody but is odd).
    pub fn remaining_expiry(&self, now: Instant) -> Option<u32> {
        self.expires_at.map(|t| {
            let left = t.saturating_duration_since(now);
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
        })
    }

    /// A copy whose fields own their bytes. A decoded message's topic, payload and
    /// properties are slices of the buffer its PUBLISH was read into, and keep all of
    /// that buffer alive (8 KiB or more for a 10-byte message read on its own): fine
    /// for a message on its way, not for one kept as long as a retained message.
    pub fn compacted(&self) -> Message {
        let text = |s: &ByteString| ByteString::from(&**s);
        let p = &self.properties;
        Message {
            topic: text(&self.topic),
            payload: Bytes::copy_from_slice(&self.payload),
            properties: PublishProperties {
                response_topic: p.response_topic.as_ref().map(text),
                correlation_data: p.correlation_data.as_deref().map(Bytes::copy_from_slice),
                user_properties: p
                    .user_properties
                    .iter()
                    .map(|(k, v)| (text(k), text(v)))
                    .collect(),
                content_type: p.content_type.as_ref().map(text),
                ..p.clone()
            },
            publisher: self.publisher.as_ref().map(text),
            recipient: self.recipient.as_ref().map(text),
            ..self.clone()
        }
    }

    /// Bytes this message accounts for in a session queue.
    pub fn weight(&self) -> usize {
        self.payload.len() + self.topic.len()
    }
}

/// The shared-subscription group a delivery came through, so that an unacknowledged
/// message can be handed to another member when its receiver goes away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedVia {
    pub filter: Arc<str>,
    pub group: Arc<str>,
}

/// One message bound for one session.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub msg: Arc<Message>,
    /// min(message QoS, subscription QoS).
    pub qos: QoS,
    /// The RETAIN flag as it goes on the wire to this subscriber.
    pub retain: bool,
    pub subscription_ids: Vec<u32>,
    pub shared: Option<SharedVia>,
    /// Its sequence number in a persistent session's stored queue (0: not stored);
    /// set by the session when it stores the delivery (see `session_store.rs`).
    pub seq: u64,
    /// Loaded from a store after a restart: it may have been sent before, so it goes
    /// out with DUP set.
    pub dup: bool,
    /// A stored QoS 2 copy waits behind this until the message is durable (see
    /// [`Gate`](crate::Gate)); `None`: it may go at once.
    pub gate: Option<Arc<crate::Gate>>,
}

impl Delivery {
    /// A copy of `msg` for one subscriber, with nothing stored or held back yet.
    pub fn new(msg: Arc<Message>, qos: QoS, retain: bool, subscription_ids: Vec<u32>) -> Self {
        Delivery {
            msg,
            qos,
            retain,
            subscription_ids,
            shared: None,
            seq: 0,
            dup: false,
            gate: None,
        }
    }

    /// A stored copy loaded after a restart: it may have been sent before, so it goes
    /// out with DUP set.
    pub fn restored(m: crate::StoredMessage) -> Self {
        Delivery {
            shared: m.shared,
            seq: m.seq,
            dup: true,
            ..Delivery::new(m.msg, m.qos, m.retain, m.subscription_ids)
        }
    }

    /// What the session store is told of this copy.
    pub fn queued(&self) -> crate::QueuedRef<'_> {
        crate::QueuedRef {
            msg: &self.msg,
            qos: self.qos,
            retain: self.retain,
            subscription_ids: &self.subscription_ids,
            shared: self.shared.as_ref(),
        }
    }

    /// The PUBLISH for this delivery (topic alias and packet id set by the caller).
    pub fn to_publish(&self, packet_id: Option<u16>, dup: bool, now: Instant) -> Publish {
        let mut properties = self.msg.properties.clone();
        properties
            .subscription_identifiers
            .clone_from(&self.subscription_ids);
        properties.message_expiry_interval = self.msg.remaining_expiry(now);
        Publish {
            dup,
            qos: self.qos,
            retain: self.retain,
            topic: self.msg.topic.clone(),
            packet_id,
            payload: self.msg.payload.clone(),
            properties,
        }
    }
}
