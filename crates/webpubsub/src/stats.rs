//! The service's counters, shared by every hub: traffic (messages in and out, acks,
//! recoveries), and what the per-connection limits did, each of those with a log line at
//! most every [`LOG_EVERY`] that says how many happened since the last one. Relaxed
//! atomic adds: statistics, read at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shortest interval between two log lines of one counter.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the service and its limits did since it started, and (read at the same time)
/// what it holds now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Open client sockets now.
    pub connections: u64,
    /// Sessions now (reliable ones waiting for their client included).
    pub sessions: u64,
    /// Groups with at least one member now, over every hub.
    pub groups: u64,
    /// Hubs in use.
    pub hubs: u64,
    /// Frames received from clients (every request, data or not).
    pub messages_in: u64,
    /// Data messages queued to clients (one per recipient).
    pub messages_out: u64,
    /// Acks answered with success.
    pub acks_ok: u64,
    /// Acks answered with an error (`Duplicate`, `Forbidden`, `BadRequest`...).
    pub acks_error: u64,
    /// `sequenceAck`s received.
    pub sequence_acks: u64,
    /// Reliable sessions recovered by a new socket.
    pub recoveries_ok: u64,
    /// Recoveries refused: the session was gone or the token did not match.
    pub recoveries_failed: u64,
    /// Upstream event calls answered 2xx.
    pub upstream_ok: u64,
    /// Upstream event calls answered with another status.
    pub upstream_rejected: u64,
    /// Upstream event calls that failed (connection, timeout, oversized answer).
    pub upstream_failed: u64,
    /// Fire-and-forget upstream events dropped because their queue was full.
    pub upstream_dropped: u64,
    /// Upstream call latency.
    pub upstream_latency: statehub_stats::HistogramSnapshot,
    /// Connections closed because they did not read what was sent to them (their
    /// outbound queue was full).
    pub slow_consumers: u64,
    /// Messages evicted from replay buffers before the client acknowledged them.
    pub replay_evictions: u64,
    /// Of those, messages not yet written to the socket when evicted.
    pub replay_evictions_unwritten: u64,
    /// Reliable sessions ended because a recovery could no longer be served in full.
    pub replay_lost_sessions: u64,
    /// Connections refused at the handshake because their hub held
    /// `max_connections_per_hub` sessions.
    pub hub_full_refusals: u64,
    /// Group joins refused (a client's `joinGroup`, a REST add, a token's or `connect`
    /// answer's groups) because the connection was in `max_groups_per_connection` groups.
    pub group_limit_refusals: u64,
    /// Own sends refused because their hub kept `MAX_KEPT` sends waiting behind a
    /// client stream fragment's answer from the cluster (`hub/lane.rs`).
    pub kept_refusals: u64,
}

/// The service's counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    messages_in: AtomicU64,
    messages_out: AtomicU64,
    acks_ok: AtomicU64,
    acks_error: AtomicU64,
    sequence_acks: AtomicU64,
    recoveries_ok: AtomicU64,
    recoveries_failed: AtomicU64,
    slow_consumers: Counter,
    replay_evictions: AtomicU64,
    replay_evictions_unwritten: AtomicU64,
    replay_lost_sessions: Counter,
    hub_full_refusals: Counter,
    group_limit_refusals: Counter,
    kept_refusals: Counter,
}

impl Stats {
    /// A frame came in from a client.
    pub(crate) fn message_in(&self) {
        self.messages_in.fetch_add(1, Ordering::Relaxed);
    }

    /// A data message was queued to `n` clients.
    pub(crate) fn messages_out(&self, n: usize) {
        self.messages_out.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// An ack was answered.
    pub(crate) fn ack(&self, ok: bool) {
        let counter = if ok { &self.acks_ok } else { &self.acks_error };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A `sequenceAck` came in.
    pub(crate) fn sequence_ack(&self) {
        self.sequence_acks.fetch_add(1, Ordering::Relaxed);
    }

    /// A recovery was served or refused.
    pub(crate) fn recovery(&self, ok: bool) {
        let counter = match ok {
            true => &self.recoveries_ok,
            false => &self.recoveries_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was closed as a slow consumer.
    pub(crate) fn slow_consumer(&self, hub: &str, connection_id: &str, code: u16) {
        self.slow_consumers.note(|n| {
            tracing::warn!(
                "web pubsub: closed {n} slow consumer(s) since the last report (latest: \
                 connection {connection_id} of hub {hub}, close code {code}): they did not \
                 read what was sent to them and their outbound queue filled up"
            );
        });
    }

    /// Frames were evicted from a replay buffer unacknowledged.
    pub(crate) fn replay_evicted(&self, written: usize, unwritten: usize) {
        let total = (written + unwritten) as u64;
        if total > 0 {
            self.replay_evictions.fetch_add(total, Ordering::Relaxed);
            self.replay_evictions_unwritten
                .fetch_add(unwritten as u64, Ordering::Relaxed);
        }
    }

    /// A reliable session ended because its replay buffer no longer held every
    /// unacknowledged message.
    pub(crate) fn replay_lost(&self, hub: &str, connection_id: &str, why: &str) {
        self.replay_lost_sessions.note(|n| {
            tracing::info!(
                "web pubsub: ended {n} reliable session(s) that could not be recovered in \
                 full since the last report (latest: connection {connection_id} of hub \
                 {hub}: {why})"
            );
        });
    }

    /// A connection was refused because its hub is full.
    pub(crate) fn hub_full(&self, hub: &str, max: usize) {
        self.hub_full_refusals.note(|n| {
            tracing::warn!(
                "web pubsub: refused {n} connection(s) with 429 since the last report \
                 (latest: hub {hub}, which holds max_connections_per_hub = {max} sessions)"
            );
        });
    }

    /// A join was refused because the connection is in too many groups.
    pub(crate) fn group_limit(&self, hub: &str, connection_id: &str, max: usize) {
        self.group_limit_refusals.note(|n| {
            tracing::warn!(
                "web pubsub: refused {n} group join(s) since the last report (latest: \
                 connection {connection_id} of hub {hub}, already in \
                 max_groups_per_connection = {max} groups)"
            );
        });
    }

    /// An own send was refused because its hub keeps `max` sends waiting.
    pub(crate) fn kept_full(&self, hub: &str, max: usize) {
        self.kept_refusals.note(|n| {
            tracing::warn!(
                "web pubsub: refused {n} send(s) since the last report (latest: hub {hub} \
                 keeps {max} sends waiting for a client stream fragment's answer from the \
                 cluster)"
            );
        });
    }

    /// The counts so far.
    pub(crate) fn counters(&self) -> Counters {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Counters {
            messages_in: load(&self.messages_in),
            messages_out: load(&self.messages_out),
            acks_ok: load(&self.acks_ok),
            acks_error: load(&self.acks_error),
            sequence_acks: load(&self.sequence_acks),
            recoveries_ok: load(&self.recoveries_ok),
            recoveries_failed: load(&self.recoveries_failed),
            slow_consumers: self.slow_consumers.total(),
            replay_evictions: load(&self.replay_evictions),
            replay_evictions_unwritten: load(&self.replay_evictions_unwritten),
            replay_lost_sessions: self.replay_lost_sessions.total(),
            hub_full_refusals: self.hub_full_refusals.total(),
            group_limit_refusals: self.group_limit_refusals.total(),
            kept_refusals: self.kept_refusals.total(),
            ..Counters::default()
        }
    }
}

/// A count with a rate-limited log line.
#[derive(Debug, Default)]
struct Counter {
    total: AtomicU64,
    since_log: AtomicU64,
    last_log: Mutex<Option<Instant>>,
}

impl Counter {
    fn note(&self, log: impl FnOnce(u64)) {
        self.total.fetch_add(1, Ordering::Relaxed);
        self.since_log.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last_log.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            log(self.since_log.swap(0, Ordering::Relaxed));
        }
    }

    fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_event_and_logs_the_first() {
        let s = Stats::default();
        s.slow_consumer("h", "c1", 1013);
        s.slow_consumer("h", "c2", 1008);
        s.replay_evicted(3, 1);
        s.replay_evicted(0, 0);
        s.replay_lost("h", "c3", "why");
        s.hub_full("h", 1);
        s.group_limit("h", "c4", 1);
        s.group_limit("h", "c4", 1);
        assert_eq!(
            s.counters(),
            Counters {
                slow_consumers: 2,
                replay_evictions: 4,
                replay_evictions_unwritten: 1,
                replay_lost_sessions: 1,
                hub_full_refusals: 1,
                group_limit_refusals: 2,
                ..Counters::default()
            }
        );
        assert_eq!(
            s.slow_consumers.since_log.load(Ordering::Relaxed),
            1,
            "the first was logged, the second waits for the next line"
        );
    }
}
