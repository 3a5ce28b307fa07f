//! The storage engine beneath the state machine, and its contract.
//!
//! The [`crate::Machine`] owns one engine and calls it from a single thread of control.
//! Every command that checks and writes is one engine call ([`Engine::set_checked`],
//! [`Engine::delete_checked`], [`Engine::remove_expired`]), which also issues the
//! write's version. Their default implementations make the checks on the engine's own
//! reads and then write, issuing versions from the machine's clock: right for an engine
//! that this one thread owns (the memory and durable engines), which then needs no
//! transactions across calls.
//!
//! An engine shared by several nodes (`statehub-state-store-redis`) overrides the three
//! so that each is atomic where the data lives, with a clock that lives there too and
//! that every node's writes advance: versions then strictly increase across the nodes
//! under the one configured node id. Such an engine ignores the machine's clock, takes
//! the requests' `__ts` through [`Engine::observe_request`] (it must merge them before
//! its next version, in order, as [`HlcClock::observe_request`] would), may fail a call
//! with [`EngineError::Unavailable`] (the request fails, the node goes on), and feeds
//! every change of an observed key back to all nodes ([`Engine::publishes_changes`]), so
//! that each node notifies its own observers of changes made anywhere, in one order.
//!
//! What every engine must guarantee:
//!
//! - **Atomic single-key writes.** After [`Engine::put`] or [`Engine::remove`] returns
//!   `Ok`, the whole [`Entry`] (value, version, fencing token, expiry) and the expiry
//!   index and [`Stats`] reflect the write; after `Err`, the key is either fully the old
//!   entry or fully the new one (a persistent engine must not tear an entry), and the
//!   machine treats the node as broken ([`crate::FatalError`]). One exception, which the
//!   machine passes on like any error and the shell tells apart: a persistent engine may
//!   *refuse* a request's first write before changing anything (its storage is out of
//!   disk space); the shell then answers that request with an error and carries on.
//! - **Read your writes.** A read after a successful write sees it.
//! - **No copies of values.** Values are [`Bytes`]; [`Engine::get`] returns the stored
//!   `Bytes` (a reference-count bump), never a fresh copy, for in-memory engines. Engines
//!   that must deserialize may allocate, once.
//! - **Expiry is data, not behaviour.** An engine never drops a key by itself;
//!   [`Engine::expired`] lists keys whose `expires_at_ms <= now`, ordered by expiry time
//!   then key, and the machine removes them (so it can notify observers), or hands that
//!   sweep to an engine that feeds its changes ([`Engine::carry_sweep`]).
//! - **Scans are resumable.** [`Engine::scan`] returns at most `count` keys after a
//!   cursor, plus the cursor to resume from (`None` once every key has been visited). A
//!   key present for the whole scan is returned at least once; a key written or removed
//!   meanwhile may or may not be. Cursors are opaque bytes, sent to clients as SCAN
//!   continuation tokens, so an engine must treat any cursor, even garbage, as a position
//!   (never panic on it).
//! - **Stats are exact and cheap.** [`Engine::stats`] is the count of keys and the sum of
//!   `key.len() + value.len()` over all keys, kept up to date by every write (the machine
//!   checks quotas against it on every SET).
//! - **Key length.** [`Engine::max_key_len`] is the longest key the engine can store; the
//!   machine refuses a SET of a longer key (`the quota has been exceeded`) rather than
//!   call `put`.
//!
//! Persistent engines add durability, without doing I/O inside any call the machine makes
//! while it handles a request:
//!
//! - **Writes are staged.** `put` and `remove` change the in-memory view at once (reads
//!   see them) and stage the change; nothing is written yet.
//! - **Seal.** The machine calls [`Engine::seal`] once at the end of every request and
//!   expiry run, with its clock. The engine hands what it staged, together with the
//!   clock's high-water mark, to its storage as one atomic unit (a hand-over, not I/O) and
//!   returns the [`WriteSeq`] the reply must wait for: `Some` while *any* write handed
//!   over so far is not yet durable, even when this request wrote nothing, because its
//!   reply may reveal such a write (a GET of a key whose SET is still in flight waits for
//!   that SET's commit, as Redis replies only after its AOF write); `None` once everything
//!   is durable. An engine that tracks which keys a call read may also return `None` for
//!   a call that wrote nothing and read only keys whose writes are all durable (the
//!   durable engine does so while its storage waits for disk space, so that reads of
//!   durable data are answered); a call that read nothing through the engine is taken
//!   to reveal everything. Sequence numbers never decrease. The machine turns `Some` into
//!   [`crate::Effect::AwaitDurable`]. Engines that keep nothing (the memory engine)
//!   always return `None`, so they cost nothing.
//! - **Reopen.** Reopened after its storage closed, an engine holds exactly the entries
//!   of the sealed writes that became durable, every field intact; expired entries too
//!   (expiry stays data: the machine removes them when it starts), and
//!   [`Engine::max_version`] is at least every clock sealed with a durable write, so a
//!   restarted node never issues a version it issued before, even if the wall clock went
//!   back.

mod checked;
mod op;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::ops::Bound;

use bytes::Bytes;
use smallvec::SmallVec;

use crate::command::SetCondition;
use crate::error::{EngineError, Refusal};
use crate::hlc::{Hlc, HlcClock, Stamp};
use crate::value::Value;

pub use checked::{check_quota, fence};
pub use op::{Op, OpOutcome};

/// A position in a persistent engine's stream of sealed writes (see [`Engine::seal`]).
pub type WriteSeq = u64;

/// What the store keeps for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The value, arbitrary bytes (kept framed for GET replies: see [`Value`]).
    pub value: Value,
    /// The version the server issued for the write that produced this entry.
    pub version: Hlc,
    /// The fencing token protecting the key, if one was ever set on it. Boxed: few keys
    /// have one, and inline it would add 24 bytes to every entry (a slot of the memory
    /// engine's hash table, key and entry, is 128 bytes with the token boxed and was 152
    /// with it inline: 48 MB more for a million keys' table).
    pub fencing_token: Option<Box<Hlc>>,
    /// When the key expires, in milliseconds since the Unix epoch.
    pub expires_at_ms: Option<u64>,
}

/// Size of the store, for quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Number of keys.
    pub keys: u64,
    /// Sum of `key.len() + value.len()` over all keys.
    pub bytes: u64,
}

/// One batch of a scan.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanBatch {
    /// Keys visited by this batch (unfiltered).
    pub keys: Vec<Bytes>,
    /// Where the next batch starts; `None` when the scan is complete.
    pub cursor: Option<Bytes>,
}

/// A SET that passed the machine's generic checks, for [`Engine::set_checked`].
#[derive(Debug, Clone, Copy)]
pub struct SetRequest<'a> {
    /// The key (a slice of the request: an engine that keeps it copies it).
    pub key: &'a [u8],
    /// The value.
    pub value: &'a [u8],
    /// `NX`, `NEX` or none.
    pub condition: SetCondition,
    /// `PX`, in milliseconds.
    pub px_ms: Option<u64>,
    /// The request's `__ft`.
    pub fencing_token: Option<&'a Hlc>,
    /// The time of the request, in milliseconds since the Unix epoch.
    pub now_ms: u64,
}

impl SetRequest<'_> {
    /// When the written key expires, if it has a `PX`.
    pub fn expires_at_ms(&self) -> Option<u64> {
        self.px_ms.map(|px| self.now_ms.saturating_add(px))
    }
}

/// The size limits and quotas a SET is checked against (from the machine's config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most keys the store holds.
    pub max_keys: u64,
    /// Most bytes (keys and values) the store holds.
    pub max_bytes: u64,
    /// Longest key (the configured bound or the engine's, whichever is lower).
    pub max_key_len: usize,
    /// Longest value.
    pub max_value_bytes: usize,
}

/// What a checked SET did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetOutcome {
    /// The entry was written with this version.
    Written(Hlc),
    /// `NX`/`NEX` kept the existing entry, which has this version.
    Kept(Hlc),
    /// Refused (fencing, quota); nothing changed.
    Refused(Refusal),
}

/// What a checked DEL or VDEL did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelOutcome {
    /// There was no such key.
    Absent,
    /// Deleted; the deletion has this version.
    Deleted(Hlc),
    /// VDEL's value did not match; the entry, with this version, stays.
    Kept(Hlc),
    /// Refused (fencing); nothing changed.
    Refused(Refusal),
}

/// One change of a key as an engine that publishes its changes reports it (see
/// [`Engine::publishes_changes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The change's position in the engine's feed: strictly increasing, one per change.
    pub seq: u64,
    /// The key.
    pub key: Bytes,
    /// The new value, or `None` for a deletion (an expiry's too).
    pub value: Option<Bytes>,
    /// The version of the write or deletion.
    pub version: Hlc,
}

/// Key-value storage for the state store. See the module docs for the contract.
pub trait Engine {
    /// The entry of `key` (expired entries included until removed): borrowed from an
    /// in-memory engine, for reads that only look at it (a GET, a SET's checks), which
    /// then copy and count nothing; owned from an engine that must fetch it.
    fn peek(&self, key: &[u8]) -> Result<Option<Cow<'_, Entry>>, EngineError>;
    /// The entry of `key`, if any (expired entries included until removed): the stored
    /// entry's fields shared, as [`Engine::peek`] finds them.
    fn get(&self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        Ok(self.peek(key)?.map(Cow::into_owned))
    }
    /// Stores `entry` under `key`, replacing and returning any previous entry. `key` may
    /// be a slice of a larger buffer (the request's): an engine that keeps it copies it,
    /// and an overwrite keeps the key already stored.
    fn put(&mut self, key: &[u8], entry: Entry) -> Result<Option<Entry>, EngineError>;
    /// Removes `key`, returning its entry if it had one.
    fn remove(&mut self, key: &[u8]) -> Result<Option<Entry>, EngineError>;
    /// Up to `count` keys (`count >= 1`) after `cursor` (from the start if `None`).
    fn scan(&self, cursor: Option<&[u8]>, count: usize) -> Result<ScanBatch, EngineError>;
    /// The earliest `expires_at_ms` of any key.
    fn next_expiry(&self) -> Result<Option<u64>, EngineError>;
    /// Up to `limit` keys with `expires_at_ms <= now_ms`, earliest first (ties by key).
    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<Bytes>, EngineError>;
    /// Current key count and byte total.
    fn stats(&self) -> Stats;
    /// The greatest version of any entry, or of a clock sealed with a durable write, so
    /// a restarted node's clock resumes past it.
    fn max_version(&self) -> Result<Option<Hlc>, EngineError>;
    /// The longest key `put` accepts.
    fn max_key_len(&self) -> usize;
    /// Ends one request's writes: hands them and `clock`'s high-water mark to durable
    /// storage and returns what the reply must wait for (see the module docs).
    fn seal(&mut self, clock: &HlcClock) -> Result<Option<WriteSeq>, EngineError>;

    /// Merges a request's `__ts` (if any) read at `now_ms` into the clock that issues
    /// versions (see [`HlcClock::observe_request`]). Called once per request, before its
    /// command runs. The default merges into the machine's `clock`.
    fn observe_request(&mut self, clock: &mut HlcClock, stamp: Option<Stamp>, now_ms: u64) {
        if let Some(stamp) = stamp {
            clock.observe_request(stamp, now_ms);
        }
    }

    /// A SET: fencing, then `NX`/`NEX`, then the quotas in `limits`, then the write with
    /// a new version, all as one atomic step. The default does it on this engine's own
    /// reads and writes with the machine's `clock` (right for an engine that one thread
    /// owns); an engine shared by several nodes does it in one operation of its own and
    /// issues the version from a clock it shares.
    fn set_checked(
        &mut self,
        clock: &mut HlcClock,
        request: &SetRequest<'_>,
        limits: &Limits,
    ) -> Result<SetOutcome, EngineError> {
        checked::set(self, clock, request, limits)
    }

    /// A DEL (`expected` is `None`) or VDEL: fencing, then VDEL's value match, then the
    /// removal with a new version, as one atomic step (see [`Engine::set_checked`]).
    fn delete_checked(
        &mut self,
        clock: &mut HlcClock,
        key: &[u8],
        expected: Option<&[u8]>,
        fencing_token: Option<&Hlc>,
        now_ms: u64,
    ) -> Result<DelOutcome, EngineError> {
        checked::delete(self, clock, key, expected, fencing_token, now_ms)
    }

    /// Removes `key` if it is still due (`expires_at_ms <= now_ms`), returning the
    /// deletion's version; `None` if it is gone or no longer due (another node removed
    /// it, or it was written again), so each expiry is removed, and notified, once.
    fn remove_expired(
        &mut self,
        clock: &mut HlcClock,
        key: &Bytes,
        now_ms: u64,
    ) -> Result<Option<Hlc>, EngineError> {
        checked::remove_expired(self, clock, key, now_ms)
    }

    /// Whether the engine takes over the machine's sweep of due keys before a request
    /// (the expiry task's own runs always read first, with [`Engine::expired`]): up to `limit` keys due by `now_ms`, each removed
    /// as [`Engine::remove_expired`] would, earliest first, and then, if `limit` were
    /// due, the request's own key if due. `false` (the default): the machine sweeps with
    /// [`Engine::expired`] and [`Engine::remove_expired`], one call per key.
    ///
    /// An engine whose calls are round trips to a server carries the sweep into the
    /// call's first command that reads or writes (at the latest [`Engine::seal`]), so
    /// that it costs no round trip of its own. Only an engine that
    /// [`Engine::publishes_changes`] may (the sweep's notifications come from its feed),
    /// and its outcome must be the machine's: the removals' versions issued before the
    /// request's `__ts` is merged ([`Engine::observe_request`] comes after this call).
    fn carry_sweep(&mut self, _now_ms: u64, _limit: usize) -> bool {
        false
    }

    /// Whether the engine reports every change itself, as [`Change`]s fed to
    /// [`crate::Machine::apply_change`], in one order shared by every node. The machine
    /// then leaves notifying to that feed, so an observer learns of changes made through
    /// any node exactly once and in the feed's order. Default: `false`, the machine
    /// notifies as it writes.
    fn publishes_changes(&self) -> bool {
        false
    }

    /// An observer on this node begins observing `key`: the engine must feed changes of
    /// `key` from now on. Returns the feed position after which changes are news to that
    /// observer (changes at or before it happened before it observed). Default: `0`.
    fn observe_key(&mut self, _key: &[u8]) -> Result<u64, EngineError> {
        Ok(0)
    }

    /// The last observer on this node of `key` left.
    fn forget_key(&mut self, _key: &[u8]) -> Result<(), EngineError> {
        Ok(())
    }

    /// Queues a request's one call ([`Op`]) to run with [`Engine::run_queued`], after the
    /// calls queued before it and with what the engine carries for it now (the
    /// request's stamp, the sweep before it), or gives it back (`false`, the default):
    /// the machine then runs it at once ([`Op::run`]). An engine whose calls are round
    /// trips queues them, so that several requests' calls travel together; it must
    /// then run them, and have their effects, exactly in the order queued, as if each
    /// had been made alone once the one before it returned.
    fn queue(&mut self, _op: &Op) -> bool {
        false
    }

    /// Runs the calls queued since the last run, in order: one outcome each, in order.
    fn run_queued(&mut self) -> Vec<Result<OpOutcome, EngineError>> {
        Vec::new()
    }
}

/// An in-memory engine: a hash map for point reads and writes, the keys again in an ordered
/// set (so scan cursors are simply the last key visited), and an expiry index ordered by
/// time.
///
/// Why two maps: every GET and SET looks a key up, and in an ordered map that is a walk down
/// a tree whose every comparison follows a key's pointer to its bytes (with 10,000 keys,
/// about a twentieth of a SET's CPU time went there); a hash map does it with one hash and
/// one comparison. The ordered set costs only when a key is added or removed, which an
/// overwrite (the common SET) does not do.
///
/// The hash map holds keys of up to [`INLINE_KEY`] bytes in its own slots, so that the
/// comparison that confirms a lookup reads the slot it already loaded instead of a key
/// buffer elsewhere in memory (another cache miss per request once the keys outgrow the
/// CPU caches); the ordered set has its own copy of each key.
#[derive(Debug, Default)]
pub struct MemoryEngine {
    entries: HashMap<Key, Entry>,
    order: BTreeSet<Bytes>,
    expiries: BTreeSet<(u64, Bytes)>,
    stats: Stats,
}

/// Keys up to this long are stored inline in the hash map's slots (a slot's key is 32
/// bytes either way).
pub const INLINE_KEY: usize = 24;

/// A key as the hash map holds it: inline up to [`INLINE_KEY`] bytes. Hashes and compares
/// as the byte slice, so lookups by `&[u8]` find it.
type Key = SmallVec<[u8; INLINE_KEY]>;

/// The hash map of keys. Clients choose the keys, so its hasher is seeded per process and
/// per map (foldhash: a few instructions per key where SipHash took a few hundred).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
const _: () = assert!(std::mem::size_of::<Key>() == std::mem::size_of::<Bytes>());
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Key>() + std::mem::size_of::<Entry>() == 128);

impl MemoryEngine {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// An engine holding `entries` (as a persistent engine reads them back at start-up),
    /// built in one pass: much faster than one `put` per key when they come in ascending
    /// key order, as a store reads them (the ordered key set is then built from a sorted
    /// run, without sorting). Of equal keys the last wins.
    pub fn from_entries(entries: impl IntoIterator<Item = (Bytes, Entry)>) -> Self {
        let entries = entries.into_iter();
        let capacity = entries.size_hint().0;
        Self::from_entries_with_capacity(entries, capacity)
    }

    /// [`MemoryEngine::from_entries`] for entries that are read as they come (a store's
    /// records, decoded one by one), `capacity` being about how many there are: the maps
    /// are sized once, and the entries are never held in a list of their own, which for a
    /// million keys is a few hundred megabytes less to allocate at start-up.
    pub fn from_entries_with_capacity(
        entries: impl IntoIterator<Item = (Bytes, Entry)>,
        capacity: usize,
    ) -> Self {
        let mut map: HashMap<Key, Entry> =
            HashMap::with_capacity_and_hasher(capacity, Default::default());
        let mut order: Vec<Bytes> = Vec::with_capacity(capacity);
        let mut sorted = true;
        for (key, entry) in entries {
            sorted &= order.last().is_none_or(|last| *last < key);
            // Of equal keys the last wins, as with `put`.
            map.insert(Key::from_slice(&key), entry);
            order.push(key);
        }
        if !sorted {
            order.sort_unstable();
            order.dedup();
        }
        let mut stats = Stats::default();
        let mut expiries = Vec::new();
        for (key, entry) in &map {
            stats.keys += 1;
            stats.bytes += Self::size(key, entry);
            if let Some(at) = entry.expires_at_ms {
                expiries.push((at, Bytes::copy_from_slice(key)));
            }
        }
        expiries.sort_unstable();
        Self {
            entries: map,
            order: order.into_iter().collect(),
            expiries: expiries.into_iter().collect(),
            stats,
        }
    }

    fn size(key: &[u8], entry: &Entry) -> u64 {
        (key.len() + entry.value.len()) as u64
    }

    fn forget(&mut self, key: &[u8], old: &Entry) {
        if let Some(at) = old.expires_at_ms {
            self.expiries.remove(&(at, Bytes::copy_from_slice(key)));
        }
        self.stats.keys -= 1;
        self.stats.bytes -= Self::size(key, old);
    }
}

impl Engine for MemoryEngine {
    fn peek(&self, key: &[u8]) -> Result<Option<Cow<'_, Entry>>, EngineError> {
        Ok(self.entries.get(key).map(Cow::Borrowed))
    }

    fn put(&mut self, key: &[u8], entry: Entry) -> Result<Option<Entry>, EngineError> {
        let size = Self::size(key, &entry);
        let expires_at_ms = entry.expires_at_ms;
        // An overwrite (the common case) replaces the entry in place: one lookup, and no
        // copy of the key.
        let old = match self.entries.get_mut(key) {
            Some(slot) => Some(std::mem::replace(slot, entry)),
            None => {
                self.order.insert(Bytes::copy_from_slice(key));
                self.entries.insert(Key::from_slice(key), entry);
                None
            }
        };
        if let Some(old) = &old {
            self.forget(key, old);
        }
        if let Some(at) = expires_at_ms {
            self.expiries.insert((at, Bytes::copy_from_slice(key)));
        }
        self.stats.keys += 1;
        self.stats.bytes += size;
        Ok(old)
    }

    fn remove(&mut self, key: &[u8]) -> Result<Option<Entry>, EngineError> {
        let Some(old) = self.entries.remove(key) else {
            return Ok(None);
        };
        self.order.remove(key);
        self.forget(key, &old);
        Ok(Some(old))
    }

    fn scan(&self, cursor: Option<&[u8]>, count: usize) -> Result<ScanBatch, EngineError> {
        let start = cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let mut range = self
            .order
            .range::<[u8], _>((start, Bound::Unbounded))
            .cloned();
        let keys: Vec<Bytes> = range.by_ref().take(count.max(1)).collect();
        let cursor = match range.next() {
            Some(_) => keys.last().cloned(),
            None => None,
        };
        Ok(ScanBatch { keys, cursor })
    }

    fn next_expiry(&self) -> Result<Option<u64>, EngineError> {
        Ok(self.expiries.first().map(|(at, _)| *at))
    }

    fn expired(&self, now_ms: u64, limit: usize) -> Result<Vec<Bytes>, EngineError> {
        Ok(self
            .expiries
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect())
    }

    fn stats(&self) -> Stats {
        self.stats
    }

    fn max_version(&self) -> Result<Option<Hlc>, EngineError> {
        Ok(self.entries.values().map(|e| &e.version).max().cloned())
    }

    fn max_key_len(&self) -> usize {
        usize::MAX
    }

    fn seal(&mut self, _clock: &HlcClock) -> Result<Option<WriteSeq>, EngineError> {
        Ok(None)
    }
}
