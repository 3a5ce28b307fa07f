//! Reliable sessions deleted within the retention window, remembered (a bounded
//! number, for the retention window) so that a recovery naming one is told why it
//! cannot be served: the replay buffer lost messages, the client was closed through
//! the REST API, it did not come back in time. The client is closed with 1008 either
//! way; the reason is its `disconnected` message.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::constant_time_eq;

/// Deleted sessions remembered per hub, at most.
const MAX_ENDED: usize = 1024;
/// Longest reason kept (the rest is cut on a character boundary).
const MAX_REASON: usize = 256;

#[derive(Debug)]
struct Entry {
    at: Instant,
    id: String,
    token: String,
    reason: String,
}

/// The hub's recently deleted reliable sessions, oldest first.
#[derive(Debug, Default)]
pub(super) struct Ended {
    entries: VecDeque<Entry>,
}

impl Ended {
    /// Remembers that session `id` (reconnection token `token`) ended for `reason`,
    /// forgetting entries older than `retention` and the oldest past [`MAX_ENDED`].
    pub(super) fn record(&mut self, id: &str, token: &str, reason: &str, retention: Duration) {
        let now = Instant::now();
        self.forget_older_than(now, retention);
        if self.entries.len() >= MAX_ENDED {
            self.entries.pop_front();
        }
        let mut end = reason.len().min(MAX_REASON);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        self.entries.push_back(Entry {
            at: now,
            id: id.to_owned(),
            token: token.to_owned(),
            reason: reason[..end].to_owned(),
        });
    }

    /// Why session `id` ended, if it did within `retention` and `token` is its
    /// reconnection token.
    pub(super) fn reason(&self, id: &str, token: &str, retention: Duration) -> Option<&str> {
        let now = Instant::now();
        self.entries
            .iter()
            .rev()
            .take_while(|e| now.saturating_duration_since(e.at) < retention)
            .find(|e| e.id == id && constant_time_eq(&e.token, token))
            .map(|e| e.reason.as_str())
    }

    fn forget_older_than(&mut self, now: Instant, retention: Duration) {
        while self
            .entries
            .front()
            .is_some_and(|e| now.saturating_duration_since(e.at) >= retention)
        {
            self.entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn remembers_for_the_retention_window_with_the_right_token() {
        let retention = Duration::from_secs(60);
        let mut e = Ended::default();
        e.record("a", "tok", &"é".repeat(200), retention);
        assert_eq!(e.reason("a", "tok", retention).map(str::len), Some(256));
        assert_eq!(e.reason("a", "forged", retention), None);
        assert_eq!(e.reason("b", "tok", retention), None);
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(e.reason("a", "tok", retention), None);
        e.record("b", "tok", "why", retention);
        assert_eq!(e.entries.len(), 1, "old entries are dropped on insert");
        for i in 0..MAX_ENDED + 5 {
            e.record(&i.to_string(), "t", "r", retention);
        }
        assert_eq!(e.entries.len(), MAX_ENDED);
    }
}
