//! This node's own retained changes that its reader has not read back from the stream
//! yet, counted per topic (decision 0004, "Retained changes in stream order").
//!
//! A change takes effect here at once, before it reaches the stream. While the reader
//! has not read it back, it is either not appended yet (it will come after every entry
//! already in the stream) or appended after the entry the reader is at: so any other
//! change of that topic the reader reads meanwhile comes before it in the stream, and
//! must not replace it. Once the reader read the last of them back, the node holds the
//! stream's latest change of the topic, and the next one it reads is newer. The reader
//! reads entries in order, so nothing here needs the entries' numbers, and there is
//! no race with the writer learning where its appends went.
//!
//! Bounded: at most `limit` topics (the writer's queue, its backlog of changes that
//! failed to reach Redis and the stream a reader can be behind hold no more). A change
//! past it is not counted (counted in `retained_untracked`, logged): another node's
//! older change of its topic may replace it here.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[derive(Debug)]
pub(crate) struct OwnRetained {
    inner: Mutex<Inner>,
    limit: usize,
}

#[derive(Debug, Default)]
struct Inner {
    /// Changes made here not read back yet, per topic (never 0).
    topics: HashMap<String, u32>,
    /// When a change past the limit was last logged.
    logged: Option<Instant>,
}

impl OwnRetained {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            inner: Mutex::default(),
            limit: limit.max(1),
        }
    }

    /// A change of `topic` took effect here (under the broker's retained lock, so
    /// that the reader, which applies under it too, sees it from then on). False when
    /// it was not counted: `limit` topics are waiting already.
    pub(crate) fn made(&self, topic: &str) -> bool {
        let mut inner = self.inner.lock();
        if let Some(n) = inner.topics.get_mut(topic) {
            *n = n.saturating_add(1);
            return true;
        }
        if inner.topics.len() >= self.limit {
            let log = inner
                .logged
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
            if log {
                inner.logged = Some(Instant::now());
                tracing::warn!(
                    topic,
                    limit = self.limit,
                    "mqtt cluster: too many retained changes on their way through the stream; this one may be replaced here by an older one of another node"
                );
            }
            return false;
        }
        inner.topics.insert(topic.to_owned(), 1);
        true
    }

    /// One change of `topic` made here will never reach the stream (or was read back).
    pub(crate) fn dropped(&self, topic: &str) {
        let mut inner = self.inner.lock();
        if let Some(n) = inner.topics.get_mut(topic) {
            *n -= 1;
            if *n == 0 {
                inner.topics.remove(topic);
            }
        }
    }

    /// The reader read back one of this node's changes of `topic`: whether another
    /// is still to come (then the entry does not replace what this node holds).
    pub(crate) fn read_back(&self, topic: &str) -> bool {
        self.dropped(topic);
        self.holds(topic)
    }

    /// Whether a change of `topic` made here is still to come in the stream: no
    /// other change of it the reader reads now replaces it.
    pub(crate) fn holds(&self, topic: &str) -> bool {
        self.inner.lock().topics.contains_key(topic)
    }

    /// Forgets every change: the reader lost entries (trimmed before it read them),
    /// some of them maybe this node's, and reloads the retained hash.
    pub(crate) fn clear(&self) {
        self.inner.lock().topics.clear();
    }

    /// Topics with changes waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().topics.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_is_held_until_its_last_change_made_here_is_read_back() {
        let own = OwnRetained::new(10);
        assert!(!own.holds("t"));
        assert!(own.made("t") && own.made("t"));
        assert!(own.holds("t"), "another node's change read now is older");
        assert!(own.read_back("t"), "the second change is still to come");
        assert!(!own.read_back("t"), "the last one read back: applied");
        assert!(!own.holds("t"), "what the reader reads next is newer");
        assert_eq!(own.len(), 0, "forgotten once read back");
    }

    #[test]
    fn a_change_that_never_reaches_the_stream_holds_nothing() {
        let own = OwnRetained::new(10);
        own.made("t");
        own.made("u");
        own.dropped("t");
        assert!(!own.holds("t"));
        assert!(own.holds("u"));
        // More read back than made (an append Redis ran after its timeout, then
        // written again) counts no lower than nothing.
        assert!(!own.read_back("t"));
        assert!(!own.holds("t"));
        own.clear();
        assert!(!own.holds("u"), "a reader's gap forgets every change");
    }

    #[test]
    fn past_its_bound_a_new_topic_is_not_counted_but_a_waiting_one_is() {
        let own = OwnRetained::new(2);
        assert!(own.made("a") && own.made("b"));
        assert!(!own.made("c"), "a third topic is past the bound");
        assert!(!own.holds("c"));
        assert!(own.made("a"), "a topic already counted still counts");
        assert_eq!(own.len(), 2);
        own.read_back("b");
        assert!(own.made("c"), "room again once one is read back");
    }
}
