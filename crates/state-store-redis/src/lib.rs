//! The state store's cluster engine: [`RedisEngine`], the store kept in Redis so that
//! several statehub nodes serve one store.
//!
//! Keys, values, versions, fencing tokens and expiries live in Redis (layout in
//! `lua.rs`); the nodes keep none of it. Every command that checks and writes (SET with
//! `NX`/`NEX`, fencing on SET/DEL/VDEL, VDEL's value match, the quotas) is one Lua script,
//! so it is atomic across nodes. The clock that issues versions lives in Redis too and is
//! advanced by the same script as the write: versions strictly increase across the whole
//! cluster and all carry the one configured node id, as the SDKs expect of the store.
//! Reads (SCAN, the expiry index, a GET without a sweep to carry) are plain commands.
//!
//! The engine overrides the [`Engine`] trait's checked writes ([`Engine::set_checked`],
//! [`Engine::delete_checked`], [`Engine::remove_expired`]) and ignores the machine's local
//! clock: a request's `__ts` is carried into the next write's script instead
//! ([`Engine::observe_request`]).
//!
//! Expiry: due keys are listed from one sorted set and each removed by a script that
//! first checks the key is still due, so however many nodes race for it, a key's expiry
//! is removed, versioned and fed once. The machine's sweep before every request is
//! carried into the request's own script ([`Engine::carry_sweep`], `carry.rs`): a SET,
//! DEL, VDEL or GET is one round trip, not a sweep's plus its own.
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

mod carry;
mod conn;
mod feed;
mod lua;
mod queued;

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

use carry::{Carried, Carry};
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

    /// The keys every script about one entry starts with, in the order the scripts
    /// name them: the entry, the key index, the expiry index, the store's meta hash.
    fn entry_keys<'i, 's>(
        &self,
        invocation: &'i mut redis::ScriptInvocation<'s>,
        key: &[u8],
    ) -> &'i mut redis::ScriptInvocation<'s> {
        invocation
            .key(self.entry(key))
            .key(&self.idx)
            .key(&self.exp)
            .key(&self.meta)
    }
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
    /// The stamps and the sweep for the next script, and what scripts fed. In a cell, as
    /// reads (`&self`) carry the sweep too.
    carry: RefCell<Carry>,
    /// The last stats read, answered when Redis is out of reach ([`Engine::stats`] cannot fail).
    stats: Cell<Stats>,
    /// See [`Options::wait`].
    wait: Option<Wait>,
    /// Writes fewer replicas acknowledged than `wait` asks, logged now and then.
    shortfalls: RefCell<ShortfallLog>,
    /// Calls queued for one pipeline (`queued.rs`), with what each carries.
    queued: Vec<(statehub_state_store::Op, Carried)>,
}

impl RedisEngine {
    /// An engine on the store `options` names. Connects lazily: Redis need not be up yet.
    pub fn open(options: &Options) -> Result<Self, RedisEngineError> {
        let client = Client::open(options.url.as_str())?;
        Ok(Self {
            link: RefCell::new(Link::new(
                client,
                options.timeout,
                &format!("statehub-store:{}", options.node),
            )),
            scripts: Scripts::new(),
            names: Names::new(&options.namespace),
            node: options.node.clone(),
            version_node: Arc::from(options.version_node_id.as_str()),
            feed_len: options.feed_len,
            carry: RefCell::default(),
            stats: Cell::new(Stats::default()),
            wait: options.wait,
            shortfalls: RefCell::default(),
            queued: Vec::new(),
        })
    }

    /// Counts its calls into `counters` (shared by a node's engines) from now on.
    pub fn count_into(&mut self, counters: Arc<Counters>) {
        self.link.get_mut().count_into(counters);
    }

    /// What it counted of its calls to Redis.
    pub fn counters(&self) -> Arc<Counters> {
        self.link.borrow().counters()
    }

    /// The change feed of this engine's store, to run on a thread of its own.
    pub fn feed(options: &Options) -> Result<ChangeFeed, RedisEngineError> {
        ChangeFeed::open(options, &Names::new(&options.namespace).events)
    }

    /// Runs one command, after the sweep if one is pending (the command cannot carry it).
    fn run<T>(
        &self,
        call: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, EngineError> {
        if self.carry.borrow().sweep_pending() {
            self.sweep()?;
        }
        self.call(call)
    }

    fn call<T>(
        &self,
        call: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, EngineError> {
        Ok(self.link.borrow_mut().run(call)?)
    }

    /// Runs the pending sweep on its own.
    fn sweep(&self) -> Result<(), EngineError> {
        let names = &self.names;
        let mut invocation = self.scripts.sweep.prepare_invoke();
        invocation
            .key(&names.idx)
            .key(&names.exp)
            .key(&names.meta)
            .key(&names.events)
            .arg(self.feed_len);
        if !self.read_with_sweep(&mut invocation)?.is_empty() {
            return Err(corrupt("sweep script reply"));
        }
        Ok(())
    }

    /// Runs a script that only reads but carries the sweep: the sweep's stamps merged if
    /// it removed a key, and then, under [`Options::wait`], a `WAIT` for its removals.
    /// Returns the reply after the sweep's two.
    fn read_with_sweep(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Option<Vec<u8>>>, EngineError> {
        self.carry.borrow().append_args(invocation);
        let mut reply: Vec<Option<Vec<u8>>> = self.call(|con| invocation.invoke(con))?;
        let removed = match reply.get(..2) {
            Some([Some(fed), Some(removed)]) => self.swept(fed, removed)?,
            _ => return Err(corrupt("sweep reply")),
        };
        reply.drain(..2);
        self.carry.borrow_mut().swept(removed > 0);
        if removed > 0 {
            if let Some(wait) = self.wait {
                let acked = self.call(|con| replicas_acked(con, wait))?;
                self.check_replicated(Some(acked))?;
            }
        }
        Ok(reply)
    }

    /// The sweep's two first fields of a script's reply: notes what it fed, returns how
    /// many keys it removed.
    fn swept(&self, fed: &[u8], removed: &[u8]) -> Result<u64, EngineError> {
        self.carry.borrow_mut().note_fed(number(fed)?);
        number(removed)
    }

    /// A write script's invocation: the six keys every one takes, then `args` (the
    /// sweep and the stamps go after them).
    fn write_invocation<'s>(
        &'s self,
        script: &'s Script,
        key: &[u8],
        args: &[&[u8]],
    ) -> redis::ScriptInvocation<'s> {
        let names = &self.names;
        let mut invocation = script.prepare_invoke();
        names
            .entry_keys(&mut invocation, key)
            .key(names.observers(key))
            .key(&names.events);
        for arg in args {
            invocation.arg(*arg);
        }
        invocation
    }

    /// Runs a write script ([`RedisEngine::write_invocation`]) with the sweep and the
    /// pending stamps, and forgets what it merged. Returns the reply after the sweep's
    /// two.
    fn write(
        &self,
        mut invocation: redis::ScriptInvocation<'_>,
    ) -> Result<Vec<Vec<u8>>, EngineError> {
        self.carry.borrow().append_args(&mut invocation);
        let wait = self.wait;
        let (reply, acked): (Vec<Vec<u8>>, _) =
            self.call(|con| wait::invoke(con, &invocation, wait))?;
        self.carry.borrow_mut().merged_all();
        let reply = self.after_sweep(reply)?;
        self.check_replicated(acked)?;
        Ok(reply)
    }

    /// A write script's reply after the sweep's two fields, whose feed number it notes.
    fn after_sweep(&self, mut reply: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, EngineError> {
        match reply.get(..2) {
            Some([fed, removed]) => self.swept(fed, removed)?,
            _ => return Err(corrupt("sweep reply")),
        };
        reply.drain(..2);
        Ok(reply)
    }

    /// `Err` if fewer replicas acknowledged than [`Options::wait`] asks: counted, and
    /// logged at most every ten seconds.
    fn check_replicated(&self, acked: Option<u32>) -> Result<(), EngineError> {
        let Err(short) = wait::check(self.wait, acked) else {
            return Ok(());
        };
        let counters = self.link.borrow().counters();
        if let Some(writes) = self.shortfalls.borrow_mut().count(&counters.not_replicated) {
            tracing::warn!(
                error = %short,
                writes,
                "state store write not acknowledged by enough redis replicas; answered 503"
            );
        }
        Err(RedisEngineError::from(short).into())
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
    fn written(&self, reply: &[Vec<u8>]) -> Result<Hlc, EngineError> {
        let [_, wall, counter, fed] = reply else {
            return Err(corrupt("write script reply"));
        };
        self.carry.borrow_mut().note_fed(number(fed)?);
        self.hlc(wall, counter, None)
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

/// `WAIT` on its own: how many replicas have this connection's writes so far.
fn replicas_acked(con: &mut Connection, wait: Wait) -> RedisResult<u32> {
    let millis = u64::try_from(wait.timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    redis::cmd("WAIT").arg(wait.replicas).arg(millis).query(con)
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
