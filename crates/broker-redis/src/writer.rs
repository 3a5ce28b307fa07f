//! The writer: one thread appends what this node tells the cluster, in the order it is
//! told, a batch per Redis round trip (one pipeline), and answers each message's
//! publisher once Redis has it.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection, Pipeline, RedisResult};
use statehub_broker::FabricError;
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
    /// Append a message (encoded by `wire`) with its shared-group picks.
    Publish {
        msg: Vec<u8>,
        picks: Vec<u8>,
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
        match self.query(&pipe) {
            Ok(()) => {
                self.groups_dirty &= !groups;
                self.set_available(true, None);
                self.done(batch, &Ok(()));
            }
            Err(e) => {
                self.connection = None;
                self.groups_dirty |= groups;
                let reason: Arc<str> = Arc::from(e.to_string());
                self.set_available(false, Some(&reason));
                self.done(batch, &Err(FabricError::Unavailable(reason)));
            }
        }
    }

    fn add(&self, pipe: &mut Pipeline, command: &Command) {
        let keys = &self.shared.keys;
        let node = &*self.shared.node;
        match command {
            Command::Publish { msg, picks, .. } => {
                self.xadd(pipe)
                    .arg(&["n", node, "t", "p"])
                    .arg("m")
                    .arg(msg)
                    .arg("s")
                    .arg(picks)
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
            Command::Groups => {}
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

    fn query(&mut self, pipe: &Pipeline) -> RedisResult<()> {
        if self.connection.is_none() {
            self.connection = Some(open(&self.client, self.timeout)?);
        }
        match self.connection.as_mut() {
            Some(con) => pipe.query::<()>(con),
            None => Ok(()),
        }
    }

    /// Answers the batch's publishers; an announcement that was not appended is
    /// forgotten, so it holds back no takeover.
    fn done(&self, batch: Vec<Command>, result: &Result<(), FabricError>) {
        let counters = &self.shared.counters;
        for command in batch {
            match command {
                Command::Publish { reply, .. } => {
                    if result.is_ok() {
                        counters.forwarded.fetch_add(1, Ordering::Relaxed);
                    }
                    // Nobody waits for a QoS 0 message: one that failed is counted.
                    if reply.send(result.clone()).is_err() && result.is_err() {
                        counters.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Command::Retain { reply, .. } => {
                    let _ = reply.send(result.clone());
                }
                Command::Announce { client, reply, .. } => {
                    if result.is_err() {
                        self.shared.announced(&client);
                    }
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
