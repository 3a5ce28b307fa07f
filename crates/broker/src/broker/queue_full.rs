//! What full session queues do to the publish path: the refuse policy's all-or-nothing
//! reservation, and the counting and logging of every message a bound dropped or
//! refused (see [`QueueFull`](crate::config::QueueFull)).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;
use statehub_mqtt_codec::QoS;

use super::Broker;
use crate::message::Delivery;
use crate::ratelimit::LogLimit;
use crate::session::{Bound, Enqueued, Session, Ticket};
use crate::trie::SubEntry;

impl Broker {
    /// Takes room for every QoS 1/2 delivery in `targets` (a ticket each, `None` for
    /// QoS 0, in `tickets`); if one session cannot give it, gives back what was taken,
    /// counts and logs the refusal, and returns false.
    pub(super) fn reserve_all(
        &self,
        targets: &[(&SubEntry, Delivery)],
        tickets: &mut SmallVec<[Option<Ticket>; 4]>,
    ) -> bool {
        for (entry, d) in targets {
            if d.qos == QoS::AtMostOnce {
                tickets.push(None);
                continue;
            }
            match entry.session.reserve(d, &self.inner.limits) {
                Ok(ticket) => tickets.push(Some(ticket)),
                Err(bound) => {
                    for ((taken, _), ticket) in targets.iter().zip(tickets.drain(..)) {
                        if let Some(ticket) = ticket {
                            taken.session.cancel(ticket);
                        }
                    }
                    self.refused(&entry.session, d.msg.publisher.as_deref(), bound);
                    return false;
                }
            }
        }
        true
    }

    /// Queues a delivery in the room its ticket took and counts it; true if it was
    /// recorded in the session store.
    pub(super) fn offer_reserved(
        &self,
        session: &Arc<Session>,
        d: Delivery,
        ticket: Ticket,
    ) -> bool {
        let outcome = session.enqueue_reserved(d, ticket, &self.inner.limits, self.now());
        self.count(session, outcome);
        outcome.stored()
    }

    /// Counts (and logs, rate-limited) a PUBLISH refused because `full`'s queue is.
    fn refused(&self, full: &Session, publisher: Option<&str>, bound: Bound) {
        static LOG: LogLimit = LogLimit::per_secs(10);
        self.inner
            .metrics
            .refused_quota
            .fetch_add(1, Ordering::Relaxed);
        self.count_total_full(bound);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                client = full.client_id(),
                publisher = publisher.unwrap_or(""),
                ?bound,
                left_out,
                "offline session's queue full; PUBLISH refused (MQTT 5: 0x97 Quota exceeded; 3.1.1: connection closed)"
            );
        }
    }

    /// Counts (and logs) what the queue bounds did to a delivery.
    pub(super) fn count(&self, session: &Session, outcome: Enqueued) {
        static NEWEST: LogLimit = LogLimit::per_secs(10);
        static OLDEST: LogLimit = LogLimit::per_secs(10);
        let m = &self.inner.metrics;
        let bound = match outcome {
            Enqueued::Queued { .. } => {
                m.messages_out.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Enqueued::SkippedOffline | Enqueued::Ended => return,
            Enqueued::EvictedOldest { evicted, bound, .. } => {
                m.messages_out.fetch_add(1, Ordering::Relaxed);
                let n = evicted as u64;
                m.dropped.fetch_add(n, Ordering::Relaxed);
                m.dropped_queue_full_oldest.fetch_add(n, Ordering::Relaxed);
                if let Some(left_out) = OLDEST.allow() {
                    tracing::warn!(
                        client = session.client_id(),
                        ?bound,
                        evicted,
                        left_out,
                        "offline session's queue full; oldest queued messages dropped (queue_full_policy = drop-oldest)"
                    );
                }
                bound
            }
            Enqueued::DroppedQoS0(bound) => {
                tracing::debug!(
                    client = session.client_id(),
                    ?bound,
                    "queue full; QoS 0 message dropped"
                );
                m.dropped.fetch_add(1, Ordering::Relaxed);
                m.dropped_qos0_queue_full.fetch_add(1, Ordering::Relaxed);
                bound
            }
            Enqueued::DroppedNewest(bound) => {
                m.dropped.fetch_add(1, Ordering::Relaxed);
                m.dropped_queue_full_newest.fetch_add(1, Ordering::Relaxed);
                if let Some(left_out) = NEWEST.allow() {
                    tracing::warn!(
                        client = session.client_id(),
                        ?bound,
                        left_out,
                        "offline session's queue full; new QoS 1/2 message dropped for it"
                    );
                }
                bound
            }
            Enqueued::SlowConsumer { bound, .. } => {
                tracing::info!(
                    client = session.client_id(),
                    ?bound,
                    "slow consumer; disconnecting with 0x97"
                );
                m.slow_consumers.fetch_add(1, Ordering::Relaxed);
                bound
            }
        };
        self.count_total_full(bound);
    }

    /// Counts (and logs, rate-limited) a delivery that met the broker-wide bound.
    fn count_total_full(&self, bound: Bound) {
        static LOG: LogLimit = LogLimit::per_secs(10);
        if bound != Bound::Broker {
            return;
        }
        self.inner
            .metrics
            .total_queue_full
            .fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            let (messages, bytes) = self.queued_total();
            tracing::warn!(
                messages,
                bytes,
                left_out,
                "sessions together hold max_total_queued_messages/bytes: full offline sessions follow queue_full_policy and slow connected ones are disconnected with 0x97"
            );
        }
    }
}
