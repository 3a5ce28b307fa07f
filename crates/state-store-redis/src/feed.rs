//! The change feed: every node reads the store's stream of changes and notifies its own
//! observers of each.
//!
//! Why it is exactly once and in order: the scripts append a change to one stream in the
//! order Redis runs them, which is the order of their versions (the same scripts advance
//! the clock). A node reads that stream from one thread, strictly after the last entry
//! it read, so it sees each entry once, in stream order, and hands it on in that order.
//! Each entry also carries a sequence number one above the previous entry's: an observer
//! is told only of changes numbered after the one current when it began observing
//! ([`statehub_state_store::Engine::observe_key`]).
//!
//! Reconnects: the reader keeps the id of the last entry it read; when Redis comes back
//! it reads on from there, so nothing fed meanwhile is lost or repeated, as long as the
//! stream still holds it. The stream is trimmed to about [`crate::Options::feed_len`]
//! entries; a reader that fell further behind sees a gap in the sequence numbers, logs
//! how many changes it missed and counts them ([`FeedCounters::lost`]). If Redis lost its
//! data (a restart without persistence) the numbers start again: logged, and read on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use redis::streams::{StreamId, StreamRangeReply, StreamReadOptions, StreamReadReply};
use redis::{Client, Commands, Connection, Value};
use statehub_state_store::{Change, Hlc};

use crate::{conn, Options, RedisEngineError, RECONNECT_BACKOFF};

/// How long one read blocks waiting for changes, so that a stop is seen this often.
const BLOCK: Duration = Duration::from_millis(500);
/// Most entries one read takes.
const BATCH: usize = 256;

/// What a node's change feed counted.
#[derive(Debug, Default)]
pub struct FeedCounters {
    /// Changes read from the stream and handed on (every node's).
    pub applied: AtomicU64,
    /// Changes trimmed from the stream before this node read them (their
    /// notifications lost).
    pub lost: AtomicU64,
    /// Reads that failed (the feed reconnects and reads on).
    pub read_errors: AtomicU64,
    /// How far behind the feed was, in milliseconds: the age of the last change of a
    /// read that filled its batch (more were waiting), 0 after a read that did not.
    pub lag_ms: AtomicU64,
    /// The last read (or attempt to connect) reached Redis.
    pub up: AtomicBool,
}

/// Reads the store's change feed (see the module docs). Run [`ChangeFeed::run`] on a
/// thread of its own.
#[derive(Debug)]
pub struct ChangeFeed {
    client: Client,
    events: Vec<u8>,
    version_node: Arc<str>,
    timeout: Duration,
    /// The id of the last entry read; `None` until the first connection, which starts at
    /// the stream's end (no observer exists before then).
    last_id: Option<String>,
    last_seq: Option<u64>,
    counters: Arc<FeedCounters>,
}

impl ChangeFeed {
    pub(crate) fn open(options: &Options, events: &[u8]) -> Result<Self, RedisEngineError> {
        Ok(Self {
            client: Client::open(options.url.as_str())?,
            events: events.to_vec(),
            version_node: Arc::from(options.version_node_id.as_str()),
            timeout: options.timeout,
            last_id: None,
            last_seq: None,
            counters: Arc::default(),
        })
    }

    /// What it counted.
    pub fn counters(&self) -> Arc<FeedCounters> {
        self.counters.clone()
    }

    /// Connects to Redis and positions the feed at the stream's end, once: call it
    /// before any observer registers, so that no change is missed. Fails if Redis is
    /// out of reach (then [`ChangeFeed::run`] positions itself when it first connects).
    pub fn start(&mut self) -> Result<(), RedisEngineError> {
        let mut connection = conn::open(&self.client, self.timeout)?;
        self.position(&mut connection)?;
        self.counters.up.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Hands every change to `apply`, in feed order, until `stop` is set. Reconnects
    /// (every [`RECONNECT_BACKOFF`]) while Redis is out of reach.
    pub fn run(mut self, stop: &AtomicBool, mut apply: impl FnMut(Change)) {
        let mut connection: Option<Connection> = None;
        let mut logged_down = false;
        while !stop.load(Ordering::Relaxed) {
            let con = match connection.as_mut() {
                Some(con) => con,
                None => match conn::open(&self.client, self.timeout + BLOCK) {
                    Ok(con) => {
                        if logged_down {
                            tracing::info!("state store change feed: redis is back");
                            logged_down = false;
                        }
                        connection.insert(con)
                    }
                    Err(error) => {
                        self.counters.up.store(false, Ordering::Relaxed);
                        if !logged_down {
                            tracing::warn!(%error, "state store change feed: redis unreachable; retrying");
                            logged_down = true;
                        }
                        std::thread::sleep(RECONNECT_BACKOFF);
                        continue;
                    }
                },
            };
            let read = self.read(con, &mut apply);
            self.counters.up.store(read.is_ok(), Ordering::Relaxed);
            if let Err(error) = read {
                self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                if !logged_down {
                    tracing::warn!(%error, "state store change feed: read failed; reconnecting");
                    logged_down = true;
                }
                connection = None;
                std::thread::sleep(RECONNECT_BACKOFF);
            }
        }
    }

    fn position(&mut self, con: &mut Connection) -> Result<(), RedisEngineError> {
        if self.last_id.is_some() {
            return Ok(());
        }
        let last: StreamRangeReply = con.xrevrange_count(&self.events, "+", "-", 1)?;
        let (id, seq) = match last.ids.first() {
            Some(entry) => (entry.id.clone(), Some(seq_of(entry)?)),
            None => ("0-0".to_owned(), None),
        };
        self.last_id = Some(id);
        self.last_seq = seq;
        Ok(())
    }

    /// One blocking read; applies what it got.
    fn read(
        &mut self,
        con: &mut Connection,
        apply: &mut impl FnMut(Change),
    ) -> Result<(), RedisEngineError> {
        self.position(con)?;
        let last_id = self.last_id.clone().unwrap_or_else(|| "0-0".to_owned());
        let options = StreamReadOptions::default()
            .block(usize::try_from(BLOCK.as_millis()).unwrap_or(usize::MAX))
            .count(BATCH);
        let reply: Option<StreamReadReply> =
            con.xread_options(&[&self.events], &[&last_id], &options)?;
        let mut read = 0;
        for key in reply.map(|r| r.keys).unwrap_or_default() {
            read += key.ids.len();
            if let Some(last) = key.ids.last().filter(|_| read >= BATCH) {
                self.counters.lag_ms.store(
                    statehub_redis_common::stream_age_ms(&last.id),
                    Ordering::Relaxed,
                );
            }
            for entry in key.ids {
                let change = self.change(&entry)?;
                self.check_sequence(change.seq);
                self.last_id = Some(entry.id);
                apply(change);
                self.counters.applied.fetch_add(1, Ordering::Relaxed);
            }
        }
        if read < BATCH {
            self.counters.lag_ms.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    fn check_sequence(&mut self, seq: u64) {
        match self.last_seq {
            Some(last) if seq > last + 1 => {
                let missed = seq - last - 1;
                self.counters.lost.fetch_add(missed, Ordering::Relaxed);
                tracing::warn!(
                    missed,
                    "state store change feed: changes trimmed before this node read them; their notifications are lost"
                );
            }
            Some(last) if seq <= last => {
                tracing::warn!(
                    seq,
                    last,
                    "state store change feed: numbering restarted (redis lost its data?)"
                );
            }
            _ => {}
        }
        self.last_seq = Some(seq);
    }

    fn change(&self, entry: &StreamId) -> Result<Change, RedisEngineError> {
        let field = |name: &str| match entry.map.get(name) {
            Some(Value::BulkString(bytes)) => Some(bytes.clone()),
            _ => None,
        };
        let number = |name: &str| -> Result<u64, RedisEngineError> {
            field(name)
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.parse().ok())
                .ok_or(RedisEngineError::Corrupt("change feed entry"))
        };
        Ok(Change {
            seq: number("s")?,
            key: Bytes::from(field("k").ok_or(RedisEngineError::Corrupt("change feed key"))?),
            value: field("v").map(Bytes::from),
            version: Hlc::new(number("w")?, number("c")?, self.version_node.clone()),
        })
    }
}

fn seq_of(entry: &StreamId) -> Result<u64, RedisEngineError> {
    match entry.map.get("s") {
        Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(RedisEngineError::Corrupt("change feed entry")),
        _ => Err(RedisEngineError::Corrupt("change feed entry")),
    }
}
