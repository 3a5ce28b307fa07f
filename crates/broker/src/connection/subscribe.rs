//! SUBSCRIBE and UNSUBSCRIBE: the session's subscriptions, the subscription index,
//! and the retained messages a new subscription receives.
//!
//! Bounded work per packet: at most `max_filters_per_subscribe` filters are handled
//! (the rest get 0x97 in the SUBACK, which keeps one reason code per filter as the
//! spec requires [MQTT-3.9.3-1], rather than refusing the whole packet), a session
//! holds at most `max_subscriptions_per_client`, and the task yields to the other
//! connections of its worker between slices of the retained-message work.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use statehub_mqtt_codec::{
    validate, ByteString, Packet, ReasonCode, SubAck, Subscribe, SubscriptionOptions, UnsubAck,
    Unsubscribe,
};

use super::acks::{Ack, Answers, Reply, Wait};
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

impl Retained {
    /// Counts `work` and yields to the worker's other tasks once enough is done.
    async fn done(&mut self, work: usize) {
        self.work += work;
        if self.work >= YIELD_EVERY {
            self.work = 0;
            tokio::task::yield_now().await;
        }
    }
}

impl Conn {
    pub(super) async fn on_subscribe(&mut self, s: Subscribe) -> Result<(), Close> {
        let per_packet = self.broker.config().max_filters_per_subscribe;
        let mut codes = Vec::with_capacity(s.filters.len());
        let mut accepted = Vec::new();
        for (i, (filter, options)) in s.filters.iter().enumerate() {
            let refused = if i < per_packet {
                self.refuse_filter(filter, options)?
            } else {
                Some(self.quota_refused(filter, "filters per SUBSCRIBE"))
            };
            codes.push(refused.unwrap_or(ReasonCode(options.qos as u8)));
            if refused.is_none() {
                let sub = Subscription {
                    options: *options,
                    identifier: s.subscription_identifier,
                };
                accepted.push((i, filter.clone(), sub));
            }
        }
        let subs: Vec<_> = accepted.iter().map(|(_, f, s)| (f.clone(), *s)).collect();
        let max = self.broker.config().max_subscriptions_per_client;
        let (existed, stored) = self.session.subscribe(&subs, max);
        let limits = self.broker.queue_limits();
        let mut retained = Retained {
            deliveries: Vec::new(),
            room: limits.max_messages + limits.max_messages / 2 + 1,
            work: 0,
        };
        for ((i, filter, sub), existed) in accepted.iter().zip(existed) {
            let Some(existed) = existed else {
                codes[*i] = self.quota_refused(filter, "subscriptions per client");
                continue;
            };
            self.broker
                .index_subscription(&self.session, filter, sub.options, sub.identifier);
            let (group, plain) = split_shared(filter);
            let send_retained = group.is_none()
                && match sub.options.retain_handling {
                    0 => true,
                    1 => !existed,
                    _ => false,
                };
            let work = if send_retained {
                self.collect_retained(plain, sub, &mut retained)
            } else {
                0
            };
            retained.done(work + 1).await;
        }
        let suback = Packet::SubAck(SubAck {
            packet_id: s.packet_id,
            reason_codes: codes,
            ..Default::default()
        });
        if stored {
            // A SUBACK holds across a restart: it waits for the session store, queued
            // with the connection's acknowledgements while the connection reads on;
            // the retained messages follow it.
            return self.queue_reply(s.packet_id, suback, retained.deliveries);
        }
        self.send(&suback)?;
        for (i, d) in retained.deliveries.into_iter().enumerate() {
            if i > 0 && i % OFFER_BATCH == 0 {
                tokio::task::yield_now().await;
            }
            self.broker.offer(&self.session, d);
        }
        Ok(())
    }

    /// The SUBACK code refusing `filter`, if it is refused; a protocol error closes
    /// the connection. 3.1.1 clients get every failure as 0x80 (the codec maps it).
    fn refuse_filter(
        &mut self,
        filter: &ByteString,
        options: &SubscriptionOptions,
    ) -> Result<Option<ReasonCode>, Close> {
        if validate::topic_filter(filter).is_err() || validate::shared_filter(filter).is_err() {
            return Ok(Some(ReasonCode::TOPIC_FILTER_INVALID));
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
            return Ok(Some(ReasonCode::UNSPECIFIED_ERROR));
        }
        if topic::too_deep(plain, cfg.max_topic_levels) {
            return Ok(Some(ReasonCode::TOPIC_FILTER_INVALID));
        }
        if topic::is_reserved_filter(plain) || self.subscribe_denied(filter).is_some() {
            return Ok(Some(ReasonCode::NOT_AUTHORIZED));
        }
        Ok(None)
    }

    /// Adds the retained messages `filter` matches to `retained`; returns the work
    /// done (index nodes visited).
    fn collect_retained(&self, filter: &str, sub: &Subscription, retained: &mut Retained) -> usize {
        let room = retained.room.saturating_sub(retained.deliveries.len());
        if room == 0 {
            return 0;
        }
        let mut found: Vec<Arc<Message>> = Vec::new();
        let work = self
            .broker
            .retained_into(filter, self.broker.now(), &mut found);
        if found.len() > room {
            tracing::debug!(
                client = %self.info.client_id,
                "more retained messages match than the session queue holds"
            );
        }
        let deliveries = found.into_iter().take(room).map(|msg| {
            let qos = msg.qos.min(sub.options.qos);
            Delivery::new(msg, qos, true, sub.identifier.into_iter().collect())
        });
        retained.deliveries.extend(deliveries);
        work
    }

    /// Counts and logs (rate-limited) a filter refused for a subscription limit.
    fn quota_refused(&self, filter: &str, limit: &str) -> ReasonCode {
        static LOG: LogLimit = LogLimit::per_secs(10);
        self.broker
            .metrics()
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
        let unsuback = Packet::UnsubAck(UnsubAck {
            packet_id: u.packet_id,
            reason_codes: codes,
            ..Default::default()
        });
        // An UNSUBACK holds across a restart (queued as a SUBACK is).
        if stored {
            return self.queue_reply(u.packet_id, unsuback, Vec::new());
        }
        self.send(&unsuback)
    }

    /// Queues a SUBACK or UNSUBACK until the session store has the change (it closes
    /// the connection if it never will), behind the acknowledgements before it; then
    /// `retained` is offered to the session.
    fn queue_reply(
        &mut self,
        pid: u16,
        packet: Packet,
        retained: Vec<Delivery>,
    ) -> Result<(), Close> {
        let ack = Ack {
            answers: Answers::Subscription,
            pid,
            code: ReasonCode::SUCCESS,
            gate: None,
            reply: Some(Box::new(Reply { packet, retained })),
        };
        let wait = Wait {
            stored: self.broker.session_store(),
            ..Wait::default()
        };
        self.queue_ack(ack, wait)
    }
}
