//! Web PubSub across statehub nodes on one Redis: the [`Cluster`] of
//! `statehub-webpubsub` (its `cluster.rs` says what travels and why).
//!
//! - **Operations** (sends, joins, leaves, closes) go into one Redis stream,
//!   `{namespace}:wps:ops`, appended by one writer thread per node in the order the node
//!   handed them over, and read by one reader thread per node, in stream order, which
//!   applies every other node's operations to its own sessions. A stream rather than
//!   PUB/SUB: a reader that lost its connection reads on from the last entry it applied,
//!   so nothing is lost or repeated across a reconnect (as long as the stream, trimmed
//!   near [`Options::stream_len`] entries, still holds it). Each entry carries its node,
//!   the node's incarnation and a sequence number, so an entry written twice (a write
//!   retried after a lost reply) is applied once, and a gap (trimmed before it was read)
//!   is logged and counted.
//! - **Questions** (does a connection, user or group exist anywhere; a connection's
//!   permissions; a group's members) travel in the same stream; every node alive when
//!   the question was asked (listed in `{namespace}:wps:nodes`, alive while its key
//!   `{namespace}:wps:alive:{node}`, refreshed every [`HEARTBEAT`] and kept three times
//!   that, exists) answers, through its writer, into the list
//!   `{namespace}:wps:ans:{id}`, where the asker waits for them (`ask.rs`).
//! - **Redis unreachable**: operations that must reach other nodes are refused at once
//!   ([`ClusterError::Unavailable`]: the REST API answers 503, a client's `sendToGroup`
//!   gets an `InternalServerError` ack) and nothing is delivered, not even locally, so
//!   no node sees what another missed; what only touches this node's sessions goes on.
//!   Operations accepted before the writer noticed are kept, in order, and written when
//!   Redis is back.

mod ask;
mod held;
mod liveness;
mod reader;
mod replicas;
mod session;
mod streams;
mod writer;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Client, Connection, RedisResult};
use statehub_webpubsub::{
    ClaimError, Cluster, ClusterError, Mirrored, SessionWrite, Taken, WebPubSub, Written,
};

/// How often a node refreshes its liveness key.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// The writer's channel holds this many times `queue` jobs (see [`RedisCluster::start`]).
const SESSION_JOBS: usize = 8;
/// Wait between attempts to reach Redis again.
const BACKOFF: Duration = Duration::from_millis(250);

/// How to reach the other nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// The namespace of the keys (wrapped in a hash tag: `{namespace}`); nodes with the
    /// same one form one service.
    pub namespace: String,
    /// This node's id, unique among the nodes.
    pub node: String,
    /// Bound on every Redis call.
    pub timeout: Duration,
    /// The operations stream is trimmed to about this many entries.
    pub stream_len: u64,
    /// Most operations and index changes waiting for the writer.
    pub queue: usize,
    /// Replicas that must have a pipeline an acknowledgement depends on (`WAIT`).
    pub wait: Option<statehub_redis_common::Wait>,
}

/// Defaults of [`Options`].
pub mod defaults {
    /// [`super::Options::stream_len`].
    pub const STREAM_LEN: u64 = 10_000;
    /// [`super::Options::queue`].
    pub const QUEUE: usize = 10_000;
}

/// Redis failed us.
#[derive(Debug, thiserror::Error)]
pub enum WpsRedisError {
    /// Redis refused a command, or could not be reached.
    #[error(transparent)]
    Redis(#[from] redis::RedisError),
    /// An entry of the stream is not what a node writes.
    #[error("unexpected data in redis: {0}")]
    Corrupt(&'static str),
    /// The writer or reader thread could not start.
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The names of the keys.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    prefix: String,
    pub(crate) ops: String,
}

impl Names {
    fn new(namespace: &str) -> Self {
        let prefix = format!("{{{namespace}}}:wps:");
        Self {
            ops: format!("{prefix}ops"),
            prefix,
        }
    }

    /// The nodes that wrote (each alive while its [`Names::alive`] key exists; those
    /// whose key lapsed are pruned now and then, `writer.rs`).
    pub(crate) fn nodes(&self) -> String {
        format!("{}nodes", self.prefix)
    }

    /// Where the answers to question `id` are pushed.
    pub(crate) fn answers(&self, id: &str) -> String {
        format!("{}ans:{id}", self.prefix)
    }

    pub(crate) fn alive(&self, node: &str) -> String {
        format!("{}alive:{node}", self.prefix)
    }

    pub(crate) fn session(&self, hub: &str, id: &str) -> session::Keys {
        session::Keys::new(&self.prefix, hub, id)
    }

    /// The prefix of the keys holding each node incarnation's reader position.
    pub(crate) fn positions(&self) -> String {
        format!("{}pos:", self.prefix)
    }
}

/// What the writer thread does, in order.
#[derive(Debug)]
pub(crate) enum Job {
    /// Append an operation to the stream, with its number, and with it (in one script
    /// call) a client stream's state for its publisher's mirrored session.
    Broadcast(u64, Vec<u8>, Option<Box<streams::Attached>>),
    /// Push an answer (this node's id and the answer) to the asker's list.
    Answer(String, Vec<u8>),
    /// Answer once everything queued before is written.
    Flush(SyncSender<()>),
    /// Mirror a change of a reliable session of (hub, id), with its ticket.
    Session(String, String, SessionWrite, u64),
    /// The reader applied every operation up to this stream id.
    Position(String),
    /// Take a session over (see [`Cluster::claim`]).
    Claim(Box<ClaimJob>),
    /// Is the session still this node's? (see [`Cluster::still_held`]).
    Held(Box<held::HeldCheck>),
}

/// A claim for the writer, answered on `reply`.
#[derive(Debug)]
pub(crate) struct ClaimJob {
    pub(crate) hub: String,
    pub(crate) id: String,
    pub(crate) digest: String,
    pub(crate) protocol: String,
    pub(crate) marker: Vec<u8>,
    pub(crate) seq: u64,
    pub(crate) reply: SyncSender<Result<(), ClaimError>>,
}

/// The numbering of this node's operations.
#[derive(Debug, Default)]
pub(crate) struct Assigned {
    /// The last number given.
    pub(crate) last: u64,
    /// Claims not yet served by the reader: while there are, operations are kept.
    pub(crate) claims: usize,
    /// The operations handed over since the oldest such claim, at most `queue`.
    pub(crate) kept: std::collections::VecDeque<(u64, Vec<u8>)>,
    /// Some were not kept.
    pub(crate) overflow: bool,
}

/// A claim the writer made, for the reader to serve when it reaches its marker.
#[derive(Debug)]
pub(crate) struct ClaimRecord {
    pub(crate) claimed: session::Claimed,
}

/// Claims by their marker's sequence number: `None` while the writer has not heard
/// Redis's answer.
pub(crate) type Claims = Mutex<HashMap<u64, Option<ClaimRecord>>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a node's Web PubSub cluster counted.
#[derive(Debug, Default)]
pub struct Counters {
    /// Writer pipelines Redis answered (operations, index changes, session mirrors).
    pub pipelines: AtomicU64,
    /// Writer attempts that failed (retried in order; sends refused meanwhile).
    pub write_errors: AtomicU64,
    /// Stream entries the reader read (every node's, this node's own included).
    pub entries_read: AtomicU64,
    /// Reads of the stream that failed (the reader reconnects and reads on).
    pub read_errors: AtomicU64,
    /// How far behind the reader was, in milliseconds: the age of the last entry of a
    /// read that filled its batch (more were waiting), 0 after a read that did not.
    pub reader_lag_ms: AtomicU64,
    /// Reliable sessions claimed here from another node.
    pub claims: AtomicU64,
    /// Claims that failed (session gone or ended, or Redis out of reach).
    pub claims_failed: AtomicU64,
    /// Reliable sessions' frames mirrored into Redis (the cost of recovery elsewhere).
    pub mirrored_frames: AtomicU64,
    /// Their other mirrored changes (opens, trims, groups, ackIds, deletes).
    pub mirrored_changes: AtomicU64,
    /// Reliable sessions some of whose changes could not be queued for Redis (the
    /// writer's channel was full): they end (1008) and no node recovers them.
    pub mirror_overflows: AtomicU64,
    /// Writer pipelines (or claims) fewer replicas acknowledged than `Options::wait`
    /// asks: what waited for them was refused.
    pub not_replicated: AtomicU64,
}

/// What the writer and the nodes' handles share.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// What this node counted.
    pub(crate) counters: Counters,
    /// The writer's last attempt reached Redis.
    pub(crate) up: AtomicBool,
    /// Set to stop both threads.
    pub(crate) stop: AtomicBool,
    /// Set to stop the reader and to stop counting as a live node (a shutdown that
    /// hands the sessions over).
    pub(crate) leaving: AtomicBool,
    /// The reader applies no more operations.
    pub(crate) reader_stopped: AtomicBool,
    /// Operations of other nodes trimmed from the stream before this node read them.
    pub(crate) lost: AtomicU64,
    /// Operations queued and not yet written.
    pub(crate) ops_waiting: std::sync::atomic::AtomicUsize,
    /// This node's operations as numbered, under a lock held while one is queued, so
    /// operations are queued in their numbers' order.
    pub(crate) assigned: Mutex<Assigned>,
    /// Tells this process's operations from an earlier one's with the same node id.
    pub(crate) incarnation: u64,
    /// This node's claims (see [`Claims`]).
    pub(crate) claims: Claims,
    /// Sessions some of whose writes could not be queued.
    pub(crate) broken: Mutex<HashSet<(String, String)>>,
    /// How long a session's keys outlive their last refresh.
    pub(crate) session_ttl: Duration,
    /// How far the writer got: what [`Cluster::written`] waits on.
    pub(crate) progress: tokio::sync::watch::Sender<Progress>,
    /// The last ticket given to a session write, under a lock held while one is
    /// queued, so writes are queued in their tickets' order.
    pub(crate) tickets: Mutex<u64>,
}

/// The writer's progress, published after every attempt.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    /// Every operation numbered up to this one is in the stream.
    pub(crate) written: u64,
    /// Attempts that failed to reach Redis so far.
    pub(crate) failures: u64,
    /// Operations up to this one are in the stream but fewer replicas than asked have
    /// them: refused, unless a later `WAIT` covered them (`written` moved past).
    pub(crate) unreplicated: u64,
    /// Every session write up to this ticket is in Redis, and with `Options::wait` on
    /// enough replicas (`u64::MAX`: the writer stopped, nothing more will be).
    pub(crate) mirrored: u64,
}

impl Shared {
    /// A claim was served by the reader, or failed: stop keeping operations for it.
    pub(crate) fn claim_served(&self) {
        let mut assigned = lock(&self.assigned);
        assigned.claims = assigned.claims.saturating_sub(1);
        if assigned.claims == 0 {
            assigned.kept.clear();
            assigned.overflow = false;
        }
    }
}

/// Web PubSub's [`Cluster`] over Redis. See the crate docs.
pub struct RedisCluster {
    jobs: SyncSender<Job>,
    shared: Arc<Shared>,
    names: Names,
    node: String,
    queue: usize,
    /// Connections of [`Cluster::ask`], kept for the next question.
    askers: Mutex<Vec<Connection>>,
    /// Questions waiting for answers now (at most `ask::MAX_ASKING`).
    asking: std::sync::atomic::AtomicUsize,
    client: Client,
    timeout: Duration,
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("node", &self.node)
            .field("up", &self.shared.up.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl RedisCluster {
    /// Joins `service` to the nodes on the Redis `options` names: starts this node's
    /// writer and reader threads (which run until [`RedisCluster::stop`]) and hands the
    /// cluster to the service. Starts even while Redis is down (operations for other
    /// nodes are refused until it is back). Call it inside the Tokio runtime, before
    /// any client connects.
    pub fn start(options: &Options, service: &WebPubSub) -> Result<Arc<Self>, WpsRedisError> {
        let client = Client::open(options.url.as_str())?;
        let names = Names::new(&options.namespace);
        // Operations are bounded by `queue` (counted in `ops_waiting`); the channel also
        // carries reliable sessions' frames, many per operation, which must not make
        // sends be refused: past its bound a session's copy is marked lost instead.
        let (jobs, queue) = sync_channel(options.queue.max(1).saturating_mul(SESSION_JOBS));
        let shared = Arc::new(Shared {
            incarnation: rand::random(),
            session_ttl: service.config().limits.session_retention,
            ..Shared::default()
        });
        let cluster = Arc::new(Self {
            jobs,
            shared: Arc::clone(&shared),
            names: names.clone(),
            node: options.node.clone(),
            queue: options.queue,
            askers: Mutex::new(Vec::new()),
            asking: std::sync::atomic::AtomicUsize::new(0),
            client: client.clone(),
            timeout: options.timeout,
        });
        let writer = writer::Writer::new(options, client.clone(), names.clone(), shared.clone());
        writer.spawn(queue, service.clone())?;
        reader::Reader::new(options, client, names, shared, cluster.jobs.clone())
            .spawn(service.clone(), tokio::runtime::Handle::current())?;
        service.join_cluster(cluster.clone());
        Ok(cluster)
    }

    /// Stops the writer and reader threads (at their next wake-up).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }

    /// How many operations of other nodes were trimmed before this node read them.
    pub fn lost(&self) -> u64 {
        self.shared.lost.load(Ordering::Relaxed)
    }

    /// What it counted.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Whether the writer's last attempt reached Redis.
    pub fn redis_up(&self) -> bool {
        self.shared.up.load(Ordering::Relaxed)
    }
}

fn unavailable(error: impl std::error::Error + Send + Sync + 'static) -> ClusterError {
    ClusterError::Unavailable(Box::new(error))
}

/// Redis is not answering the writer (its last attempt failed).
#[derive(Debug, thiserror::Error)]
#[error("redis is unreachable")]
struct Down;

/// Fewer Redis replicas than `Options::wait` asks acknowledged the operation.
#[derive(Debug, thiserror::Error)]
#[error("redis WAIT: too few replicas acknowledged the write; it may be lost in a failover")]
pub(crate) struct Unreplicated;

impl Cluster for RedisCluster {
    fn broadcast(&self, operation: Vec<u8>) -> Result<u64, ClusterError> {
        self.enqueue_op(operation, None).map(|(seq, ..)| seq)
    }

    fn broadcast_with(
        &self,
        operation: Vec<u8>,
        attached: (&str, &str, SessionWrite),
    ) -> Result<(u64, u64, Taken), ClusterError> {
        let (seq, ticket, taken) = self.enqueue_op(operation, Some(attached))?;
        let taken = taken.unwrap_or_else(|| Box::pin(std::future::ready(true)));
        Ok((seq, ticket, taken))
    }

    fn still_held(&self, hub: &str, id: &str) -> Taken {
        self.check_held(hub, id)
    }

    fn written(&self, seq: u64) -> Written {
        let mut progress = self.shared.progress.subscribe();
        let failures = progress.borrow().failures;
        let bound = self.timeout * 3;
        Box::pin(async move {
            let reached = progress
                .wait_for(|p| p.written >= seq || p.unreplicated >= seq || p.failures > failures);
            match tokio::time::timeout(bound, reached).await {
                Ok(Ok(p)) if p.written >= seq => Ok(()),
                Ok(Ok(p)) if p.unreplicated >= seq => Err(unavailable(Unreplicated)),
                Ok(Ok(_)) => Err(unavailable(Down)),
                Ok(Err(e)) => Err(unavailable(e)),
                Err(e) => Err(unavailable(e)),
            }
        })
    }

    fn session(&self, hub: &str, id: &str, write: SessionWrite) -> Result<u64, ClusterError> {
        let mut tickets = lock(&self.shared.tickets);
        let ticket = *tickets + 1;
        let job = Job::Session(hub.to_owned(), id.to_owned(), write, ticket);
        match self.jobs.try_send(job) {
            Ok(()) => {
                *tickets = ticket;
                return Ok(ticket);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
        }
        drop(tickets);
        let first = lock(&self.shared.broken).insert((hub.to_owned(), id.to_owned()));
        if first {
            let overflows = &self.shared.counters.mirror_overflows;
            overflows.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                hub,
                id,
                "web pubsub cluster: a reliable session's changes could not all be queued for redis; it ends (1008)"
            );
        }
        Err(ClusterError::Backlog(
            self.queue.saturating_mul(SESSION_JOBS),
        ))
    }

    fn mirrored(&self, ticket: u64) -> Mirrored {
        let mut progress = self.shared.progress.subscribe();
        Box::pin(async move {
            match progress.wait_for(|p| p.mirrored >= ticket).await {
                Ok(p) => p.mirrored,
                Err(_) => u64::MAX,
            }
        })
    }

    fn claim(
        &self,
        hub: &str,
        id: &str,
        token_digest: &str,
        protocol: &str,
        marker: Vec<u8>,
    ) -> Result<(), ClaimError> {
        if !self.shared.up.load(Ordering::Relaxed) {
            return Err(unavailable(Down).into());
        }
        let (reply, answer) = sync_channel(1);
        {
            let mut assigned = lock(&self.shared.assigned);
            let seq = assigned.last + 1;
            let job = ClaimJob {
                hub: hub.to_owned(),
                id: id.to_owned(),
                digest: token_digest.to_owned(),
                protocol: protocol.to_owned(),
                marker,
                seq,
                reply,
            };
            match self.jobs.try_send(Job::Claim(Box::new(job))) {
                Ok(()) => {
                    assigned.last = seq;
                    assigned.claims += 1;
                }
                Err(TrySendError::Full(_)) => return Err(ClusterError::Backlog(self.queue).into()),
                Err(TrySendError::Disconnected(_)) => return Err(unavailable(Down).into()),
            }
        }
        let result = match answer.recv_timeout(self.timeout * 3) {
            Ok(result) => result,
            Err(e) => Err(unavailable(e).into()),
        };
        if result.is_err() {
            self.shared.claim_served();
        }
        result
    }

    fn sent_after(&self, claim: u64) -> Option<Vec<(u64, Vec<u8>)>> {
        let assigned = lock(&self.shared.assigned);
        if assigned.overflow {
            return None;
        }
        let after = assigned.kept.iter().filter(|(seq, _)| *seq > claim);
        Some(after.cloned().collect())
    }

    fn ask(
        &self,
        id: &str,
        question: Vec<u8>,
        settles: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<Vec<u8>>, ClusterError> {
        ask::ask(self, id, question, settles)
    }

    fn stop_reading(&self) {
        self.shared.leaving.store(true, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + self.timeout * 3;
        while !self.shared.reader_stopped.load(Ordering::Relaxed)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn flush(&self, within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        let (tx, rx) = sync_channel(1);
        let mut job = Job::Flush(tx);
        loop {
            match self.jobs.try_send(job) {
                Ok(()) => break,
                Err(TrySendError::Full(j)) if std::time::Instant::now() < deadline => {
                    job = j;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        rx.recv_timeout(left).is_ok()
    }

    fn stop(&self) {
        RedisCluster::stop(self);
    }

    fn answer(&self, id: &str, answer: Vec<u8>) {
        let mut entry = self.node.clone().into_bytes();
        entry.push(b'\n');
        entry.extend(answer);
        // A full queue: the asker gets no answer from this node and refuses (503).
        let _ = self
            .jobs
            .try_send(Job::Answer(self.names.answers(id), entry));
    }
}

/// A new connection whose every read and write is bounded by `timeout`.
pub(crate) fn open(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let connection = client.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    Ok(connection)
}
