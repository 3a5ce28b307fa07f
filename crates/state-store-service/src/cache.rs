//! Responses remembered per (client id, Correlation Data), so that a QoS 1 redelivery of
//! a request (the SDKs re-publish unacknowledged requests after a reconnect) is answered
//! with the same response instead of being executed twice: a repeated `SET k v NX`
//! must not turn `+OK` into `:-1`, nor a repeated DEL `:1` into `:0`.
//!
//! An entry lives until its request's deadline plus a grace period (as the SDK executor
//! does); a duplicate arriving after the deadline is dropped, since its caller has given
//! up. The cache is bounded: when full, the oldest entry goes first.
//!
//! Every request inserts one entry and, once the cache is full, evicts one, so both are
//! O(1): entries are queued in arrival order, and the queue's front is pruned once its
//! end has passed. An entry whose end passed while an older, longer-lived one stays in
//! front of it is forgotten all the same (lookups check the end), and leaves the map when
//! its turn comes; the bound holds either way.

use std::collections::{hash_map, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use statehub_broker::codec::ByteString;
use statehub_broker::Message;

/// How long past its deadline an entry still suppresses re-execution.
const GRACE: Duration = Duration::from_secs(60);

/// Who asked, and which call. Both parts are reference-counted views of the request
/// (its client id and Correlation Data), so making a key copies nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub client_id: ByteString,
    pub correlation: Bytes,
}

/// What the cache knows about a request.
#[derive(Debug)]
pub enum Lookup {
    /// Never seen (or forgotten): execute it.
    Miss,
    /// Seen and still awaited: send this response again.
    Hit(Arc<Message>),
    /// Seen, but its deadline has passed: nobody is waiting any more.
    Late,
}

#[derive(Debug)]
struct Entry {
    response: Arc<Message>,
    deadline: Instant,
    /// When the entry is forgotten.
    end: Instant,
    /// Which insertion made it, so that a queued key whose entry was replaced since
    /// (re-executed after it was forgotten) does not take the new entry with it.
    inserted: u64,
}

/// The bounded cache.
#[derive(Debug)]
pub struct ResponseCache {
    capacity: usize,
    entries: HashMap<CacheKey, Entry>,
    /// (end, insertion, key), in insertion order.
    queue: VecDeque<(Instant, u64, CacheKey)>,
    inserted: u64,
}

impl ResponseCache {
    pub fn new(capacity: usize) -> Self {
        Self { capacity, entries: HashMap::new(), queue: VecDeque::new(), inserted: 0 }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forgets every response (the store failed: they may answer writes now lost).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.queue.clear();
    }

    pub fn lookup(&mut self, key: &CacheKey, now: Instant) -> Lookup {
        self.prune(now);
        match self.entries.get(key) {
            Some(e) if e.end <= now => Lookup::Miss,
            None => Lookup::Miss,
            Some(e) if e.deadline <= now => Lookup::Late,
            Some(e) => Lookup::Hit(e.response.clone()),
        }
    }

    /// Remembers `response` (whose `expires_at` is the request's deadline).
    pub fn insert(&mut self, key: CacheKey, response: Arc<Message>, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        self.prune(now);
        // Replaced keys leave stale queue items behind: bound those too.
        while self.entries.len() >= self.capacity || self.queue.len() >= 2 * self.capacity {
            if !self.pop_front() {
                break;
            }
        }
        let deadline = response.expires_at.unwrap_or(now);
        let end = deadline + GRACE;
        self.inserted += 1;
        let inserted = self.inserted;
        self.entries.insert(key.clone(), Entry { response, deadline, end, inserted });
        self.queue.push_back((end, inserted, key));
    }

    fn prune(&mut self, now: Instant) {
        while self.queue.front().is_some_and(|(end, _, _)| *end <= now) {
            self.pop_front();
        }
    }

    /// Drops the oldest queued entry; false if the queue is empty.
    fn pop_front(&mut self) -> bool {
        let Some((_, inserted, key)) = self.queue.pop_front() else { return false };
        if let hash_map::Entry::Occupied(e) = self.entries.entry(key) {
            if e.get().inserted == inserted {
                e.remove();
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use statehub_broker::codec::{PublishProperties, QoS};

    fn message(deadline: Instant) -> Arc<Message> {
        Arc::new(Message {
            topic: "t".into(),
            payload: Bytes::from_static(b"+OK\r\n"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: PublishProperties::default(),
            expires_at: Some(deadline),
            publisher: None,
        })
    }

    fn key(n: u8) -> CacheKey {
        CacheKey { client_id: "c".into(), correlation: Bytes::from(vec![n; 16]) }
    }

    #[test]
    fn hit_late_and_forgotten() {
        let now = Instant::now();
        let mut cache = ResponseCache::new(4);
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Miss));
        cache.insert(key(1), message(now + Duration::from_secs(5)), now);
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(1), now + Duration::from_secs(6)), Lookup::Late));
        assert!(matches!(cache.lookup(&key(1), now + Duration::from_secs(70)), Lookup::Miss));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn bounded() {
        let now = Instant::now();
        let mut cache = ResponseCache::new(2);
        for n in 0..5 {
            cache.insert(key(n), message(now + Duration::from_secs(u64::from(n) + 1)), now);
        }
        assert_eq!(cache.len(), 2);
        assert!(matches!(cache.lookup(&key(4), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(0), now), Lookup::Miss));
    }
}
