//! Retained messages in Redis: a retained PUBLISH's change takes effect on its node at
//! once (the broker's [`RetainStore`] hook counts it as this node's own, still to come
//! in the stream: `own_retained.rs`), and its message's stream entry carries the change:
//! the script appending it writes the retained hash too, so the hash's last writer is
//! the stream's last change of each topic. Every node applies the changes it reads in
//! stream order, but not over a change of its own still to come (decision 0004,
//! "Retained changes in stream order"); a node that starts loads the hash.
//!
//! While Redis is out of reach a change still takes effect on its node at once (a QoS
//! 0 one is not refused; a QoS 1/2 one already delivered when its write failed was
//! answered 0x80). So that every node holds the same retained messages once Redis is
//! back, the writer keeps the changes it failed to write ([`Backlog`]: the latest per
//! topic, in the order made) and writes them first when Redis answers again, each in
//! one script call that sets the hash and appends an `r` entry, applied like any
//! other change.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Pipeline;
use statehub_broker::{BoxFuture, Message, RetainStore, RetainStoreError};

use crate::own_retained::OwnRetained;
use crate::{wire, Counters, Keys, Shared};

/// The retained-message store of a node in a cluster.
#[derive(Debug, Clone)]
pub struct RedisRetain {
    shared: Arc<Shared>,
}

impl RedisRetain {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl RetainStore for RedisRetain {
    /// Called under the broker's retained lock, right after the change took effect
    /// here. The change reaches Redis with its message's stream entry
    /// (`Fabric::forward`), which the PUBLISH's acknowledgement waits for: nothing
    /// more to wait for here.
    fn record(
        &self,
        msg: &Message,
        _now: Instant,
    ) -> BoxFuture<'static, Result<(), RetainStoreError>> {
        // A message for one recipient is not forwarded (`Broker::route_with`).
        if msg.recipient.is_none() && !self.shared.own_retained.made(&msg.topic) {
            let untracked = &self.shared.counters.retained_untracked;
            untracked.fetch_add(1, Ordering::Relaxed);
        }
        Box::pin(async { Ok(()) })
    }
}

/// Sets (or clears) a topic's retained message and appends its `r` entry, numbered like
/// every entry (`append.rs`), in one call: the hash and the stream order agree.
/// `KEYS` the stream, the counter, the hash; `ARGV` the stream's length, the node, the
/// topic, and the value unless cleared.
const SCRIPT: &str = r"
local q = redis.call('INCR', KEYS[2])
if ARGV[4] then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'q', q, 'n', ARGV[2], 't', 'r',
    'c', ARGV[3], 'm', ARGV[4])
else
  redis.call('HDEL', KEYS[3], ARGV[3])
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 'q', q, 'n', ARGV[2], 't', 'r',
    'c', ARGV[3])
end
return q
";

/// The retained changes of the writer's failed batches, the latest per topic, in the
/// order they were made; at most `limit` topics (past it a change stays on this node
/// only: counted, logged).
#[derive(Debug)]
pub(crate) struct Backlog {
    /// By when each was kept.
    changes: BTreeMap<u64, (String, Option<Vec<u8>>)>,
    at: HashMap<String, u64>,
    next: u64,
    limit: usize,
    logged: Option<Instant>,
}

impl Backlog {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            changes: BTreeMap::new(),
            at: HashMap::new(),
            next: 0,
            limit: limit.max(1),
            logged: None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Keeps a change whose write failed, after (and instead of) any kept for its topic.
    pub(crate) fn keep(
        &mut self,
        (topic, value): (&str, Option<&Vec<u8>>),
        own: &OwnRetained,
        counters: &Counters,
    ) {
        let replaced = self.at.remove(topic);
        if let Some(at) = replaced {
            self.changes.remove(&at);
            // The change it replaces will never be written.
            own.dropped(topic);
        } else if self.changes.len() >= self.limit {
            own.dropped(topic);
            counters.retained_unrestored.fetch_add(1, Ordering::Relaxed);
            let log = self
                .logged
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
            if log {
                self.logged = Some(Instant::now());
                tracing::warn!(
                    topic,
                    limit = self.limit,
                    "mqtt cluster: too many retained changes made while redis was out of reach; this one stays on this node only"
                );
            }
            return;
        }
        self.next += 1;
        self.at.insert(topic.to_owned(), self.next);
        self.changes
            .insert(self.next, (topic.to_owned(), value.cloned()));
    }

    /// Adds the calls writing every kept change, in order, to `pipe`.
    pub(crate) fn add_to(&self, pipe: &mut Pipeline, keys: &Keys, node: &str, stream_len: u64) {
        for (topic, value) in self.changes.values() {
            pipe.cmd("EVAL")
                .arg(SCRIPT)
                .arg(3)
                .arg(&keys.feed)
                .arg(&keys.seq)
                .arg(&keys.retained)
                .arg(stream_len)
                .arg(node)
                .arg(topic);
            if let Some(value) = value {
                pipe.arg(value);
            }
            pipe.ignore();
        }
    }

    /// Every kept change was written (the reader reads each back).
    pub(crate) fn written(&mut self, counters: &Counters) {
        let restored = self.changes.len() as u64;
        self.changes.clear();
        self.at.clear();
        if restored > 0 {
            counters
                .retained_restored
                .fetch_add(restored, Ordering::Relaxed);
            tracing::info!(
                restored,
                "mqtt cluster: retained changes made while redis was out of reach written"
            );
        }
    }
}

/// The retained message an `r` entry sets, or one clearing `topic` (no value).
pub(crate) fn from_entry(
    topic: &str,
    value: Option<&[u8]>,
    now: wire::Now,
) -> Result<Arc<Message>, wire::WireError> {
    let decoded = value.map(|v| wire::decode(v, now)).transpose()?.flatten();
    let msg = decoded.unwrap_or_else(|| {
        // Cleared, or expired meanwhile: either way no retained message.
        let clear = statehub_broker::codec::Publish {
            dup: false,
            qos: statehub_broker::codec::QoS::AtMostOnce,
            retain: true,
            topic: topic.into(),
            packet_id: None,
            payload: bytes::Bytes::new(),
            properties: statehub_broker::codec::PublishProperties::default(),
        };
        Message::from_publish(clear, None, now.instant)
    });
    Ok(Arc::new(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Keys {
        Keys::new("t")
    }

    /// The topics `backlog` writes, in order.
    fn written_order(backlog: &Backlog) -> Vec<String> {
        let mut pipe = redis::pipe();
        backlog.add_to(&mut pipe, &keys(), "n", 100);
        let packed = String::from_utf8_lossy(&pipe.get_packed_pipeline()).into_owned();
        let mut at: Vec<(usize, String)> = ["t1", "t2", "t3"]
            .iter()
            .filter_map(|t| {
                packed
                    .find(&format!("\r\nrt/{t}\r\n"))
                    .map(|i| (i, format!("rt/{t}")))
            })
            .collect();
        at.sort();
        at.into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn a_backlog_keeps_the_latest_change_per_topic_in_the_order_made() {
        let (own, counters) = (OwnRetained::new(10), Counters::default());
        let mut backlog = Backlog::new(10);
        for (topic, value) in [("rt/t1", "a"), ("rt/t2", "b"), ("rt/t1", "c")] {
            own.made(topic);
            backlog.keep((topic, Some(&value.as_bytes().to_vec())), &own, &counters);
        }
        assert_eq!(written_order(&backlog), ["rt/t2", "rt/t1"]);
        assert!(own.holds("rt/t1") && own.holds("rt/t2"));
        assert!(
            !own.read_back("rt/t1"),
            "the replaced change counted off: one entry to read back"
        );
        backlog.written(&counters);
        assert!(backlog.is_empty());
        assert!(own.holds("rt/t2"), "until the reader reads it back");
        assert_eq!(counters.retained_restored.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_full_backlog_keeps_changes_of_its_topics_and_counts_a_new_topics() {
        let (own, counters) = (OwnRetained::new(10), Counters::default());
        let mut backlog = Backlog::new(1);
        for topic in ["rt/t1", "rt/t2", "rt/t1"] {
            own.made(topic);
            backlog.keep((topic, None), &own, &counters);
        }
        assert_eq!(written_order(&backlog), ["rt/t1"]);
        assert!(!own.holds("rt/t2"), "not kept: no entry of it will come");
        assert_eq!(counters.retained_unrestored.load(Ordering::Relaxed), 1);
    }
}
