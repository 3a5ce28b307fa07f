//! Moving a session to the node its client connected to (see the parent module).
//!
//! 1. `owners` names the session's incarnation, its hash names the owner.
//! 2. A live owner is asked to release it: an `h` entry on the message stream, read by
//!    the owner in stream order; it closes the client's connection there (0x8E), stops
//!    storing the session and, after every change it recorded, marks it released at
//!    that entry and pushes to `handoff:{incarnation}`, which this node waits on. An
//!    owner whose liveness key expired is dead: its session is taken as it is.
//! 3. The claim script makes this node the owner and returns the session and bodies.
//! 4. Under the reader's lock (so the stream's order is cut at one entry), the session
//!    joins the broker and the stream entries after where the owner stopped, up to
//!    where this node's reader is, are replayed into it alone; later entries reach it
//!    through the reader as for any session.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::streams::StreamRangeReply;
use redis::{Client, Commands, Connection, Script, Value};
use statehub_broker::{BoxFuture, Broker, SessionStoreError};

use super::records::{self, Loaded};
use super::{lua, store_error, Inner};
use crate::flush::{self, FlushError, HoldState, Mode};
use crate::writer::{open, Command};
use crate::{append, wire};

/// How often a claim is retried when another node claimed the session meanwhile.
const ATTEMPTS: usize = 4;
/// Most stream entries read per replay call.
const REPLAY_BATCH: usize = 512;

/// Where this node's reader is in the stream; its lock is held while the reader
/// applies entries, so a session joins at one point of the stream's order.
#[derive(Debug, Default)]
pub(crate) struct Cut {
    pub last_id: Option<String>,
}

/// What fetching needs besides the store.
pub(crate) struct Fetcher {
    pub client: Client,
    pub feed: String,
    /// The counter that numbers the stream's entries (`lag.rs`).
    pub seq: String,
    pub node: String,
    pub stream_len: u64,
    pub timeout: Duration,
    /// How long a node's liveness key lives without a heartbeat.
    pub node_ttl: Duration,
    pub cut: Arc<Mutex<Cut>>,
    /// Connections kept between fetches (most CONNECTs find nothing to fetch: one
    /// round trip on a connection already open).
    pub pool: Mutex<Vec<Connection>>,
    /// This node's stream writer, flushed before a replay (see [`install`]).
    pub writer: SyncSender<Command>,
    /// Its hold (`flush.rs`).
    pub hold: Arc<HoldState>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("feed", &self.feed)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// Most connections kept in [`Fetcher::pool`].
const POOLED: usize = 4;

pub(super) fn fetch(
    inner: Arc<Inner>,
    broker: Broker,
    client_id: String,
) -> BoxFuture<'static, Result<bool, SessionStoreError>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(move || {
            fetch_blocking(&inner, &broker, &client_id).map_err(|e| {
                tracing::warn!(client = client_id, "session not fetched from redis: {e}");
                store_error(&format!("session not fetched from redis: {e}"))
            })
        })
        .await
        .map_err(|_| store_error("session fetch stopped"))?
    })
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    #[error(transparent)]
    Record(#[from] records::RecordError),
    #[error("another node keeps taking the session")]
    Contended,
    #[error("this node's messages were not appended to the stream: {0}")]
    Flush(#[from] FlushError),
}

/// The claim script's answer.
pub(super) enum Claim {
    None,
    /// Another node claimed it meanwhile.
    OwnedByAnother,
    Taken {
        from: String,
        loaded: Loaded,
        /// The releasing node, and the entry up to which its messages are in the
        /// session (see `Inner::released`).
        settled: Option<(String, String)>,
    },
}

/// Whether a session was brought here.
fn fetch_blocking(inner: &Inner, broker: &Broker, client_id: &str) -> Result<bool, FetchError> {
    let f = &inner.fetcher;
    let pooled = f.pool.lock().pop();
    let mut con = match pooled {
        Some(con) => con,
        None => open(&f.client, f.timeout + f.node_ttl)?,
    };
    let fetched = fetch_on(inner, broker, &mut con, client_id);
    if fetched.is_ok() {
        let mut pool = f.pool.lock();
        if pool.len() < POOLED {
            pool.push(con);
        }
    }
    fetched
}

fn fetch_on(
    inner: &Inner,
    broker: &Broker,
    con: &mut Connection,
    client_id: &str,
) -> Result<bool, FetchError> {
    let f = &inner.fetcher;
    let p = &inner.prefix;
    for _ in 0..ATTEMPTS {
        let incarnation: Option<u64> = con.hget(format!("{p}owners"), client_id)?;
        let Some(incarnation) = incarnation else {
            return Ok(false);
        };
        let owner: Option<String> = con.hget(format!("{p}s:{incarnation}"), "_o")?;
        let owner = owner.unwrap_or_default();
        let mut dead = owner.is_empty() || owner == inner.owner || !alive(con, p, &owner)?;
        if !dead {
            ask_release(con, inner, client_id, incarnation)?;
            let woken: Option<(String, String)> = con.blpop(
                format!("{p}handoff:{incarnation}"),
                f.node_ttl.as_secs_f64().max(0.1),
            )?;
            dead = woken.is_none() && !alive(con, p, &owner)?;
        }
        let _claiming = Claiming::start(inner, incarnation);
        match claim(con, inner, client_id, incarnation, &owner, dead)? {
            Claim::None => return Ok(false),
            Claim::OwnedByAnother => continue,
            Claim::Taken {
                from,
                loaded,
                settled,
            } => {
                let from = Resume {
                    from: &from,
                    settled: settled.as_ref(),
                };
                return install(inner, broker, con, client_id, incarnation, from, &loaded);
            }
        }
    }
    Err(FetchError::Contended)
}

/// Marks a session as being claimed and installed here, until dropped (see
/// `Inner::asked`).
pub(super) struct Claiming<'a> {
    inner: &'a Inner,
    incarnation: u64,
}

impl<'a> Claiming<'a> {
    pub(super) fn start(inner: &'a Inner, incarnation: u64) -> Self {
        inner.state.lock().claiming.insert(incarnation, None);
        Claiming { inner, incarnation }
    }
}

impl Drop for Claiming<'_> {
    fn drop(&mut self) {
        self.inner.state.lock().claiming.remove(&self.incarnation);
    }
}

fn alive(con: &mut Connection, p: &str, owner: &str) -> redis::RedisResult<bool> {
    con.exists(format!("{p}alive:{owner}"))
}

pub(super) fn ask_release(
    con: &mut Connection,
    inner: &Inner,
    client_id: &str,
    incarnation: u64,
) -> redis::RedisResult<()> {
    let f = &inner.fetcher;
    let incarnation = incarnation.to_string();
    let fields = ["n", &f.node, "t", "h", "c", client_id, "i", &incarnation];
    // Numbered like every entry, so that the readers' lag counts it (`lag.rs`).
    Script::new(append::SCRIPT)
        .key(&f.feed)
        .key(&f.seq)
        .arg(f.stream_len)
        .arg(1)
        .arg(fields.len())
        .arg(&fields[..])
        .invoke::<()>(con)
}

pub(super) fn claim(
    con: &mut Connection,
    inner: &Inner,
    client_id: &str,
    incarnation: u64,
    owner: &str,
    dead: bool,
) -> Result<Claim, FetchError> {
    let reply: Value = Script::new(lua::CLAIM)
        .arg(&inner.prefix)
        .arg(&inner.owner)
        .arg(client_id)
        .arg(incarnation)
        .arg(owner)
        .arg(if dead { "1" } else { "0" })
        .invoke(con)?;
    let Value::Array(parts) = reply else {
        return Err(records::RecordError::Malformed("claim reply").into());
    };
    let status: i64 = parts
        .first()
        .map(redis::from_redis_value)
        .transpose()?
        .unwrap_or(0);
    match status {
        0 => Ok(Claim::None),
        1 => Ok(Claim::OwnedByAnother),
        _ => {
            let from: String = parts
                .get(1)
                .map(redis::from_redis_value)
                .transpose()?
                .unwrap_or_default();
            let pairs = |v: Option<&Value>| -> Result<HashMap<Vec<u8>, Vec<u8>>, FetchError> {
                let flat: Vec<Vec<u8>> = v
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default();
                Ok(flat
                    .chunks_exact(2)
                    .map(|c| (c[0].clone(), c[1].clone()))
                    .collect())
            };
            let loaded = Loaded {
                fields: pairs(parts.get(2))?,
                bodies: pairs(parts.get(3))?,
            };
            let text = |i: usize| -> Result<String, FetchError> {
                Ok(parts
                    .get(i)
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default())
            };
            let (node, upto) = (text(4)?, text(5)?);
            let settled = (!upto.is_empty()).then_some((node, upto));
            Ok(Claim::Taken {
                from,
                loaded,
                settled,
            })
        }
    }
}

/// Where a claimed session's replay starts, and the releasing node's messages it
/// skips.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume<'a> {
    pub from: &'a str,
    pub settled: Option<&'a (String, String)>,
}

/// Puts the claimed session into the broker at the reader's cut and replays what it
/// missed; whether it joined the broker, or left for another node that asked for it
/// meanwhile (the CONNECT must then not start a new session either).
pub(super) fn install(
    inner: &Inner,
    broker: &Broker,
    con: &mut Connection,
    client_id: &str,
    incarnation: u64,
    resume: Resume<'_>,
    loaded: &Loaded,
) -> Result<bool, FetchError> {
    let f = &inner.fetcher;
    let now = wire::Now::at(broker.now());
    let Some(decoded) = records::decode(client_id, incarnation, loaded, now)? else {
        // Expired while nobody held it: it goes from Redis with this node's end of it.
        inner.adopted(incarnation, &[]);
        inner.record(statehub_broker::SessionChange::Ended {
            incarnation,
            messages: Vec::new(),
            incoming_qos2: Vec::new(),
        });
        return Ok(false);
    };
    // What this node routed so far goes to the stream before the reader's cut is
    // taken, waiting as long as the writer holds (the reader reads on meanwhile); the
    // flush under the cut then goes through a hold with the little routed since
    // (`flush.rs`). Its error, if any, is the second flush's too.
    if !resume.from.is_empty() {
        let _ = flush::flush(&f.writer, &f.hold, Mode::Wait);
    }
    // The reader must be past the entry the owner stopped at, or it would deliver the
    // entries in between a second time; and past the releasing node's last message
    // the session has, or it would deliver that node's messages up to it again.
    let upto = resume.settled.map_or("", |(_, upto)| upto.as_str());
    let cut = reader_past(f, [resume.from, upto]);
    // Another node asked for it since the claim: it goes there (this node's reader
    // applies such requests under the cut, so none comes between this and joining).
    // Released again: the reader's release may have been written before the claim.
    let asked = inner
        .state
        .lock()
        .claiming
        .get(&incarnation)
        .cloned()
        .flatten();
    if let Some(at) = asked {
        inner.released(incarnation, &at, &[], None);
        return Ok(true);
    }
    inner.adopted(incarnation, &decoded.body_ids);
    let held = held_origins(loaded);
    // Before it joins, under the cut: the reader does not deliver it these either.
    inner.held_when_adopted(incarnation, client_id, held.iter().copied());
    let read = cut.last_id.as_deref();
    let joined = broker.adopt_session(decoded.session, || {
        if resume.from.is_empty() {
            return Ok(());
        }
        // Publishers here wait meanwhile: this node's messages routed before the
        // session joined are on the stream once the writer is flushed, and the reader
        // skips them (this node routed them itself), so the replay gives them.
        flush::flush(&f.writer, &f.hold, Mode::ThroughHold)?;
        replay(inner, broker, con, (client_id, &held), resume, read)
    })?;
    if !joined {
        inner.not_joined(incarnation);
    }
    // The replayed messages were promised to their publishers and this node's position
    // mark is past them already: to the writer now, not held back.
    inner.write_held();
    if joined {
        inner.counters.adopted.fetch_add(1, Ordering::Relaxed);
    }
    drop(cut);
    Ok(joined)
}

/// The reader's cut, locked, once the reader is past every entry of `ids` (empty
/// ones aside), or `timeout` passed.
fn reader_past<'a>(f: &'a Fetcher, ids: [&str; 2]) -> parking_lot::MutexGuard<'a, Cut> {
    let deadline = Instant::now() + f.timeout;
    loop {
        let cut = f.cut.lock();
        let behind = ids
            .iter()
            .filter(|id| !id.is_empty())
            .any(|id| match &cut.last_id {
                None => true,
                Some(last) => stream_id(last) < stream_id(id),
            });
        if !behind || Instant::now() >= deadline {
            return cut;
        }
        drop(cut);
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The origins of the messages a claimed session holds, or held and saw acknowledged
/// before its node read their entries back (tombstones): see `origins.rs`.
fn held_origins(loaded: &Loaded) -> HashSet<&[u8]> {
    loaded
        .fields
        .iter()
        .filter_map(|(field, value)| {
            if field.starts_with(b"b:") {
                Some(value.as_slice())
            } else {
                field.strip_prefix(b"o:")
            }
        })
        .collect()
}

/// Routes into `client_id`'s session alone the messages after `resume.from` that it
/// would otherwise miss, but those it has (the releasing node's up to its bound, and
/// every one whose origin it `held`): every one up to the reader's position `read`
/// (the owner had not stored them, the reader already passed them), and past it this
/// node's own (the reader gives the others; none of this node's is appended while it
/// runs). Each is stored under its origin.
fn replay(
    inner: &Inner,
    broker: &Broker,
    con: &mut Connection,
    (client_id, held): (&str, &HashSet<&[u8]>),
    resume: Resume<'_>,
    read: Option<&str>,
) -> Result<(), FetchError> {
    let f = &inner.fetcher;
    let now = wire::Now::at(broker.now());
    let read = read.map(stream_id);
    let settled = resume
        .settled
        .map(|(node, upto)| (node.as_bytes(), stream_id(upto)));
    let mut start = format!("({}", resume.from);
    loop {
        let range: StreamRangeReply = con.xrange_count(&f.feed, &start, "+", REPLAY_BATCH)?;
        let Some(last) = range.ids.last().map(|e| e.id.clone()) else {
            break;
        };
        for entry in &range.ids {
            let field = |name: &str| match entry.map.get(name) {
                Some(Value::BulkString(b)) => Some(b.as_slice()),
                _ => None,
            };
            let ours = field("n") == Some(f.node.as_bytes());
            let id = stream_id(&entry.id);
            let passed = read.is_some_and(|read| id <= read);
            // The releasing node routed its own messages up to `upto` to the session.
            let origin = field("o");
            let had = settled.is_some_and(|(node, upto)| field("n") == Some(node) && id <= upto)
                || origin.is_some_and(|o| held.contains(o));
            if field("t") != Some(b"p") || !(passed || ours) || had {
                continue;
            }
            if let Some(Ok(Some(msg))) = field("m").map(|m| wire::decode(m, now)) {
                let mut named = None;
                let routed = broker.route_replayed(client_id, msg, |copy| {
                    if let Some(origin) = origin {
                        inner.name(copy, origin, ours && !passed);
                        named = Some(copy.clone());
                    }
                });
                if let Some(copy) = named {
                    inner.unname(&copy);
                }
                if routed > 0 {
                    inner.counters.replayed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if range.ids.len() < REPLAY_BATCH {
            break;
        }
        start = format!("({last}");
    }
    Ok(())
}

/// A stream entry id as (milliseconds, sequence), for ordering.
pub(crate) fn stream_id(id: &str) -> (u64, u64) {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}
