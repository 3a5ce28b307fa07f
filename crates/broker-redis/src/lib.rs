//! The broker's cluster fabric on Redis (`--redis`): every statehub node on one Redis
//! acts as one MQTT broker. docs/decisions/0004-mqtt-cluster-on-one-redis-stream.md
//! says why this design.
//!
//! * **One stream** (`{ns}:mqtt:feed`) carries, in one order, every message published
//!   on any node (with the node that published it and its shared-group picks), every
//!   connection's client id (a takeover) and every change of a node's shared groups.
//!   Each node appends from one writer thread ([`writer`]) and reads from one reader
//!   thread ([`reader`]) strictly after the last entry it read, skipping its own
//!   messages (delivered locally already): so each node gets each message once, in the
//!   order it was appended, and a reconnecting reader loses nothing the stream still
//!   holds.
//! * **Retained messages** live in a hash (`{ns}:mqtt:retained`, [`retain`]), written
//!   by the script that appends the change's entry; every node keeps its own copy in
//!   memory, loaded when it first connects and updated from the stream in its order
//!   ([`own_retained`]: not over a change of its own still to come).
//! * **Shared groups** (`{ns}:mqtt:groups`, [`groups`]): each node's field lists its
//!   groups; the publisher's node picks one node per matching group, round robin.
//! * **Takeover**: a connection appends its client id; every other node ends its
//!   session of that client id (its connection closed with 0x8E), unless it announced a
//!   newer one of its own that the stream has not ordered yet.

mod append;
mod flush;
mod groups;
mod lag;
mod liveness;
mod own_retained;
mod reader;
mod retain;
mod sessions;
mod wire;
mod writer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use statehub_broker::{BoxFuture, Broker, Fabric, FabricError, Message, SharedPicks};
use tokio::sync::oneshot;

pub use retain::RedisRetain;
pub use sessions::{RecordError, RedisSessions, SessionCounters};
pub use wire::WireError;

use crate::groups::Groups;
use crate::writer::Command;

/// Where and how a node joins the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `redis://host:port[/db]`.
    pub url: String,
    /// Nodes with the same namespace form one broker (keys `{namespace}:mqtt:*`).
    pub namespace: String,
    /// This node's id, unique among the nodes on one Redis.
    pub node: String,
    /// Bound on every Redis call.
    pub timeout: Duration,
    /// The stream is trimmed to about this many entries: how far a node may fall
    /// behind before it misses messages.
    pub stream_len: u64,
    /// Publishers on this node wait (their PUBACKs are held) while a live node's
    /// reader (this node's own included) is more than this many entries behind the
    /// stream's head, so that no reader falls past the trim (at most half of
    /// `stream_len`: what other writers append within a round trip comes on top; 0:
    /// never wait). A node whose reader made no progress for `node_ttl` is not waited
    /// for.
    pub reader_lag_limit: u64,
    /// Most messages waiting for the writer: past it QoS 0 messages are not forwarded
    /// (counted) and QoS 1/2 PUBLISHes are refused with 0x97.
    pub queue: usize,
    /// Acknowledge a QoS 1/2 PUBLISH or a retained change only once this many Redis
    /// replicas have it (`WAIT` after the writer's batch; 0: once the primary has it).
    pub wait_replicas: u32,
    /// How long the writer waits for those replicas (below `timeout`).
    pub wait_timeout: Duration,
    /// A node that has not renewed its liveness key for this long is dead: its
    /// persistent sessions are taken over as they are and its shared groups no longer
    /// picked.
    pub node_ttl: Duration,
    /// How often one live node forgets, bodies included, the persistent sessions past
    /// their expiry that no node holds (their owner died, or nobody claimed them), and
    /// starts the expiry of a dead owner's connected sessions. Such a session goes
    /// between one and two periods after its expiry.
    pub session_sweep: Duration,
}

/// Defaults of [`Options`].
pub mod defaults {
    /// [`super::Options::stream_len`].
    pub const STREAM_LEN: u64 = 100_000;
    /// [`super::Options::queue`].
    pub const QUEUE: usize = 10_000;
    /// [`super::Options::node_ttl`].
    pub const NODE_TTL: std::time::Duration = std::time::Duration::from_secs(10);
    /// [`super::Options::session_sweep`].
    pub const SESSION_SWEEP: std::time::Duration = std::time::Duration::from_secs(10);
}

/// The fabric could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("redis URL: {0}")]
    Url(#[from] redis::RedisError),
    #[error("cannot start a thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// What the fabric counted since start.
#[derive(Debug, Default)]
pub struct Counters {
    /// Messages appended to the stream.
    pub forwarded: AtomicU64,
    /// Messages from other nodes delivered here.
    pub received: AtomicU64,
    /// QoS 0 messages not forwarded: the queue was full or Redis out of reach.
    pub dropped: AtomicU64,
    /// Stream entries that could not be read (logged).
    pub malformed: AtomicU64,
    /// Times this node's reader found entries trimmed from the stream before it read
    /// them (it had fallen more than `stream_len` behind; logged).
    pub gaps: AtomicU64,
    /// Stream entries the reader applied (every node's, this node's own included).
    pub entries_read: AtomicU64,
    /// Reads of the stream that failed (the reader reconnects and reads on).
    pub read_errors: AtomicU64,
    /// How far behind the reader was, in milliseconds: the age of the last entry of a
    /// read that filled its batch (more were waiting), 0 after a read that did not.
    pub reader_lag_ms: AtomicU64,
    /// Writer pipelines Redis answered.
    pub batches: AtomicU64,
    /// Writer pipelines that failed (their QoS 1/2 PUBLISHes refused with 0x80).
    pub write_errors: AtomicU64,
    /// Writer batches fewer replicas acknowledged than `wait_replicas` asks.
    pub not_replicated: AtomicU64,
    /// Writer batches held back because a node's reader was more than
    /// `reader_lag_limit` entries behind.
    pub held: AtomicU64,
    /// Milliseconds the writer spent holding batches back.
    pub held_ms: AtomicU64,
    /// Liveness renewals that failed (a node that fails them past `node_ttl` passes for
    /// dead).
    pub liveness_failures: AtomicU64,
    /// Retained changes made here while Redis was out of reach, written once it was
    /// back (`retain.rs`).
    pub retained_restored: AtomicU64,
    /// Those past the writer's bound on them (`queue` topics): they stay on this node
    /// only (logged).
    pub retained_unrestored: AtomicU64,
    /// Retained changes made here past the bound on those still to come in the
    /// stream (`own_retained.rs`; logged): another node's older change of the topic
    /// may replace one here.
    pub retained_untracked: AtomicU64,
}

/// The Redis keys of one namespace.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// What every key of the namespace starts with.
    pub prefix: String,
    pub feed: String,
    pub retained: String,
    pub groups: String,
    /// The count of entries ever appended (each entry carries its number).
    pub seq: String,
}

impl Keys {
    fn new(namespace: &str) -> Self {
        Self {
            prefix: format!("{{{namespace}}}:mqtt:"),
            feed: format!("{{{namespace}}}:mqtt:feed"),
            retained: format!("{{{namespace}}}:mqtt:retained"),
            groups: format!("{{{namespace}}}:mqtt:groups"),
            seq: format!("{{{namespace}}}:mqtt:seq"),
        }
    }

    /// Where `node`'s reader says how far it read (the number of the last entry it
    /// applied); it lapses when the reader makes no progress for the node TTL.
    pub fn read_position(&self, node: &str) -> String {
        format!("{}read:{node}", self.prefix)
    }
}

/// What the writer, the reader and the broker's calls share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub node: Arc<str>,
    pub keys: Keys,
    pub available: AtomicBool,
    pub counters: Counters,
    pub groups: Groups,
    /// Client ids this node announced whose entries its reader has not read back yet.
    pending: Mutex<HashMap<String, u32>>,
    tx: SyncSender<Command>,
    /// The persistent sessions' store.
    pub sessions: Arc<sessions::Inner>,
    /// The reader's position, locked while it applies entries.
    pub cut: Arc<Mutex<sessions::Cut>>,
    /// The writer's hold, as flushes see it.
    pub hold: Arc<flush::HoldState>,
    /// Retained changes made here that the reader has not read back yet.
    pub own_retained: own_retained::OwnRetained,
}

impl Shared {
    /// Hands a command to the writer without waiting; `false` if its queue is full.
    pub(crate) fn send(&self, command: Command) -> bool {
        self.send_or_return(command).is_ok()
    }

    /// [`Shared::send`], giving the command back if its queue is full.
    pub(crate) fn send_or_return(&self, command: Command) -> Result<(), Command> {
        self.tx.try_send(command).map_err(|e| match e {
            TrySendError::Full(c) | TrySendError::Disconnected(c) => c,
        })
    }

    /// The reader read back (or the writer failed to append) an announcement.
    pub(crate) fn announced(&self, client_id: &str) {
        let mut pending = self.pending.lock();
        if let Some(n) = pending.get_mut(client_id) {
            *n -= 1;
            if *n == 0 {
                pending.remove(client_id);
            }
        }
    }
}

/// The bound on this node's retained changes still to come in the stream
/// (`own_retained.rs`): the writer's queue and its backlog (`queue` each), and the
/// stream a reader can be behind (`stream_len`).
fn own_retained_limit(options: &Options) -> usize {
    let stream = usize::try_from(options.stream_len).unwrap_or(usize::MAX);
    options.queue.saturating_mul(2).saturating_add(stream)
}

/// The [`Fabric`] on Redis. Install it with [`RedisFabric::start`].
#[derive(Debug, Clone)]
pub struct RedisFabric {
    shared: Arc<Shared>,
}

impl RedisFabric {
    /// Joins `broker` to the cluster: installs the fabric and the retained-message
    /// store, starts the writer and the reader. Call before accepting connections.
    /// Starts even while Redis is down (QoS 1/2 PUBLISHes are then refused until it is
    /// back, and retained messages load when it is).
    pub fn start(options: &Options, broker: &Broker) -> Result<RedisFabric, StartError> {
        let client = redis::Client::open(options.url.as_str())?;
        let (tx, rx) = mpsc::sync_channel(options.queue.max(1));
        let node: Arc<str> = Arc::from(options.node.as_str());
        let keys = Keys::new(&options.namespace);
        // This process, as the owner of the sessions it stores: a node that restarts
        // under the same id is another owner, and its old sessions those of a dead one.
        let owner = format!("{}#{:016x}", options.node, rand::random::<u64>());
        let cut = Arc::new(Mutex::new(sessions::Cut::default()));
        let hold = Arc::new(flush::HoldState::default());
        let fetcher = sessions::Fetcher {
            client: client.clone(),
            feed: keys.feed.clone(),
            seq: keys.seq.clone(),
            node: options.node.clone(),
            stream_len: options.stream_len,
            timeout: options.timeout,
            node_ttl: options.node_ttl,
            cut: cut.clone(),
            pool: Mutex::default(),
            writer: tx.clone(),
            hold: hold.clone(),
        };
        let wait = (options.wait_replicas > 0).then_some(sessions::Wait {
            replicas: options.wait_replicas,
            timeout: options.wait_timeout,
        });
        let sessions = sessions::Inner::start(
            client.clone(),
            keys.prefix.clone(),
            owner.clone(),
            fetcher,
            (options.timeout, options.session_sweep),
            wait,
        )?;
        let shared = Arc::new(Shared {
            node: node.clone(),
            keys,
            available: AtomicBool::new(false),
            counters: Counters::default(),
            groups: Groups::new(node),
            pending: Mutex::default(),
            tx,
            sessions: sessions.clone(),
            cut,
            hold,
            // What the writer's queue, its backlog and the stream a reader may be
            // behind can hold.
            own_retained: own_retained::OwnRetained::new(own_retained_limit(options)),
        });
        let fabric = RedisFabric { shared };
        broker.set_fabric(Arc::new(fabric.clone()));
        broker.set_retain_store(Arc::new(fabric.retain_store()), Vec::new());
        let store = RedisSessions { inner: sessions };
        broker.set_session_store(Arc::new(store.clone()), Vec::new());
        liveness::start(client.clone(), fabric.shared.clone(), &owner, options)?;
        let mut reader = reader::Reader::new(client.clone(), fabric.shared.clone(), options);
        // Positioned before the broker serves anyone, when Redis answers: nothing
        // published from then on is missed.
        let up = reader.start(broker);
        fabric.shared.available.store(up, Ordering::Relaxed);
        let writer = writer::Writer::new(client, fabric.shared.clone(), options, rx);
        std::thread::Builder::new()
            .name("mqtt-cluster-writer".into())
            .spawn(move || writer.run())?;
        let stop = broker.shutdown_token();
        let broker = broker.clone();
        std::thread::Builder::new()
            .name("mqtt-cluster-reader".into())
            .spawn(move || reader.run(&broker, &stop))?;
        Ok(fabric)
    }

    /// The persistent sessions' store.
    pub fn sessions(&self) -> RedisSessions {
        RedisSessions {
            inner: self.shared.sessions.clone(),
        }
    }

    /// What it counted.
    pub fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// Whether the writer's last attempt reached Redis.
    pub fn redis_up(&self) -> bool {
        self.shared.available.load(Ordering::Relaxed)
    }

    /// The retained-message store that writes through this fabric.
    pub fn retain_store(&self) -> RedisRetain {
        RedisRetain::new(self.shared.clone())
    }
}

impl Fabric for RedisFabric {
    fn is_available(&self) -> bool {
        self.shared.available.load(Ordering::Relaxed)
    }

    fn shared_picks(&self, topic: &str) -> SharedPicks {
        self.shared.groups.picks(topic)
    }

    fn forward(
        &self,
        msg: &Message,
        picks: SharedPicks,
    ) -> BoxFuture<'static, Result<(), FabricError>> {
        let shared = &self.shared;
        let now = wire::Now::at(std::time::Instant::now());
        let encoded = match wire::encode(msg, now) {
            Ok(encoded) => encoded,
            Err(e) => {
                tracing::warn!("message not forwarded: {e}");
                shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                if msg.retain && !statehub_broker::sys::is_sys(&msg.topic) {
                    shared.own_retained.dropped(&msg.topic);
                }
                return Box::pin(async { Ok(()) });
            }
        };
        // Counted as this node's own when it took effect (`RedisRetain::record`).
        let retained = (msg.retain && !statehub_broker::sys::is_sys(&msg.topic))
            .then(|| (msg.topic.to_string(), !msg.payload.is_empty()));
        let (reply, done) = oneshot::channel();
        let command = Command::Publish {
            msg: encoded,
            picks: wire::encode_picks(&picks),
            origin: shared.sessions.origin(msg),
            retained,
            reply,
        };
        if let Err(command) = shared.send_or_return(command) {
            if let Command::Publish {
                retained: Some((topic, _)),
                ..
            } = command
            {
                shared.own_retained.dropped(&topic);
            }
            shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return Box::pin(async { Err(FabricError::Full) });
        }
        Box::pin(async move {
            done.await
                .unwrap_or_else(|_| Err(FabricError::Unavailable("stopped".into())))
        })
    }

    fn withdraw(&self, msg: &Message, clients: &[Arc<str>]) -> bool {
        self.shared.sessions.withdraw(msg, clients)
    }

    fn connected(
        &self,
        client_id: &str,
        resumed: bool,
    ) -> BoxFuture<'static, Result<(), FabricError>> {
        let shared = &self.shared;
        *shared
            .pending
            .lock()
            .entry(client_id.to_owned())
            .or_default() += 1;
        let (reply, done) = oneshot::channel();
        let command = Command::Announce {
            client: client_id.to_owned(),
            resumed,
            reply,
        };
        if !shared.send(command) {
            shared.announced(client_id);
            return Box::pin(async { Err(FabricError::Full) });
        }
        Box::pin(async move {
            done.await
                .unwrap_or_else(|_| Err(FabricError::Unavailable("stopped".into())))
        })
    }

    fn announcing(&self, client_id: &str) -> bool {
        self.shared.pending.lock().contains_key(client_id)
    }

    fn shared_group_changed(&self, filter: &str, group: &str, present: bool) {
        self.shared.groups.local_changed(filter, group, present);
        // The writer sends this node's groups as they are when it runs the command, and
        // again after every reconnect; a full queue delays them until the next change.
        if !self.shared.send(Command::Groups) {
            tracing::warn!("shared group change not sent to the cluster: queue full");
        }
    }
}
