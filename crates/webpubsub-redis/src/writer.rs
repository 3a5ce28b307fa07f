//! The writer thread: this node's operations into the stream, its reliable sessions'
//! changes into their mirror and its answers to other nodes' questions, in the order
//! they were handed over, retried until Redis takes them. With `Options::wait`, a
//! pipeline holding an operation (which a REST answer or an ack waits for) or a
//! reliable session's write ends with `WAIT`, and so does a claim: too few replicas and
//! the operations waiting are refused as when Redis is out of reach (what was written
//! stays written: it is on the primary), and the session writes are not published as
//! mirrored until a later `WAIT` covers them, so their frames stay held. What a
//! pipeline writes for the mirrored sessions, fenced, is in `writer/fenced.rs`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, Connection};
use statehub_redis_common::{ShortfallLog, Wait};
use statehub_webpubsub::{ClaimError, SessionWrite, WebPubSub};

use crate::ask::push_answer;
use crate::held::HeldCheck;
use crate::liveness::{add_liveness, PRUNE_EVERY};
use crate::replicas::{query_claim, query_waiting};
use crate::session::{parse_claim, Scripts};
use crate::streams::Attached;
use crate::{
    lock, open, ClaimJob, ClaimRecord, Job, Names, Options, Shared, Unreplicated, WpsRedisError,
    BACKOFF, HEARTBEAT,
};

mod fenced;

/// Most jobs written in one round trip.
const BATCH: usize = 1024;

/// A job with its operation's sequence number, kept across retries so that an
/// operation written twice is recognised by the readers.
#[derive(Debug)]
enum Pending {
    Op(u64, Vec<u8>, Option<Box<Attached>>),
    Answer(String, Vec<u8>),
    Flush(std::sync::mpsc::SyncSender<()>),
    Session(String, String, SessionWrite, u64),
    Position(String),
    /// Always the last of a batch: it is answered once the batch before it is written.
    Claim(Box<ClaimJob>),
    Held(Box<HeldCheck>),
}

pub(crate) struct Writer {
    client: Client,
    names: Names,
    shared: Arc<Shared>,
    node: String,
    stream_len: u64,
    timeout: Duration,
    scripts: Scripts,
    /// The epoch of every mirrored session this node owns, by (hub, id).
    epochs: HashMap<(String, String), u64>,
    /// The reader's last position, as queued, and whether it is written.
    position: String,
    position_written: bool,
    /// When the owned sessions' keys were last refreshed.
    refreshed: Instant,
    /// When the node list was last pruned.
    pruned: Instant,
    /// Sessions already marked lost in Redis.
    marked: std::collections::HashSet<(String, String)>,
    /// The replicas an acknowledgement waits for.
    wait: Option<Wait>,
    shortfalls: ShortfallLog,
    /// The last operation written that too few replicas acknowledged: the next
    /// pipeline waits for replicas even without operations of its own.
    unreplicated: Option<u64>,
    /// The last session write written that too few replicas acknowledged: its frames
    /// stay held, and the next pipeline waits for replicas even without writes.
    unmirrored: Option<u64>,
    /// The service, told of sessions claimed elsewhere (set when the thread starts).
    service: Option<WebPubSub>,
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
            stream_len: options.stream_len.max(1),
            timeout: options.timeout,
            scripts: Scripts::new(),
            epochs: HashMap::new(),
            position: "0-0".into(),
            position_written: true,
            refreshed: Instant::now(),
            pruned: Instant::now(),
            marked: std::collections::HashSet::new(),
            wait: options.wait,
            shortfalls: ShortfallLog::default(),
            unreplicated: None,
            unmirrored: None,
            service: None,
        }
    }

    /// `node:incarnation`, as a session's owner is recorded.
    fn owner(&self) -> String {
        format!("{}:{}", self.node, self.shared.incarnation)
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.shared.session_ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    pub(crate) fn spawn(
        mut self,
        queue: Receiver<Job>,
        service: WebPubSub,
    ) -> Result<(), WpsRedisError> {
        self.service = Some(service);
        // Reach Redis now if it is up, so that broadcasts are taken from the start.
        let mut con = open(&self.client, self.timeout).ok();
        if let Some(c) = con.as_mut() {
            if self.scripts.load(c).is_ok() && self.write(c, &mut Vec::new()).is_ok() {
                self.shared.up.store(true, Ordering::Relaxed);
            }
        }
        std::thread::Builder::new()
            .name("wps-cluster-writer".into())
            .spawn(move || self.run(&queue, con))?;
        Ok(())
    }

    fn run(mut self, queue: &Receiver<Job>, mut con: Option<Connection>) {
        let mut batch: Vec<Pending> = Vec::new();
        let mut logged_down = false;
        while !self.shared.stop.load(Ordering::Relaxed) {
            if batch.is_empty() {
                match queue.recv_timeout(HEARTBEAT) {
                    Ok(job) => batch.push(Self::pending(job)),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                while batch.len() < BATCH && !matches!(batch.last(), Some(Pending::Claim(_))) {
                    match queue.try_recv() {
                        Ok(job) => batch.push(Self::pending(job)),
                        Err(_) => break,
                    }
                }
            }
            let attempt = match con.as_mut() {
                Some(c) => Ok(c),
                None => open(&self.client, self.timeout).and_then(|mut c| {
                    self.scripts.load(&mut c)?;
                    Ok(con.insert(c))
                }),
            };
            let written = attempt
                .map_err(WpsRedisError::from)
                .and_then(|c| self.write(c, &mut batch));
            let counters = &self.shared.counters;
            match written {
                Ok(()) => {
                    counters.pipelines.fetch_add(1, Ordering::Relaxed);
                    batch.clear();
                    self.shared.up.store(true, Ordering::Relaxed);
                    if logged_down {
                        tracing::info!("web pubsub cluster: redis is back");
                        logged_down = false;
                    }
                }
                Err(error) => {
                    counters.write_errors.fetch_add(1, Ordering::Relaxed);
                    self.shared.up.store(false, Ordering::Relaxed);
                    self.shared.progress.send_modify(|p| p.failures += 1);
                    if !logged_down {
                        tracing::warn!(%error, "web pubsub cluster: redis unreachable; sends to other nodes are refused until it is back");
                        logged_down = true;
                    }
                    con = None;
                    std::thread::sleep(BACKOFF);
                }
            }
        }
    }

    fn pending(job: Job) -> Pending {
        match job {
            Job::Broadcast(seq, op, attached) => Pending::Op(seq, op, attached),
            Job::Answer(key, entry) => Pending::Answer(key, entry),
            Job::Flush(done) => Pending::Flush(done),
            Job::Session(hub, id, write, ticket) => Pending::Session(hub, id, write, ticket),
            Job::Position(id) => Pending::Position(id),
            Job::Claim(claim) => Pending::Claim(claim),
            Job::Held(check) => Pending::Held(check),
        }
    }

    /// One round trip: the liveness key, then the batch.
    fn write(
        &mut self,
        con: &mut Connection,
        batch: &mut Vec<Pending>,
    ) -> Result<(), WpsRedisError> {
        let claim = match batch.last() {
            Some(Pending::Claim(_)) => batch.pop(),
            _ => None,
        };
        let written = self.write_batch(con, batch);
        if let Some(Pending::Claim(claim)) = claim {
            if written.is_err() {
                batch.push(Pending::Claim(claim));
                return written;
            }
            batch.clear();
            self.claim(con, *claim)?;
        }
        written
    }

    fn write_batch(
        &mut self,
        con: &mut Connection,
        batch: &mut [Pending],
    ) -> Result<(), WpsRedisError> {
        let mut pipe = redis::pipe();
        self.liveness(&mut pipe);
        self.epochs_to_check(batch);
        // A session's frames in one script call, never moved past another of its writes.
        let mut frames: HashMap<(&str, &str), Vec<&SessionWrite>> = HashMap::new();
        for job in batch.iter() {
            match job {
                Pending::Session(hub, id, w @ SessionWrite::Frame { .. }, _) => {
                    frames.entry((hub, id)).or_default().push(w);
                }
                Pending::Session(hub, id, write, _) => {
                    if let Some(run) = frames.remove(&(hub.as_str(), id.as_str())) {
                        self.frames(&mut pipe, hub, id, &run);
                    }
                    self.session(&mut pipe, hub, id, write);
                }
                Pending::Op(seq, op, None) => {
                    pipe.cmd("XADD")
                        .arg(&self.names.ops)
                        .arg("MAXLEN")
                        .arg("~")
                        .arg(self.stream_len)
                        .arg("*")
                        .arg("n")
                        .arg(&self.node)
                        .arg("r")
                        .arg(self.shared.incarnation)
                        .arg("s")
                        .arg(*seq)
                        .arg("o")
                        .arg(op.as_slice())
                        .ignore();
                }
                Pending::Op(seq, op, Some(a)) => {
                    if let Some(run) = frames.remove(&(a.hub.as_str(), a.id.as_str())) {
                        self.frames(&mut pipe, &a.hub, &a.id, &run);
                    }
                    self.fragment(&mut pipe, (*seq, op), a);
                }
                Pending::Answer(key, entry) => push_answer(&mut pipe, key, entry),
                Pending::Flush(_) => {}
                Pending::Position(id) => {
                    self.position.clone_from(id);
                    self.position_written = false;
                }
                Pending::Held(check) => {
                    check.add(&mut pipe, &self.names.session(&check.hub, &check.id).hash);
                }
                Pending::Claim(_) => {}
            }
        }
        for ((hub, id), run) in frames {
            self.frames(&mut pipe, hub, id, &run);
        }
        self.sessions_upkeep(&mut pipe);
        let ops = batch
            .iter()
            .filter(|j| matches!(j, Pending::Op(..)))
            .count();
        let mirrored = batch.iter().rev().find_map(|j| match j {
            Pending::Session(_, _, _, ticket) => Some(*ticket),
            Pending::Op(_, _, Some(a)) => Some(a.ticket),
            _ => None,
        });
        let owed = self.unreplicated.is_some() || self.unmirrored.is_some();
        let wait = self.wait.filter(|_| ops > 0 || mirrored.is_some() || owed);
        let (replies, acked) = query_waiting(con, &mut pipe, wait)?;
        self.settle_fenced(batch, &replies);
        self.written_batch(batch, (ops, mirrored), (wait, acked));
        Ok(())
    }

    /// After `batch` (with `ops` operations, its last session write's ticket
    /// `mirrored`) was written and `acked` replicas of `wait` acknowledged it: reports
    /// the operations and session writes written (or owed to replicas) and answers
    /// the flushes.
    fn written_batch(
        &mut self,
        batch: &[Pending],
        (ops, mirrored): (usize, Option<u64>),
        (wait, acked): (Option<Wait>, Option<u32>),
    ) {
        self.position_written = true;
        self.count_mirrored(batch);
        self.shared.ops_waiting.fetch_sub(ops, Ordering::Relaxed);
        let last = batch.iter().rev().find_map(|j| match j {
            Pending::Op(seq, ..) => Some(*seq),
            _ => None,
        });
        let enough = self.enough_replicas(wait, acked);
        if let Some(last) = last.or(self.unreplicated) {
            self.replicated(enough, last);
        }
        if let Some(ticket) = mirrored.or(self.unmirrored) {
            self.mirrored(enough, ticket);
        }
        for job in batch.iter() {
            if let Pending::Flush(done) = job {
                let _ = done.try_send(());
            }
        }
    }

    /// This node's liveness key and its place among the nodes (see `liveness.rs`).
    fn liveness(&mut self, pipe: &mut redis::Pipeline) {
        let leaving = self.shared.leaving.load(Ordering::Relaxed);
        let prune = !leaving && self.pruned.elapsed() >= PRUNE_EVERY;
        if prune {
            self.pruned = Instant::now();
        }
        add_liveness(pipe, &self.names, &self.node, leaving, prune);
    }

    /// Whether `acked` replicas are enough for `wait`; counts and logs a shortfall.
    fn enough_replicas(&mut self, wait: Option<Wait>, acked: Option<u32>) -> bool {
        let Err(short) = statehub_redis_common::check(wait, acked) else {
            return true;
        };
        let counter = &self.shared.counters.not_replicated;
        if let Some(count) = self.shortfalls.count(counter) {
            tracing::warn!(reason = %short, count, "web pubsub cluster: writes not acknowledged by enough redis replicas; sends, membership changes and claims waiting for them refused (503, InternalServerError, 1013), reliable sessions' frames held");
        }
        false
    }

    /// Operations up to `last` are written, `enough` replicas acknowledged them or not:
    /// wakes whoever waits for them, to go on (with those an earlier shortfall left:
    /// `WAIT` covers every earlier write), or to be refused.
    fn replicated(&mut self, enough: bool, last: u64) -> bool {
        let last = last.max(self.unreplicated.unwrap_or(0));
        if !enough {
            self.unreplicated = Some(last);
            self.shared.progress.send_if_modified(|p| {
                let later = last > p.unreplicated;
                p.unreplicated = p.unreplicated.max(last);
                later
            });
            return false;
        }
        self.unreplicated = None;
        self.written(last);
        true
    }

    /// Runs a claim (after everything queued before it is written) and answers it.
    fn claim(&mut self, con: &mut Connection, job: ClaimJob) -> Result<(), WpsRedisError> {
        let keys = self.names.session(&job.hub, &job.id);
        lock(&self.shared.claims).insert(job.seq, None);
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(self.scripts.claim.get_hash())
            .arg(4)
            .arg(&keys.all()[..])
            .arg(&self.names.ops)
            .arg(&job.digest)
            .arg(&job.protocol)
            .arg(self.owner())
            .arg(self.ttl_ms())
            .arg(&self.node)
            .arg(self.shared.incarnation)
            .arg(job.seq)
            .arg(job.marker.as_slice())
            .arg(self.stream_len)
            .arg(self.names.positions());
        let reply = query_claim(con, &mut pipe, self.wait);
        let parsed = reply.and_then(|(v, acked)| {
            let claimed = parse_claim(v, &job.hub, &job.id)?;
            Ok((claimed, acked))
        });
        let enough = match &parsed {
            Ok((Ok(Some(_)), acked)) => self.enough_replicas(self.wait, *acked),
            _ => true,
        };
        let answer = match parsed {
            Ok((Ok(Some(_)), _)) if !self.replicated(enough, job.seq) => Err(ClaimError::Cluster(
                statehub_webpubsub::ClusterError::Unavailable(Box::new(Unreplicated)),
            )),
            Ok((Ok(Some(mut claimed)), _)) => {
                claimed.restored.protocol.clone_from(&job.protocol);
                self.epochs
                    .insert((job.hub.clone(), job.id.clone()), claimed.epoch);
                lock(&self.shared.claims).insert(job.seq, Some(ClaimRecord { claimed }));
                Ok(())
            }
            Ok((Ok(None), _)) => Err(ClaimError::Gone),
            Ok((Err(why), _)) => Err(ClaimError::Ended(why.to_owned())),
            Err(e) => Err(ClaimError::Cluster(
                statehub_webpubsub::ClusterError::Unavailable(Box::new(e)),
            )),
        };
        tracing::debug!(
            hub = job.hub,
            id = job.id,
            seq = job.seq,
            ?answer,
            "web pubsub cluster: claim"
        );
        let counters = &self.shared.counters;
        if answer.is_err() {
            counters.claims_failed.fetch_add(1, Ordering::Relaxed);
            lock(&self.shared.claims).remove(&job.seq);
        } else {
            counters.claims.fetch_add(1, Ordering::Relaxed);
        }
        if self.unreplicated.is_none() {
            self.written(job.seq);
        }
        let _ = job.reply.send(answer);
        Ok(())
    }

    /// Session writes up to `ticket` are in Redis, `enough` replicas acknowledged them
    /// or not: releases the frames that wait for them (see `mirror.rs` in the Web
    /// PubSub crate), or holds them until a later `WAIT` covers them too. Otherwise a
    /// failover to a replica that lacks them would let the next node number anew ids
    /// the client has seen.
    fn mirrored(&mut self, enough: bool, ticket: u64) {
        let ticket = ticket.max(self.unmirrored.unwrap_or(0));
        if !enough {
            self.unmirrored = Some(ticket);
            return;
        }
        self.unmirrored = None;
        self.shared.progress.send_if_modified(|p| {
            let later = ticket > p.mirrored;
            p.mirrored = p.mirrored.max(ticket);
            later
        });
    }

    /// Operations up to `seq` are in the stream: wakes whoever waits for them.
    fn written(&self, seq: u64) {
        self.shared.progress.send_if_modified(|p| {
            let later = seq > p.written;
            p.written = p.written.max(seq);
            later
        });
    }
}
