//! The writer: one thread appends what this node tells the cluster, in the order it is
//! told, a batch per Redis round trip (one pipeline), and answers each message's
//! publisher once Redis has it. With `wait_replicas`, a batch that someone waits for
//! ends with `WAIT`, and its messages and retained changes are refused (0x80) when
//! fewer replicas have them: they are on the primary, and may be lost in a failover.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection, Pipeline, RedisResult};
use statehub_broker::FabricError;
use statehub_redis_common::ShortfallLog;
use tokio::sync::oneshot;

use crate::{Options, Shared};

/// Most commands in one pipeline.
const BATCH: usize = 256;
/// How often an idle writer checks that Redis answers (and writes what is pending).
const RETRY: Duration = Duration::from_millis(250);

type Reply = oneshot::Sender<Result<(), FabricError>>;

/// What the writer is asked to do.
#[derive(Debug)]
pub(crate) enum Command {
    /// Append a message (encoded by `wire`) with its shared-group picks and its
    /// origin (see `sessions/origins.rs`).
    Publish {
        msg: Vec<u8>,
        picks: Vec<u8>,
        origin: Vec<u8>,
        reply: Reply,
    },
    /// Set (or, without a value, clear) a topic's retained message.
    Retain {
        topic: String,
        value: Option<Vec<u8>>,
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
    /// Answered once every command before it was written (or failed).
    Flush { reply: Reply },
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
        }
    }

    /// Runs until every sender is gone.
    pub(crate) fn run(mut self) {
        loop {
            match self.rx.recv_timeout(RETRY) {
                Ok(first) => {
                    let mut batch = vec![first];
                    while batch.len() < BATCH {
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
        for command in &batch {
            self.add(&mut pipe, command);
        }
        let groups = self.groups_dirty || batch.iter().any(|c| matches!(c, Command::Groups));
        if groups {
            self.add_groups(&mut pipe);
        }
        let wait = self.wait_replicas > 0
            && batch
                .iter()
                .any(|c| matches!(c, Command::Publish { .. } | Command::Retain { .. }));
        if wait {
            let millis = u64::try_from(self.wait_timeout.as_millis()).unwrap_or(u64::MAX);
            pipe.cmd("WAIT").arg(self.wait_replicas).arg(millis.max(1));
        }
        match self.query(&pipe, wait) {
            Ok(replicas) => {
                self.shared.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.groups_dirty &= !groups;
                self.set_available(true, None);
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
                let failed = Err(FabricError::Unavailable(reason));
                self.done(batch, &failed, &failed);
            }
        }
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

    fn add(&self, pipe: &mut Pipeline, command: &Command) {
        let keys = &self.shared.keys;
        let node = &*self.shared.node;
        match command {
            Command::Publish {
                msg, picks, origin, ..
            } => {
                self.xadd(pipe)
                    .arg(&["n", node, "t", "p"])
                    .arg("m")
                    .arg(msg)
                    .arg("s")
                    .arg(picks)
                    .arg("o")
                    .arg(origin)
                    .ignore();
            }
            Command::Retain { topic, value, .. } => {
                match value {
                    Some(value) => pipe.hset(&keys.retained, topic, value).ignore(),
                    None => pipe.hdel(&keys.retained, topic).ignore(),
                };
            }
            Command::Announce {
                client, resumed, ..
            } => {
                let resumed = if *resumed { "1" } else { "0" };
                self.xadd(pipe)
                    .arg(&["n", node, "t", "k", "c", client, "r", resumed])
                    .ignore();
            }
            Command::Groups | Command::Flush { .. } => {}
        }
    }

    fn add_groups(&self, pipe: &mut Pipeline) {
        let keys = &self.shared.keys;
        let node = &*self.shared.node;
        pipe.hset(&keys.groups, node, self.shared.groups.local_encoded())
            .ignore();
        self.xadd(pipe).arg(&["n", node, "t", "g"]).ignore();
    }

    fn xadd<'p>(&self, pipe: &'p mut Pipeline) -> &'p mut Pipeline {
        pipe.cmd("XADD")
            .arg(&self.shared.keys.feed)
            .arg("MAXLEN")
            .arg("~")
            .arg(self.stream_len)
            .arg("*")
    }

    /// Runs the pipeline; with `wait`, how many replicas acknowledged it.
    fn query(&mut self, pipe: &Pipeline, wait: bool) -> RedisResult<Option<u32>> {
        if self.connection.is_none() {
            self.connection = Some(open(&self.client, self.timeout)?);
        }
        match self.connection.as_mut() {
            Some(con) if wait => pipe
                .query::<(redis::Value, u32)>(con)
                .map(|(_, replicas)| Some(replicas)),
            Some(con) => pipe.query::<()>(con).map(|()| None),
            None => Ok(None),
        }
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
                Command::Retain { reply, .. } => {
                    let _ = reply.send(replicated.clone());
                }
                Command::Announce { client, reply, .. } => {
                    if result.is_err() {
                        self.shared.announced(&client);
                    }
                    let _ = reply.send(result.clone());
                }
                Command::Flush { reply } => {
                    let _ = reply.send(result.clone());
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

/// A connection whose every read and write is bounded by `timeout`.
pub(crate) fn open(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let connection = client.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    Ok(connection)
}
