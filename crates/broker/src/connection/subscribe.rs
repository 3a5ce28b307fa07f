//! SUBSCRIBE and UNSUBSCRIBE: the session's subscriptions, the subscription index,
//! and the retained messages a new subscription receives.

use statehub_mqtt_codec::{
    validate, ByteString, Packet, ProtocolVersion, ReasonCode, SubAck, Subscribe,
    SubscriptionOptions, UnsubAck, Unsubscribe,
};

use super::{Close, Conn};
use crate::broker::split_shared;
use crate::message::Delivery;
use crate::session::Subscription;

impl Conn {
    pub(super) async fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut accepted = Vec::with_capacity(s.filters.len());
        for (filter, options) in &s.filters {
            match self.refuse_filter(filter, options)? {
                Some(code) => codes.push(code),
                None => {
                    codes.push(ReasonCode(options.qos as u8));
                    let sub = Subscription {
                        options: *options,
                        identifier: s.subscription_identifier,
                    };
                    accepted.push((filter.clone(), sub));
                }
            }
        }
        let (existed, stored) = self.session.subscribe(&accepted);
        let now = self.broker.now();
        let mut retained = Vec::new();
        for ((filter, sub), existed) in accepted.iter().zip(existed) {
            self.broker
                .index_subscription(&self.session, filter, sub.options, sub.identifier);
            let (group, plain) = split_shared(filter);
            let send_retained = group.is_none()
                && match sub.options.retain_handling {
                    0 => true,
                    1 => !existed,
                    _ => false,
                };
            if send_retained {
                for msg in self.broker.retained_matching(plain, now) {
                    let qos = msg.qos.min(sub.options.qos);
                    let ids = sub.identifier.into_iter().collect();
                    retained.push(Delivery::new(msg, qos, true, ids));
                }
            }
        }
        // A SUBACK holds across a restart.
        if stored {
            self.durable().await?;
        }
        self.send(&Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            ..Default::default()
        }))?;
        for d in retained {
            self.broker.offer(&self.session, d);
        }
        Ok(())
    }

    /// The SUBACK code refusing `filter`, if it is refused; a protocol error closes
    /// the connection.
    fn refuse_filter(
        &self,
        filter: &ByteString,
        options: &SubscriptionOptions,
    ) -> Result<Option<ReasonCode>, Close> {
        if validate::topic_filter(filter).is_err() || validate::shared_filter(filter).is_err() {
            return Ok(Some(if self.version == ProtocolVersion::V5 {
                ReasonCode::TOPIC_FILTER_INVALID
            } else {
                ReasonCode::UNSPECIFIED_ERROR
            }));
        }
        if split_shared(filter).0.is_some() && options.no_local {
            return Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "No Local on a shared subscription [MQTT-3.8.3-4]",
            ));
        }
        let refused = self
            .broker
            .config()
            .refused_filters
            .iter()
            .any(|f| f == &**filter);
        Ok(refused.then_some(ReasonCode::UNSPECIFIED_ERROR))
    }

    pub(super) async fn on_unsubscribe(&mut self, u: Unsubscribe) -> Result<(), Close> {
        let mut codes = Vec::with_capacity(u.filters.len());
        let mut valid = Vec::with_capacity(u.filters.len());
        for filter in &u.filters {
            if validate::topic_filter(filter).is_err() || validate::shared_filter(filter).is_err() {
                codes.push(ReasonCode::TOPIC_FILTER_INVALID);
            } else {
                // Its code once the session says whether it was subscribed.
                codes.push(ReasonCode::SUCCESS);
                valid.push((codes.len() - 1, filter.clone()));
            }
        }
        let filters: Vec<ByteString> = valid.iter().map(|(_, f)| f.clone()).collect();
        let (existed, stored) = self.session.unsubscribe(&filters);
        for ((i, filter), existed) in valid.iter().zip(existed) {
            if existed {
                self.broker
                    .unindex_subscription(self.session.client_id(), filter);
            } else {
                codes[*i] = ReasonCode::NO_SUBSCRIPTION_EXISTED;
            }
        }
        // An UNSUBACK holds across a restart.
        if stored {
            self.durable().await?;
        }
        self.send(&Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            ..Default::default()
        }))
    }
}
