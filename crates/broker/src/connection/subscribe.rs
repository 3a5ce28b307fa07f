//! SUBSCRIBE and UNSUBSCRIBE: the session's subscriptions, the index, and the
//! retained messages a new subscription is owed.
//!
//! Bounded work per packet: at most `max_filters_per_subscribe` filters are handled
//! (the rest get 0x97 in the SUBACK, which keeps one reason code per filter as the
//! spec requires [MQTT-3.9.3-1], rather than refusing the whole packet), a session
//! holds at most `max_subscriptions_per_client`, and the task yields to the other
//! connections of its worker between slices of the retained-message work.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use statehub_mqtt_codec::{
    validate, ByteString, Packet, ReasonCode, SubAck, Subscribe, SubscriptionOptions, UnsubAck,
    Unsubscribe,
};

use super::{Close, Conn};
use crate::broker::split_shared;
use crate::message::{Delivery, Message};
use crate::ratelimit::LogLimit;
use crate::session::Subscription;
use crate::topic;

/// Index nodes visited (plus one per filter) between two yields of the task.
const YIELD_EVERY: usize = 10_000;
/// Retained messages offered to the session between two yields.
const OFFER_BATCH: usize = 1024;

/// Retained messages collected for one SUBSCRIBE, and the work done since the last
/// yield.
struct Retained {
    deliveries: Vec<Delivery>,
    /// More than the session queue can take is pointless to collect: it would be
    /// dropped (QoS 0) or cut the subscriber off as a slow consumer (QoS 1 and 2)
    /// either way. One past it is kept so that happens as it would.
    room: usize,
    work: usize,
}

impl Conn {
    pub(super) async fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let limits = self.broker.inner.limits;
        let mut retained = Retained {
            deliveries: Vec::new(),
            room: limits.max_messages + limits.max_messages / 2 + 1,
            work: 0,
        };
        let per_packet = self.broker.config().max_filters_per_subscribe;
        let mut codes = Vec::with_capacity(s.filters.len());
        for (i, (filter, options)) in s.filters.iter().enumerate() {
            let code = if i < per_packet {
                self.subscribe_one(filter, *options, s.subscription_identifier, &mut retained)?
            } else {
                self.quota_refused(filter, "filters per SUBSCRIBE")
            };
            codes.push(code);
            retained.work += 1;
            if retained.work >= YIELD_EVERY {
                retained.work = 0;
                tokio::task::yield_now().await;
            }
        }
        self.save_subscriptions().await?;
        self.send(&Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            ..Default::default()
        }))?;
        for (i, d) in retained.deliveries.into_iter().enumerate() {
            if i > 0 && i % OFFER_BATCH == 0 {
                tokio::task::yield_now().await;
            }
            self.broker.offer(&self.session, d);
        }
        Ok(())
    }

    /// One filter of a SUBSCRIBE: its reason code, retained messages collected into
    /// `retained`. An error closes the connection.
    fn subscribe_one(
        &mut self,
        filter: &ByteString,
        options: SubscriptionOptions,
        identifier: Option<u32>,
        retained: &mut Retained,
    ) -> Result<ReasonCode, Close> {
        // 3.1.1 clients get every failure as 0x80 (the codec maps it).
        if validate::topic_filter(filter).is_err() || validate::shared_filter(filter).is_err() {
            return Ok(ReasonCode::TOPIC_FILTER_INVALID);
        }
        let (group, plain) = split_shared(filter);
        if group.is_some() && options.no_local {
            return Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "No Local on a shared subscription [MQTT-3.8.3-4]",
            ));
        }
        let cfg = self.broker.config();
        if cfg.refused_filters.iter().any(|f| f == &**filter) {
            return Ok(ReasonCode::UNSPECIFIED_ERROR);
        }
        if topic::too_deep(plain, cfg.max_topic_levels) {
            return Ok(ReasonCode::TOPIC_FILTER_INVALID);
        }
        let sub = Subscription {
            options,
            identifier,
        };
        let existed = {
            let mut st = self.session.state.lock();
            let existed = st.subscriptions.contains_key(filter);
            if !existed && st.subscriptions.len() >= cfg.max_subscriptions_per_client {
                drop(st);
                return Ok(self.quota_refused(filter, "subscriptions per client"));
            }
            st.subscriptions.insert(filter.clone(), sub);
            existed
        };
        self.broker
            .index_subscription(&self.session, filter, options, identifier);
        let send_retained = group.is_none()
            && match options.retain_handling {
                0 => true,
                1 => !existed,
                _ => false,
            };
        if send_retained {
            self.collect_retained(plain, options, identifier, retained);
        }
        Ok(ReasonCode(options.qos as u8))
    }

    fn collect_retained(
        &self,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
        retained: &mut Retained,
    ) {
        if retained.deliveries.len() >= retained.room {
            return;
        }
        let mut found: Vec<Arc<Message>> = Vec::new();
        retained.work += self
            .broker
            .retained_into(filter, Instant::now(), &mut found);
        let room = retained.room - retained.deliveries.len();
        if found.len() > room {
            tracing::debug!(
                client = %self.info.client_id,
                "more retained messages match than the session queue holds"
            );
        }
        retained
            .deliveries
            .extend(found.into_iter().take(room).map(|msg| Delivery {
                qos: msg.qos.min(options.qos),
                retain: true,
                subscription_ids: identifier.into_iter().collect(),
                shared: None,
                seq: 0,
                dup: false,
                gate: None,
                msg,
            }));
    }

    /// Counts and logs (rate-limited) a filter refused for a subscription limit.
    fn quota_refused(&self, filter: &str, limit: &str) -> ReasonCode {
        static LOG: LogLimit = LogLimit::per_secs(10);
        self.broker
            .inner
            .metrics
            .subscriptions_refused
            .fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                client = %self.info.client_id,
                filter = topic::for_log(filter),
                left_out,
                "subscription refused with 0x97: the limit of {limit} is reached"
            );
        }
        ReasonCode::QUOTA_EXCEEDED
    }

    pub(super) async fn on_unsubscribe(&mut self, u: Unsubscribe) -> Result<(), Close> {
        let mut codes = Vec::with_capacity(u.filters.len());
        for filter in &u.filters {
            if validate::topic_filter(filter).is_err() || validate::shared_filter(filter).is_err() {
                codes.push(ReasonCode::TOPIC_FILTER_INVALID);
                continue;
            }
            let existed = self
                .session
                .state
                .lock()
                .subscriptions
                .remove(filter)
                .is_some();
            if existed {
                self.broker
                    .unindex_subscription(self.session.client_id(), filter);
            }
            codes.push(if existed {
                ReasonCode::SUCCESS
            } else {
                ReasonCode::NO_SUBSCRIPTION_EXISTED
            });
        }
        self.save_subscriptions().await?;
        self.send(&Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            ..Default::default()
        }))
    }

    /// Records a persistent session's subscriptions and waits until they are durable,
    /// so that a SUBACK or UNSUBACK holds across a restart.
    async fn save_subscriptions(&mut self) -> Result<(), Close> {
        let stored = {
            let st = self.session.state.lock();
            st.save(self.session.client_id(), false);
            st.is_persistent()
        };
        if stored {
            self.durable().await?;
        }
        Ok(())
    }
}
