//! The writer: one thread appends what this node tells the cluster, in the order it is
//! told, a batch per Redis round trip (one pipeline), and answers each message's
//! publisher once Redis has it. With `wait_replicas`, a batch that someone waits for
//! ends with `WAIT`, and its messages and retained changes are refused (0x80) when
//! fewer replicas have them: they are on the primary, and may be lost in a failover.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, Connection, Pipeline, RedisResult, Value};
use statehub_broker::FabricError;
use statehub_redis_common::{ShortfallLog, Wait};
use tokio::sync::oneshot;

use crate::append::{self, Appends};
use crate::lag::Lag;
use crate::retain::Backlog;
use crate::{Options, Shared};

/// Most commands in one pipeline.
const BATCH: usize = 256;
/// How often an idle writer checks that Redis answers (and writes what is pending).
const RETRY: Duration = Duration::from_millis(250);
/// How often a writer held back by a slow reader asks again how far it is.
const HOLD_POLL: Duration = Duration::from_millis(5);

type Reply = oneshot::Sender<Result<(), FabricError>>;

/// What the writer is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    /// Append a message (encoded by `wire`) with its shared-group picks and its
    /// origin (see `sessions/origins.rs`); a retained one with its topic's change
    /// (`retained`: whether it sets, not clears, the retained message), which the
    /// same script writes to the retained hash.
    Publish {
        msg: Vec<u8>,
        picks: Vec<u8>,
        origin: Vec<u8>,
        retained: Option<(String, bool)>,
        reply: Reply,
    },
    /// Append a client id that connected here (`resumed`: without Clean Start).
    Announce {
        client: String,
        resumed: bool,
        reply: Reply,
    },
    /// Write this node's shared groups as they are now.
    Groups,
    /// Answered once every command before it was written (or failed); with
    /// `through_hold`, those are written even while the writer holds (`flush.rs`).
    Flush {
        reply: crate::flush::FlushReply,
        through_hold: bool,
    },
}

pub(crate) struct Writer {
    client: Client,
    shared: Arc<Shared>,
    timeout: Duration,
    stream_len: u64,
    rx: Receiver<Command>,
    connection: Option<Connection>,
    /// This node's groups are to be written (at start: whatever a previous run with the
    /// same node id left is replaced).
    groups_dirty: bool,
    down_logged: bool,
    wait_replicas: u32,
    wait_timeout: Duration,
    /// Batches fewer replicas acknowledged than asked, logged now and then.
    shortfalls: ShortfallLog,
    /// How far behind the nodes' readers are.
    lag: Lag,
    node_ttl: Duration,
    /// When a hold was last logged.
    hold_logged: Option<Instant>,
    /// Retained changes of failed batches, written first once Redis answers again.
    backlog: Backlog,
}

impl Writer {
    pub(crate) fn new(
        client: Client,
        shared: Arc<Shared>,
        options: &Options,
        rx: Receiver<Command>,
    ) -> Self {
        Self {
            client,
            shared,
            timeout: options.timeout,
            stream_len: options.stream_len,
            rx,
            connection: None,
            groups_dirty: true,
            down_logged: false,
            wait_replicas: options.wait_replicas,
            wait_timeout: options.wait_timeout,
            shortfalls: ShortfallLog::default(),
            lag: Lag::new(options.reader_lag_limit),
            node_ttl: options.node_ttl,
            hold_logged: None,
            backlog: Backlog::new(options.queue),
        }
    }

    /// Runs until every sender is gone.
    pub(crate) fn run(mut self) {
        loop {
            match self.rx.recv_timeout(RETRY) {
                Ok(first) => {
                    let hold = &self.shared.hold;
                    if self.lag.room() == 0 && appends(&first) && !hold.urgent() {
                        self.hold();
                    }
                    let most = if self.shared.hold.urgent() {
                        BATCH
                    } else {
                        self.lag.room().clamp(1, BATCH)
                    };
                    let mut batch = vec![first];
                    while batch.len() < most {
                        match self.rx.try_recv() {
                            Ok(c) => batch.push(c),
                            Err(_) => break,
                        }
                    }
                    self.write(batch);
                }
                // Idle: a PING keeps `available` true to Redis, so that a PUBLISH is
                // refused before it is delivered anywhere rather than after.
                Err(RecvTimeoutError::Timeout) => self.write(Vec::new()),
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn write(&mut self, batch: Vec<Command>) {
        let mut pipe = redis::pipe();
        pipe.cmd("PING");
        let groups = self.groups_dirty || batch.iter().any(|c| matches!(c, Command::Groups));
        let encoded_groups = groups.then(|| self.shared.groups.local_encoded());
        // Before this batch's changes, which are newer.
        let backlog = !self.backlog.is_empty();
        let (keys, node) = (&self.shared.keys, &*self.shared.node);
        self.backlog.add_to(&mut pipe, keys, node, self.stream_len);
        let mut appends = Appends::default();
        for command in &batch {
            self.add(command, &mut appends);
        }
        if let Some(encoded) = &encoded_groups {
            let node = &*self.shared.node;
            pipe.hset(&self.shared.keys.groups, node, encoded).ignore();
            appends.push(vec![b"n", node.as_bytes(), b"t", b"g"]);
        }
        appends.flush(&mut pipe, &self.shared.keys, self.stream_len);
        // Before the WAIT, whose reply comes last.
        let others = self.reader_keys();
        self.lag.probe(&mut pipe, &self.shared.keys.seq, &others);
        let wait =
            self.wait_replicas > 0 && batch.iter().any(|c| matches!(c, Command::Publish { .. }));
        if wait {
            Wait {
                replicas: self.wait_replicas,
                timeout: self.wait_timeout,
            }
            .add_to(&mut pipe);
        }
        match self.query(&pipe, wait) {
            Ok(replicas) => {
                self.shared.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.groups_dirty &= !groups;
                self.set_available(true, None);
                self.retained_written(&batch, backlog, true);
                let replicated = self.replicated(replicas);
                self.done(batch, &Ok(()), &replicated);
            }
            Err(e) => {
                self.shared
                    .counters
                    .write_errors
                    .fetch_add(1, Ordering::Relaxed);
                self.connection = None;
                self.groups_dirty |= groups;
                let reason: Arc<str> = Arc::from(e.to_string());
                self.set_available(false, Some(&reason));
                self.retained_written(&batch, backlog, false);
                let failed = Err(FabricError::Unavailable(reason));
                self.done(batch, &failed, &failed);
            }
        }
    }

    /// Waits while a live node's reader is at the lag limit, asking Redis how far
    /// the readers are every [`HOLD_POLL`]. Bounded: a reader that makes no progress
    /// stops being waited for once its position lapses (the node TTL). A flush that
    /// must go through a hold ends it (`flush.rs`).
    fn hold(&mut self) {
        let start = Instant::now();
        let shared = self.shared.clone();
        shared.hold.set_held(true);
        shared.counters.held.fetch_add(1, Ordering::Relaxed);
        let log = self
            .hold_logged
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10));
        if log {
            self.hold_logged = Some(start);
            tracing::warn!(
                behind = self.lag.behind(),
                "mqtt cluster: a node's reader is at mqtt_reader_lag_limit; publishers wait"
            );
        }
        // Past the node TTL the slow reader's position has lapsed, or it is moving.
        let bound = start + self.node_ttl * 2 + self.timeout;
        while self.lag.room() == 0 && !shared.hold.urgent() && Instant::now() < bound {
            std::thread::sleep(HOLD_POLL);
            let mut pipe = redis::pipe();
            pipe.cmd("PING");
            let others = self.reader_keys();
            self.lag.probe(&mut pipe, &self.shared.keys.seq, &others);
            if self.query(&pipe, false).is_err() {
                self.connection = None;
                break;
            }
        }
        shared.hold.set_held(false);
        let waited = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        shared.counters.held_ms.fetch_add(waited, Ordering::Relaxed);
    }

    /// Accounts for the retained changes of a batch (and of the backlog, if `backlog`
    /// went with it): written (the reader reads them back), or kept in the backlog
    /// for the next attempt.
    fn retained_written(&mut self, batch: &[Command], backlog: bool, ok: bool) {
        let (own, counters) = (&self.shared.own_retained, &self.shared.counters);
        if ok {
            if backlog {
                self.backlog.written(counters);
            }
            return;
        }
        for command in batch {
            if let Command::Publish {
                msg,
                retained: Some((topic, set)),
                ..
            } = command
            {
                let value = set.then_some(msg);
                self.backlog.keep((topic, value), own, counters);
            }
        }
    }

    /// The position keys of every node's reader, this node's own included: its reader
    /// skips its own entries, but they would push the others' it has not read out of
    /// the stream.
    fn reader_keys(&self) -> Vec<String> {
        let keys = &self.shared.keys;
        let mut positions = vec![keys.read_position(&self.shared.node)];
        positions
            .extend((self.shared.groups.other_nodes().iter()).map(|node| keys.read_position(node)));
        positions
    }

    /// `Err` (counted, logged at most every 10 s) if fewer replicas than asked
    /// acknowledged the batch.
    fn replicated(&mut self, replicas: Option<u32>) -> Result<(), FabricError> {
        match replicas {
            Some(acked) if acked < self.wait_replicas => {
                let reason = format!(
                    "redis WAIT: {acked} of {} replicas acknowledged within {:?}",
                    self.wait_replicas, self.wait_timeout
                );
                let counter = &self.shared.counters.not_replicated;
                if let Some(batches) = self.shortfalls.count(counter) {
                    tracing::warn!(
                        reason,
                        batches,
                        "mqtt cluster: messages not acknowledged by enough redis replicas; QoS 1/2 PUBLISHes refused with 0x80"
                    );
                }
                Err(FabricError::Unavailable(Arc::from(reason)))
            }
            _ => Ok(()),
        }
    }

    /// Adds `command`'s stream entry (if any) to `appends`.
    fn add<'a>(&'a self, command: &'a Command, appends: &mut Appends<'a>) {
        let node = self.shared.node.as_bytes();
        match command {
            Command::Publish {
                msg,
                picks,
                origin,
                retained,
                ..
            } => {
                let mut fields = vec![b"n", node, b"t", b"p", b"m", msg, b"s", picks, b"o", origin];
                if let Some((topic, set)) = retained {
                    let change: &[u8] = if *set { b"rs" } else { b"rc" };
                    fields.extend([change, topic.as_bytes()]);
                }
                appends.push(fields);
            }
            Command::Announce {
                client, resumed, ..
            } => {
                let resumed: &[u8] = if *resumed { b"1" } else { b"0" };
                appends.push(vec![
                    b"n",
                    node,
                    b"t",
                    b"k",
                    b"c",
                    client.as_bytes(),
                    b"r",
                    resumed,
                ]);
            }
            Command::Groups | Command::Flush { .. } => {}
        }
    }

    /// Runs the pipeline (the lag probe's replies go to `lag`); with `wait`, how many
    /// replicas acknowledged it.
    fn query(&mut self, pipe: &Pipeline, wait: bool) -> RedisResult<Option<u32>> {
        if self.connection.is_none() {
            let mut con = open(&self.client, self.timeout)?;
            redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(append::SCRIPT)
                .query::<String>(&mut con)?;
            self.connection = Some(con);
        }
        let Some(con) = self.connection.as_mut() else {
            return Ok(None);
        };
        let mut replies = pipe.query::<Vec<Value>>(con)?.into_iter();
        // The PING's.
        replies.next();
        self.lag.observe(&mut replies);
        if !wait {
            return Ok(None);
        }
        let replicas = replies.next_back().map(|v| redis::from_redis_value(&v));
        replicas.transpose()
    }

    /// Answers the batch's publishers; an announcement that was not appended is
    /// forgotten, so it holds back no takeover. `replicated` answers messages and
    /// retained changes: `result`, or too few replicas.
    fn done(
        &self,
        batch: Vec<Command>,
        result: &Result<(), FabricError>,
        replicated: &Result<(), FabricError>,
    ) {
        let counters = &self.shared.counters;
        for command in batch {
            match command {
                Command::Publish { reply, .. } => {
                    if result.is_ok() {
                        counters.forwarded.fetch_add(1, Ordering::Relaxed);
                    }
                    // Nobody waits for a QoS 0 message: one that failed is counted.
                    if reply.send(replicated.clone()).is_err() && result.is_err() {
                        counters.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Command::Announce { client, reply, .. } => {
                    if result.is_err() {
                        self.shared.announced(&client);
                    }
                    let _ = reply.send(result.clone());
                }
                Command::Flush {
                    reply,
                    through_hold,
                } => {
                    let _ = reply.send(result.clone());
                    if through_hold {
                        self.shared.hold.served();
                    }
                }
                Command::Groups => {}
            }
        }
    }

    fn set_available(&mut self, up: bool, reason: Option<&str>) {
        let was = self.shared.available.swap(up, Ordering::Relaxed);
        if up && (!was || self.down_logged) {
            if self.down_logged {
                tracing::info!("mqtt cluster: redis is back; forwarding again");
            }
            self.down_logged = false;
        } else if !up && !self.down_logged {
            tracing::warn!(
                reason = reason.unwrap_or(""),
                "mqtt cluster: redis out of reach; QoS 1/2 PUBLISHes are refused, QoS 0 ones reach this node's subscribers only"
            );
            self.down_logged = true;
        }
    }
}

/// Whether a command appends to the stream.
fn appends(command: &Command) -> bool {
    matches!(command, Command::Publish { .. } | Command::Announce { .. })
}

/// A connection whose every read and write is bounded by `timeout`.
pub(crate) fn open(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let connection = client.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    Ok(connection)
}
