//! Counters of what the per-connection limits did, shared by every hub of the service,
//! each with a log line at most every [`LOG_EVERY`] that says how many happened since
//! the last one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Shortest interval between two log lines of one counter.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What the limits did since the service started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections closed because they did not read what was sent to them (their
    /// outbound queue was full).
    pub slow_consumers: u64,
    /// Messages evicted from replay buffers before the client acknowledged them.
    pub replay_evictions: u64,
    /// Of those, messages not yet written to the socket when evicted.
    pub replay_evictions_unwritten: u64,
    /// Reliable sessions ended because a recovery could no longer be served in full.
    pub replay_lost_sessions: u64,
}

/// The service's counters.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    slow_consumers: Counter,
    replay_evictions: AtomicU64,
    replay_evictions_unwritten: AtomicU64,
    replay_lost_sessions: Counter,
}

impl Stats {
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

    /// The counts so far.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            slow_consumers: self.slow_consumers.total(),
            replay_evictions: self.replay_evictions.load(Ordering::Relaxed),
            replay_evictions_unwritten: self.replay_evictions_unwritten.load(Ordering::Relaxed),
            replay_lost_sessions: self.replay_lost_sessions.total(),
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
        assert_eq!(
            s.counters(),
            Counters {
                slow_consumers: 2,
                replay_evictions: 4,
                replay_evictions_unwritten: 1,
                replay_lost_sessions: 1,
            }
        );
        assert_eq!(
            s.slow_consumers.since_log.load(Ordering::Relaxed),
            1,
            "the first was logged, the second waits for the next line"
        );
    }
}
