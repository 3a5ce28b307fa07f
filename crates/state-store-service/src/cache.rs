//! Responses remembered per (client id, Correlation Data), so that a QoS 1 redelivery of
//! a request (the SDKs re-publish unacknowledged requests after a reconnect) is answered
//! with the same response instead of being executed twice: a repeated `SET k v NX`
//! must not turn `+OK` into `:-1`, nor a repeated DEL `:1` into `:0`.
//!
//! An entry lives until its request's deadline plus a grace period (as the SDK executor
//! does); a duplicate arriving after the deadline is dropped, since its caller has given
//! up. The cache has two bounds:
//!
//! * **answered entries** (`response_cache_entries`, default 1,000): when the cache holds
//!   that many, the oldest entry goes first, unless its response is still on its way to
//!   the requester;
//! * **entries on their way** (`response_cache_in_flight`, default 20,000): such an entry
//!   is kept (moved to the back instead of evicted, one per insert) until the cache holds
//!   this many, where the oldest goes regardless.
//!
//! Why the exception: a client resends a request after reconnecting only if it did not
//! get the PUBACK, and the PUBACK goes out on the same connection just before the
//! response; so while the response is queued or unacknowledged in
//! the requester's session (the session keeps the message alive, which the entry sees
//! through a `Weak`), the request may come again. Once the response is acknowledged (or
//! its session is gone, and with it any redelivery), the request cannot come again as a
//! redelivery, and the entry is evictable.
//!
//! Why the first bound is small: under load every insert evicts the oldest entry, and
//! evicting touches memory written long before (the entry, its reply, the message its
//! `Weak` keeps allocated). With 10,000 answered entries those touches missed the CPU
//! caches and cost about a tenth of the throughput against 1,000 (measured, see
//! docs/benchmarks.md). What the smaller bound gives up is little: an answered request
//! is not redelivered, unless its response went to another client, to nobody, or at
//! QoS 0; for those the entry lasts 1,000 requests (or its deadline plus the grace
//! period, if that comes first), where 10,000 lasted 80 ms at 120,000 requests/s,
//! shorter than a reconnect anyway.
//!
//! Every request looks up, inserts one entry and, once the cache is full, evicts one, so
//! all three are O(1) and touch little memory:
//! * entries sit in a queue in arrival order, whose front is pruned once its end has
//!   passed (an entry whose end passed behind an older, longer-lived one is forgotten all
//!   the same: lookups check the end; it leaves when its turn comes);
//! * the index maps a keyed fingerprint of (client id, Correlation Data) to the
//!   entry's place in the queue: 16 bytes a bucket instead of the keys themselves, so
//!   the probes of a full cache stay in cache. A fingerprint match is confirmed against
//!   the stored key; two live keys with the same 64-bit fingerprint (never seen in
//!   practice, and not forceable without the process's random seed) make the older one
//!   forgotten early, as if evicted. The fingerprint is foldhash's quality hash, seeded
//!   per process and per cache: a few dozen instructions a request where SipHash took
//!   about 400; a collision costs an early eviction, never a wrong answer.

use std::collections::hash_map;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use statehub_broker::codec::ByteString;
use statehub_broker::Message;

use crate::rpc::OkParts;

/// How long past its deadline an entry still suppresses re-execution.
const GRACE: Duration = Duration::from_secs(60);

/// Who asked, and which call. Both parts are reference-counted, so making a key copies
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub client_id: ByteString,
    pub correlation: Bytes,
}

/// A remembered `__stat=200` response: its parts and payload, not the message (see
/// [`OkParts`]).
#[derive(Debug, Clone)]
pub struct CachedReply {
    pub parts: OkParts,
    pub payload: Bytes,
    /// The request's deadline, which is also the response's expiry.
    pub deadline: Instant,
}

impl CachedReply {
    /// The response message, for `client_id` alone (see [`Message::recipient`]).
    pub fn message_for(&self, client_id: ByteString) -> Arc<Message> {
        let payload = self.payload.clone();
        Arc::new(self.parts.message(payload, self.deadline, Some(client_id)))
    }
}

/// What the cache knows about a request.
#[derive(Debug)]
pub enum Lookup {
    /// Never seen (or forgotten): execute it, then [`ResponseCache::insert`] its response
    /// here.
    Miss(Vacancy),
    /// Seen and still awaited: send this response again.
    Hit(Arc<Message>),
    /// Seen, but its deadline has passed: nobody is waiting any more.
    Late,
}

/// Where a missed key goes: its fingerprint, so that inserting does not hash the key
/// again.
#[derive(Debug)]
pub struct Vacancy {
    fingerprint: u64,
}

/// One remembered response, in the queue. Its key is the client id and the reply's own
/// copy of the Correlation Data.
#[derive(Debug)]
struct Slot {
    fingerprint: u64,
    client_id: ByteString,
    reply: CachedReply,
    /// The response as sent: alive while a session still holds it (queued or
    /// unacknowledged).
    sent: Weak<Message>,
    /// When the entry is forgotten.
    end: Instant,
}

impl Slot {
    fn is(&self, key: &CacheKey) -> bool {
        self.client_id == key.client_id && self.reply.parts.correlation() == &key.correlation[..]
    }
}

/// The index's hasher: fingerprints are keyed hashes already, used as they are.
#[derive(Debug, Default)]
struct Fingerprint(u64);

impl Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The bounded cache.
#[derive(Debug)]
pub struct ResponseCache {
    /// Answered entries kept (see the module docs); 0 disables the cache.
    capacity: usize,
    /// Entries kept in all, those on their way included; at least `capacity`.
    in_flight: usize,
    keys: foldhash::quality::RandomState,
    /// Fingerprint -> insertion number of the newest entry with it.
    index: HashMap<u64, u64, BuildHasherDefault<Fingerprint>>,
    /// Entries in insertion order; the back one has insertion number `next - 1`.
    queue: VecDeque<Slot>,
    next: u64,
}

impl ResponseCache {
    /// A cache keeping `capacity` answered entries and, with those whose response is on
    /// its way, `in_flight` at most (raised to `capacity` if below it).
    pub fn new(capacity: usize, in_flight: usize) -> Self {
        // Sized up front: a full cache is the steady state under load, and growing the
        // queue copies every entry.
        let queue = VecDeque::with_capacity(capacity.min(1 << 16));
        let in_flight = in_flight.max(capacity);
        Self {
            capacity,
            in_flight,
            keys: foldhash::quality::RandomState::default(),
            index: HashMap::default(),
            queue,
            next: 0,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Forgets every response (the store failed: they may answer writes now lost).
    pub fn clear(&mut self) {
        self.index.clear();
        self.queue.clear();
    }

    pub fn lookup(&mut self, key: &CacheKey, now: Instant) -> Lookup {
        self.prune(now);
        let fingerprint = self.keys.hash_one(key);
        let miss = Lookup::Miss(Vacancy { fingerprint });
        let Some(slot) = self.index.get(&fingerprint).and_then(|&n| self.slot(n)) else {
            return miss;
        };
        if !slot.is(key) || slot.end <= now {
            miss
        } else if slot.reply.deadline <= now {
            Lookup::Late
        } else {
            Lookup::Hit(slot.reply.message_for(key.client_id.clone()))
        }
    }

    /// Remembers `reply` to `client_id`'s request, whose lookup missed at `at` (the
    /// request's Correlation Data is the reply's), and sent as `sent`.
    pub fn insert(
        &mut self,
        at: Vacancy,
        client_id: ByteString,
        reply: CachedReply,
        sent: &Arc<Message>,
        now: Instant,
    ) {
        if self.capacity == 0 {
            return;
        }
        self.prune(now);
        self.make_room();
        let fingerprint = at.fingerprint;
        let end = reply.deadline + GRACE;
        self.index.insert(fingerprint, self.next);
        self.next += 1;
        self.queue.push_back(Slot {
            fingerprint,
            client_id,
            reply,
            sent: Arc::downgrade(sent),
            end,
        });
    }

    /// Evicts until there is room for one more entry, keeping (up to the in-flight bound)
    /// the oldest entry while its response is on its way: it moves to the back, once per
    /// call.
    fn make_room(&mut self) {
        let mut moved = false;
        while self.queue.len() >= self.capacity {
            let in_flight = self
                .queue
                .front()
                .is_some_and(|s| s.sent.strong_count() > 0);
            if !in_flight || self.queue.len() >= self.in_flight {
                self.pop_front();
            } else if moved {
                return;
            } else {
                self.move_front_to_back();
                moved = true;
            }
        }
    }

    /// Requeues the oldest entry as the newest (its index entry follows it).
    fn move_front_to_back(&mut self) {
        let n = self.next - self.queue.len() as u64;
        let Some(slot) = self.queue.pop_front() else {
            return;
        };
        if let Some(place) = self.index.get_mut(&slot.fingerprint) {
            if *place == n {
                *place = self.next;
            }
        }
        self.next += 1;
        self.queue.push_back(slot);
    }

    /// The queued entry with insertion number `n`, if still queued.
    fn slot(&self, n: u64) -> Option<&Slot> {
        let first = self.next - self.queue.len() as u64;
        self.queue.get(usize::try_from(n.checked_sub(first)?).ok()?)
    }

    fn prune(&mut self, now: Instant) {
        while self.queue.front().is_some_and(|s| s.end <= now) {
            self.pop_front();
        }
    }

    /// Drops the oldest entry, if any (and its index entry, unless a newer one took it
    /// over).
    fn pop_front(&mut self) {
        let n = self.next - self.queue.len() as u64;
        let Some(slot) = self.queue.pop_front() else {
            return;
        };
        if let hash_map::Entry::Occupied(e) = self.index.entry(slot.fingerprint) {
            if *e.get() == n {
                e.remove();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(n: u8, deadline: Instant) -> CachedReply {
        CachedReply {
            parts: OkParts::new("t", Some(&[n; 16]), None),
            payload: Bytes::from_static(b"+OK\r\n"),
            deadline,
        }
    }

    fn key(n: u8) -> CacheKey {
        CacheKey {
            client_id: "c".into(),
            correlation: Bytes::from(vec![n; 16]),
        }
    }

    /// Looks key `n` up (it must miss) and inserts its reply there, as the service does;
    /// returns the message as sent (the entry counts it in flight while it is kept).
    fn put(cache: &mut ResponseCache, n: u8, deadline: Instant, now: Instant) -> Arc<Message> {
        let Lookup::Miss(at) = cache.lookup(&key(n), now) else {
            panic!("key {n} is cached")
        };
        let reply = reply(n, deadline);
        let sent = reply.message_for("c".into());
        cache.insert(at, "c".into(), reply, &sent, now);
        sent
    }

    #[test]
    fn a_response_on_its_way_keeps_its_entry() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let mut cache = ResponseCache::new(3, 4);
        let unacknowledged = put(&mut cache, 1, later, now);
        for n in 2..20 {
            put(&mut cache, n, later, now);
        }
        // Kept although 18 newer entries went through a cache of 3; the bound held.
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(2), now), Lookup::Miss(_)));
        assert!(cache.len() <= 4, "{} entries", cache.len());
        // Acknowledged: evictable like the rest.
        drop(unacknowledged);
        for n in 20..30 {
            put(&mut cache, n, later, now);
        }
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Miss(_)));
        assert_eq!(cache.len(), 3);
    }

    /// A cache with bounds `capacity` and `in_flight` after `n` requests whose responses
    /// are all still on their way (the returned messages), at `now`.
    fn unanswered(
        capacity: usize,
        in_flight: usize,
        n: u8,
        now: Instant,
    ) -> (ResponseCache, Vec<Arc<Message>>) {
        let mut cache = ResponseCache::new(capacity, in_flight);
        let held = (0..n)
            .map(|n| put(&mut cache, n, now + Duration::from_secs(5), now))
            .collect();
        (cache, held)
    }

    #[test]
    fn responses_on_their_way_grow_the_cache_to_the_in_flight_bound_at_most() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let (mut cache, held) = unanswered(3, 8, 20, now);
        assert_eq!(cache.len(), 8);
        assert!(matches!(cache.lookup(&key(19), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(12), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(11), now), Lookup::Miss(_)));
        // Once answered, the entries above the first bound go as new ones come.
        drop(held);
        for n in 20..22 {
            put(&mut cache, n, later, now);
        }
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn the_in_flight_bound_is_at_least_the_first() {
        let (cache, held) = unanswered(3, 1, 5, Instant::now());
        assert_eq!(cache.len(), 3);
        drop(held);
    }

    #[test]
    fn hit_late_and_forgotten() {
        let now = Instant::now();
        let mut cache = ResponseCache::new(4, 8);
        assert!(matches!(cache.lookup(&key(1), now), Lookup::Miss(_)));
        put(&mut cache, 1, now + Duration::from_secs(5), now);
        let Lookup::Hit(hit) = cache.lookup(&key(1), now) else {
            panic!("no hit")
        };
        assert_eq!(
            hit.properties.correlation_data.as_deref(),
            Some(&[1; 16][..])
        );
        assert_eq!(hit.expires_at, Some(now + Duration::from_secs(5)));
        assert!(matches!(
            cache.lookup(&key(1), now + Duration::from_secs(6)),
            Lookup::Late
        ));
        assert!(matches!(
            cache.lookup(&key(1), now + Duration::from_secs(70)),
            Lookup::Miss(_)
        ));
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn another_client_or_call_misses() {
        let now = Instant::now();
        let mut cache = ResponseCache::new(4, 8);
        put(&mut cache, 1, now + Duration::from_secs(5), now);
        let other_client = CacheKey {
            client_id: "d".into(),
            ..key(1)
        };
        assert!(matches!(cache.lookup(&other_client, now), Lookup::Miss(_)));
        assert!(matches!(cache.lookup(&key(2), now), Lookup::Miss(_)));
    }

    #[test]
    fn a_replaced_entry_outlives_its_stale_queue_place() {
        let now = Instant::now();
        let later = now + Duration::from_secs(70);
        let mut cache = ResponseCache::new(3, 6);
        put(&mut cache, 1, now + Duration::from_secs(1000), now);
        put(&mut cache, 2, now + Duration::from_secs(1), now);
        // Key 2's end has passed, but it is queued behind key 1: forgotten all the same.
        assert!(matches!(cache.lookup(&key(2), later), Lookup::Miss(_)));
        put(&mut cache, 2, later + Duration::from_secs(10), later);
        put(&mut cache, 3, later + Duration::from_secs(10), later);
        put(&mut cache, 4, later + Duration::from_secs(10), later);
        // Key 1 and key 2's first place were evicted; its new entry stays.
        assert!(matches!(cache.lookup(&key(1), later), Lookup::Miss(_)));
        assert!(matches!(cache.lookup(&key(2), later), Lookup::Hit(_)));
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn bounded() {
        let now = Instant::now();
        let mut cache = ResponseCache::new(2, 4);
        for n in 0..5 {
            put(
                &mut cache,
                n,
                now + Duration::from_secs(u64::from(n) + 1),
                now,
            );
        }
        assert_eq!(cache.len(), 2);
        assert!(matches!(cache.lookup(&key(4), now), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&key(0), now), Lookup::Miss(_)));
    }
}
