//! The writer thread: this node's operations into the stream and its index changes
//! into the index, in the order they were handed over, retried until Redis takes them.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection};
use statehub_webpubsub::{Held, Item};

use crate::{open, Job, Names, Options, Shared, WpsRedisError, BACKOFF, HEARTBEAT};

/// Most jobs written in one round trip.
const BATCH: usize = 256;

/// A job with its operation's sequence number, kept across retries so that an
/// operation written twice is recognised by the readers.
#[derive(Debug)]
enum Pending {
    Op(u64, Vec<u8>),
    Index(String, bool),
}

pub(crate) struct Writer {
    client: Client,
    names: Names,
    shared: Arc<Shared>,
    node: String,
    /// Tells this process's operations from an earlier one's with the same node id.
    incarnation: u64,
    seq: u64,
    stream_len: u64,
    timeout: Duration,
}

impl Writer {
    pub(crate) fn new(
        options: &Options,
        client: Client,
        names: Names,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            client,
            names,
            shared,
            node: options.node.clone(),
            incarnation: rand::random(),
            seq: 0,
            stream_len: options.stream_len.max(1),
            timeout: options.timeout,
        }
    }

    pub(crate) fn spawn(
        self,
        queue: Receiver<Job>,
        held: impl Fn() -> Vec<(String, Held)> + Send + 'static,
    ) -> Result<(), WpsRedisError> {
        // Reach Redis now if it is up, so that broadcasts are taken from the start.
        let mut con = open(&self.client, self.timeout).ok();
        if let Some(c) = con.as_mut() {
            if self.write(c, &[], Some(&held())).is_ok() {
                self.shared.up.store(true, Ordering::Relaxed);
            }
        }
        let synced = self.shared.up.load(Ordering::Relaxed);
        std::thread::Builder::new()
            .name("wps-cluster-writer".into())
            .spawn(move || self.run(&queue, con, !synced, &held))?;
        Ok(())
    }

    fn run(
        mut self,
        queue: &Receiver<Job>,
        mut con: Option<Connection>,
        mut resync: bool,
        held: &dyn Fn() -> Vec<(String, Held)>,
    ) {
        let mut batch: Vec<Pending> = Vec::new();
        let mut logged_down = false;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if batch.is_empty() {
                match queue.recv_timeout(HEARTBEAT) {
                    Ok(job) => batch.push(self.pending(job)),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                while batch.len() < BATCH {
                    match queue.try_recv() {
                        Ok(job) => batch.push(self.pending(job)),
                        Err(_) => break,
                    }
                }
            }
            if self.shared.dirty.swap(false, Ordering::Relaxed) {
                resync = true;
            }
            let attempt = match con.as_mut() {
                Some(c) => Ok(c),
                None => open(&self.client, self.timeout).map(|c| con.insert(c)),
            };
            let written = attempt.map_err(WpsRedisError::from).and_then(|c| {
                let everything = resync.then(held);
                self.write(c, &batch, everything.as_deref())
                    .map(|()| resync = false)
            });
            match written {
                Ok(()) => {
                    batch.clear();
                    self.shared.up.store(true, Ordering::Relaxed);
                    if logged_down {
                        tracing::info!("web pubsub cluster: redis is back");
                        logged_down = false;
                    }
                }
                Err(error) => {
                    self.shared.up.store(false, Ordering::Relaxed);
                    if !logged_down {
                        tracing::warn!(%error, "web pubsub cluster: redis unreachable; sends to other nodes are refused until it is back");
                        logged_down = true;
                    }
                    con = None;
                    resync = true;
                    std::thread::sleep(BACKOFF);
                }
            }
        }
    }

    fn pending(&mut self, job: Job) -> Pending {
        match job {
            Job::Broadcast(op) => {
                self.seq += 1;
                Pending::Op(self.seq, op)
            }
            Job::Index(key, present) => Pending::Index(key, present),
        }
    }

    /// One round trip: the liveness key, the index written again from `everything`
    /// when given (all this node holds), then the batch.
    fn write(
        &self,
        con: &mut Connection,
        batch: &[Pending],
        everything: Option<&[(String, Held)]>,
    ) -> Result<(), WpsRedisError> {
        let registry = self.names.registry(&self.node);
        let mut pipe = redis::pipe();
        let keep = u64::try_from((HEARTBEAT * 3).as_millis()).unwrap_or(u64::MAX);
        pipe.cmd("SET")
            .arg(self.names.alive(&self.node))
            .arg(1)
            .arg("PX")
            .arg(keep)
            .ignore();
        if let Some(everything) = everything {
            let written: Vec<String> = redis::cmd("SMEMBERS").arg(&registry).query(con)?;
            for key in &written {
                pipe.cmd("SREM").arg(key).arg(&self.node).ignore();
            }
            pipe.cmd("DEL").arg(&registry).ignore();
            for (hub, held) in everything {
                let items = (held.connections.iter().map(|c| Item::Connection(c)))
                    .chain(held.users.iter().map(|u| Item::User(u)))
                    .chain(held.groups.iter().map(|g| Item::Group(g)));
                for item in items {
                    self.index(&mut pipe, &registry, &self.names.item(hub, item), true);
                }
            }
        }
        for job in batch {
            match job {
                Pending::Op(seq, op) => {
                    pipe.cmd("XADD")
                        .arg(&self.names.ops)
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(self.stream_len)
                        .arg("*")
                        .arg("n")
                        .arg(&self.node)
                        .arg("r")
                        .arg(self.incarnation)
                        .arg("s")
                        .arg(*seq)
                        .arg("o")
                        .arg(op.as_slice())
                        .ignore();
                }
                Pending::Index(key, present) => self.index(&mut pipe, &registry, key, *present),
            }
        }
        pipe.query::<()>(con)?;
        Ok(())
    }

    fn index(&self, pipe: &mut redis::Pipeline, registry: &str, key: &str, present: bool) {
        let verb = if present { "SADD" } else { "SREM" };
        pipe.cmd(verb).arg(key).arg(&self.node).ignore();
        pipe.cmd(verb).arg(registry).arg(key).ignore();
    }
}
