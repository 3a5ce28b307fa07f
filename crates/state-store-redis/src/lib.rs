//! The state store's cluster engine: [`RedisEngine`], the store kept in Redis so that
//! several statehub nodes serve one store.
//!
//! Keys, values, versions, fencing tokens and expiries live in Redis (layout in
//! `lua.rs`); the nodes keep none of it. Every command that checks and writes (SET with
//! `NX`/`NEX`, fencing on SET/DEL/VDEL, VDEL's value match, the quotas) is one Lua script,
//! so it is atomic across nodes. The clock that issues versions lives in Redis too and is
//! advanced by the same script as the write: versions strictly increase across the whole
//! cluster and all carry the one configured node id, as the SDKs expect of the store.
//! Reads (GET, SCAN, the expiry index) are plain commands.
//!
//! The engine overrides the [`Engine`] trait's checked writes ([`Engine::set_checked`],
//! [`Engine::delete_checked`], [`Engine::remove_expired`]) and ignores the machine's local
//! clock: a request's `__ts` is carried into the next write's script instead
//! ([`Engine::observe_request`]).
//!
//! Expiry: every node's expiry task lists due keys from one sorted set and removes each
//! with a script that first checks the key is still due, so however many nodes race for
//! it, a key's expiry is removed, versioned and fed once.
//!
//! Notifications ([`Engine::publishes_changes`]): a script that changes a key some node
//! observes appends the change to one Redis stream, numbered by a counter the same
//! script increments. Every node reads that stream ([`ChangeFeed`]) and notifies its own
//! observers, so an observer learns of a change made through any node once, in the order
//! Redis ran the scripts (hence in version order per key). See `feed.rs` for reconnects.
//!
//! Redis out of reach: calls return [`EngineError::Unavailable`]; the service answers
//! those requests 503 and goes on, and requests succeed again as soon as Redis answers.
//!
//! Replication: with [`Options::wait`], a write is acknowledged only once that many
//! replicas have it (`WAIT`, see `statehub_redis_common::Wait`); fewer is a 503 for that request, counted
//! and logged.

mod conn;
mod feed;
mod lua;

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::{Client, Connection, RedisResult, Script};
use statehub_state_store::{
    DelOutcome, Engine, EngineError, Entry, Hlc, HlcClock, Limits, Refusal, ScanBatch,
    SetCondition, SetOutcome, SetRequest, Stamp, Stats, Value, WriteSeq,
};

use conn::Link;
pub use conn::{Counters, RECONNECT_BACKOFF};
pub use feed::{ChangeFeed, FeedCounters};
use lua::Scripts;
use statehub_redis_common::{self as wait, NotReplicated, ShortfallLog, Wait};

/// The longest key the engine takes (Redis itself takes far longer ones).
pub const MAX_KEY_LEN: usize = 64 << 10;

/// What can go wrong talking to Redis.
#[derive(Debug, thiserror::Error)]
pub enum RedisEngineError {
    /// Redis refused a command, or could not be reached.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// The last attempt to connect failed moments ago; the next is not due yet.
    #[error("redis unreachable (the last connection attempt failed less than {RECONNECT_BACKOFF:?} ago)")]
    Backoff,
    /// A stored entry or a script's reply is not what the engine writes.
    #[error("unexpected data in redis: {0}")]
    Corrupt(&'static str),
    /// Fewer replicas than [`Options::wait`] asks acknowledged a write.
    #[error(transparent)]
    NotReplicated(#[from] NotReplicated),
}

impl From<RedisEngineError> for EngineError {
    fn from(error: RedisEngineError) -> Self {
        match error {
            RedisEngineError::Corrupt(_) => EngineError::Backend(Box::new(error)),
            _ => EngineError::Unavailable(Box::new(error)),
        }
    }
}

/// How to reach the store in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// The namespace of the store's Redis keys (wrapped in a hash tag: `{namespace}`).
    pub namespace: String,
    /// This node's id, unique in the cluster: names its observations in Redis.
    pub node: String,
    /// The node id every version carries (the store's, the same on every node).
    pub version_node_id: String,
    /// Bound on every Redis call (connect, read, write).
    pub timeout: Duration,
    /// The change feed is trimmed to about this many entries.
    pub feed_len: u64,
    /// Acknowledge a write only once this many replicas have it (`None`: once the
    /// primary has it).
    pub wait: Option<Wait>,
}

/// Defaults of [`Options`].
pub mod defaults {
    use std::time::Duration;

    /// [`super::Options::namespace`].
    pub const NAMESPACE: &str = "statehub";
    /// [`super::Options::timeout`].
    pub const TIMEOUT: Duration = Duration::from_secs(2);
    /// [`super::Options::feed_len`].
    pub const FEED_LEN: u64 = 10_000;
}

/// The names of the store's Redis keys.
#[derive(Debug, Clone)]
struct Names {
    prefix: Vec<u8>,
    idx: Vec<u8>,
    exp: Vec<u8>,
    meta: Vec<u8>,
    events: Vec<u8>,
}

impl Names {
    fn new(namespace: &str) -> Self {
        let prefix = format!("{{{namespace}}}:").into_bytes();
        let name = |suffix: &str| [&prefix[..], suffix.as_bytes()].concat();
        Self {
            idx: name("keys"),
            exp: name("exp"),
            meta: name("meta"),
            events: name("events"),
            prefix,
        }
    }

    fn entry(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], b"e:", key].concat()
    }

    fn observers(&self, key: &[u8]) -> Vec<u8> {
        [&self.prefix[..], b"o:", key].concat()
    }
}

/// Most request stamps kept for the next script (see [`RedisEngine::queue`]).
const MAX_PENDING: usize = 32;

/// A request's stamp, to merge into the shared clock.
#[derive(Debug, Clone, Copy)]
struct Observation {
    stamp: Stamp,
    /// The request's time when the stamp is of that very millisecond: then the clock
    /// may step ([`HlcClock::observe_request`]); `None` for a plain merge.
    now_ms: Option<u64>,
}

/// The state store kept in Redis. See the crate docs.
#[derive(Debug)]
pub struct RedisEngine {
    link: RefCell<Link>,
    scripts: Scripts,
    names: Names,
    node: String,
    version_node: Arc<str>,
    feed_len: u64,
    /// Request stamps not yet merged into the shared clock, in order: the next script
    /// that writes (or refuses to) merges them first, exactly as the machine's clock
    /// would have one by one (see [`Observation`]).
    pending: Vec<Observation>,
    /// The last stats read, answered when Redis is out of reach ([`Engine::stats`] cannot fail).
    stats: Cell<Stats>,
    /// The feed number of the last change this call fed, until [`Engine::seal`] hands it
    /// on.
    fed: Option<WriteSeq>,
    /// See [`Options::wait`].
    wait: Option<Wait>,
    /// Writes fewer replicas acknowledged than `wait` asks, logged now and then.
    shortfalls: ShortfallLog,
}

impl RedisEngine {
    /// An engine on the store `options` names. Connects lazily: Redis need not be up yet.
    pub fn open(options: &Options) -> Result<Self, RedisEngineError> {
        let client = Client::open(options.url.as_str())?;
        Ok(Self {
            link: RefCell::new(Link::new(client, options.timeout)),
            scripts: Scripts::new(),
            names: Names::new(&options.namespace),
            node: options.node.clone(),
            version_node: Arc::from(options.version_node_id.as_str()),
            feed_len: options.feed_len,
            pending: Vec::new(),
            stats: Cell::new(Stats::default()),
            fed: None,
            wait: options.wait,
            shortfalls: ShortfallLog::default(),
        })
    }

    /// What it counted of its calls to Redis.
    pub fn counters(&self) -> Arc<Counters> {
        self.link.borrow().counters()
    }

    /// The change feed of this engine's store, to run on a thread of its own.
    pub fn feed(options: &Options) -> Result<ChangeFeed, RedisEngineError> {
        ChangeFeed::open(options, &Names::new(&options.namespace).events)
    }

    fn run<T>(
        &self,
        call: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, EngineError> {
        Ok(self.link.borrow_mut().run(call)?)
    }

    /// Runs a write script with the six keys every one takes and the pending stamps
    /// after `args`, then forgets the stamps it merged into the clock.
    fn write<T: redis::FromRedisValue>(
        &mut self,
        script: fn(&Scripts) -> &Script,
        key: &[u8],
        args: &[&[u8]],
    ) -> Result<T, EngineError> {
        let names = &self.names;
        let mut invocation = script(&self.scripts).prepare_invoke();
        invocation
            .key(names.entry(key))
            .key(&names.idx)
            .key(&names.exp)
            .key(&names.meta)
            .key(names.observers(key))
            .key(&names.events);
        for arg in args {
            invocation.arg(*arg);
        }
        for observation in &self.pending {
            let stamp = observation.stamp;
            invocation.arg(stamp.wall_ms).arg(stamp.counter).arg(
                observation
                    .now_ms
                    .map_or_else(String::new, |now| now.to_string()),
            );
        }
        let wait = self.wait;
        let (reply, acked) = self.run(|con| wait::invoke(con, &invocation, wait))?;
        self.pending.clear();
        if let Err(short) = wait::check(wait, acked) {
            self.count_not_replicated(&short);
            return Err(RedisEngineError::from(short).into());
        }
        Ok(reply)
    }

    /// Counts a write too few replicas acknowledged; logs at most every ten seconds.
    fn count_not_replicated(&mut self, short: &NotReplicated) {
        let counters = self.link.borrow().counters();
        if let Some(writes) = self.shortfalls.count(&counters.not_replicated) {
            tracing::warn!(
                error = %short,
                writes,
                "state store write not acknowledged by enough redis replicas; answered 503"
            );
        }
    }

    /// Queues a request's stamp for the next script (see [`RedisEngine::pending`]).
    fn queue(&mut self, stamp: Stamp, now_ms: u64) {
        // A stamp of another millisecond than the request's can only be merged: merges
        // in a row are one merge of the greatest.
        let observation = Observation {
            stamp,
            now_ms: (stamp.wall_ms == now_ms).then_some(now_ms),
        };
        match self.pending.last_mut() {
            Some(last) if last.now_ms.is_none() && observation.now_ms.is_none() => {
                last.stamp = last.stamp.max(stamp);
            }
            _ => self.pending.push(observation),
        }
        // Many reads in a row without a write: keep them as one merge of the greatest.
        // Versions still exceed every stamp; only a step's choice between a new
        // millisecond and a new counter may differ from the single node's.
        if self.pending.len() > MAX_PENDING {
            let greatest = self.pending.iter().map(|o| o.stamp).max();
            self.pending.clear();
            if let Some(stamp) = greatest {
                self.pending.push(Observation {
                    stamp,
                    now_ms: None,
                });
            }
        }
    }

    fn hlc(&self, wall: &[u8], counter: &[u8], node: Option<&[u8]>) -> Result<Hlc, EngineError> {
        let node: Arc<str> = match node {
            None => self.version_node.clone(),
            Some(node) if *node == *self.version_node.as_bytes() => self.version_node.clone(),
            Some(node) => Arc::from(std::str::from_utf8(node).map_err(|_| corrupt("node id"))?),
        };
        Ok(Hlc::new(number(wall)?, number(counter)?, node))
    }

    /// An entry from the fields `v vw vc vn fw fc fn x`.
    fn entry(&self, fields: Vec<Option<Vec<u8>>>) -> Result<Option<Entry>, EngineError> {
        let [v, vw, vc, vn, fw, fc, fnode, x]: [Option<Vec<u8>>; 8] =
            fields.try_into().map_err(|_| corrupt("entry fields"))?;
        let (Some(v), Some(vw), Some(vc)) = (v, vw, vc) else {
            return Ok(None);
        };
        let version = self.hlc(&vw, &vc, vn.as_deref())?;
        let fencing_token = match (fw, fc) {
            (Some(fw), Some(fc)) => Some(Box::new(self.hlc(&fw, &fc, fnode.as_deref())?)),
            _ => None,
        };
        Ok(Some(Entry {
            value: Value::new(&v),
            version,
            fencing_token,
            expires_at_ms: x.as_deref().map(number).transpose()?,
        }))
    }

    /// A write's `{tag, wall, counter, fed}` reply: its version; remembers `fed`, the
    /// change's number in the feed (`0`: not fed), for [`Engine::seal`].
    ///
    /// Why a reply waits for the feed: this node notifies its own observers of its own
    /// writes through the feed too (one path, so one order for every node), and the
    /// feed's thread may read the change after the writer's reply has gone. A client
    /// that observes a key, writes it and stops observing on seeing the reply would then
    /// miss the notification that one node always sends first.
    fn written(&mut self, reply: &[Vec<u8>]) -> Result<Hlc, EngineError> {
        let [_, wall, counter, fed] = reply else {
            return Err(corrupt("write script reply"));
        };
        self.note_fed(fed)?;
        self.hlc(wall, counter, None)
    }

    fn note_fed(&mut self, fed: &[u8]) -> Result<(), EngineError> {
        let fed = number(fed)?;
        if fed > 0 {
            self.fed = Some(self.fed.map_or(fed, |last| last.max(fed)));
        }
        Ok(())
    }

    /// A script's `{tag, wall, counter, node?}` reply, as a version.
    fn versioned(&self, reply: &[Vec<u8>]) -> Result<Hlc, EngineError> {
        match reply {
            [_, wall, counter] => self.hlc(wall, counter, None),
            [_, wall, counter, node] => self.hlc(wall, counter, Some(node)),
            _ => Err(corrupt("script reply")),
        }
    }
}

fn corrupt(what: &'static str) -> EngineError {
    RedisEngineError::Corrupt(what).into()
}

fn number(digits: &[u8]) -> Result<u64, EngineError> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| corrupt("number"))
}

fn refusal(name: &[u8]) -> Result<Refusal, EngineError> {
    match name {
        b"fencing_required" => Ok(Refusal::FencingTokenRequired),
        b"fencing_lower" => Ok(Refusal::FencingTokenLowerVersion),
        b"quota" => Ok(Refusal::QuotaExceeded),
        _ => Err(corrupt("refusal")),
    }
}

/// A fencing token as three script arguments (`''` for none).
fn token_args(token: Option<&Hlc>) -> [Vec<u8>; 3] {
    match token {
        Some(t) => [
            t.wall_ms.to_string().into_bytes(),
            t.counter.to_string().into_bytes(),
            t.node_id.as_bytes().to_vec(),
        ],
        None => [Vec::new(), Vec::new(), Vec::new()],
    }
}

mod engine;
