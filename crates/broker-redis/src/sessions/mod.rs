//! Persistent MQTT sessions in Redis (`--redis`): the broker's [`SessionStore`] hook
//! for nodes that share one Redis, so a session lives on whichever node its client
//! connects to and survives the node it was on (docs/decisions/0005).
//!
//! Every change a session records becomes one [`Op`]; ops are handed, in the order
//! they are recorded, to one writer thread ([`writer`]) that applies a run of them
//! per round trip with one script ([`lua::APPLY`]), so a batch (and a group, which is
//! one batch) is atomic, and each change is fenced by the session's owner. A message
//! queued for several sessions is one body in Redis, referred to by each session's
//! record and counted there, so it goes with the last record (on any node).
//!
//! Moving a session ([`fetch`]): the node a client connects to asks the owner to
//! release it (an entry on the message stream, read in order by the owner, which
//! stops storing the session and marks it released after every change it recorded),
//! or takes it from a dead owner (its liveness key expired), then loads it and
//! replays the stream from where the owner stopped, for that session only.
//!
//! A message queued for a connected session is held in memory first and usually
//! cancelled by its acknowledgement with no Redis write at all ([`held`]).

mod adopted;
mod counters;
mod fetch;
mod held;
mod lua;
mod ops;
mod origins;
mod records;
mod sweep;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use statehub_broker::{
    BoxFuture, Broker, Gate, Message, SessionChange, SessionStore, SessionStoreError,
};
use tokio::sync::watch;

pub use counters::SessionCounters;
pub(crate) use fetch::{stream_id, Cut, Fetcher};
pub(crate) use origins::{body_id, origin_of};
pub use records::RecordError;
pub(crate) use statehub_redis_common::Wait;

/// One change as the apply script reads it: an op code and its arguments.
pub(crate) type Op = Vec<Vec<u8>>;

/// How far the writer got: batches written, the last batch as many replicas as asked
/// acknowledged (a `WAIT` covers every earlier write too; without one, `written`), and
/// failures so far (a barrier fails if one happens while it waits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    pub written: u64,
    pub replicated: u64,
    pub failures: u64,
}

/// A message body this node's records refer to.
#[derive(Debug)]
struct Body {
    id: Vec<u8>,
    /// This node's message records referring to it.
    refs: u64,
    /// Its data was sent to Redis with a record.
    sent: bool,
    /// Keeps the address (the map's key) valid, and the data a record refused for
    /// want of its body is written again with (`writer.rs`).
    msg: Arc<Message>,
}

#[derive(Debug, Default)]
struct State {
    open: u32,
    group: Vec<Op>,
    /// Batches handed to the writer.
    submitted: u64,
    closed: u64,
    /// Incarnations this node stores (created here or moved here).
    known: HashSet<u64>,
    /// Incarnations a fetch here is claiming and installing, with where another node
    /// asked for it meanwhile, if one did (see [`Inner::asked`]).
    claiming: HashMap<u64, Option<String>>,
    bodies: FxHashMap<usize, Body>,
    /// Queued messages not handed to the writer yet, by (incarnation, sequence
    /// number): every reply to a persistent session is held here and removed by its
    /// PUBACK ([`held`]).
    held: FxHashMap<(u64, u64), held::Held>,
    /// When the oldest held message was queued.
    held_since: Option<std::time::Instant>,
    /// This node's messages not read back yet, and the tombstones left for them.
    origins: origins::Origins,
    /// Gates to open once the open group is written (see [`Inner::end_group_gated`]).
    gates: Vec<Arc<Gate>>,
}

/// A submission to the writer: its number, its changes, and the gates to open once
/// they are written.
pub(crate) type Batch = (u64, Vec<Op>, Vec<Arc<Gate>>);

/// The [`SessionStore`] in Redis.
#[derive(Debug, Clone)]
pub struct RedisSessions {
    pub(crate) inner: Arc<Inner>,
}

/// What the store's users share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) prefix: String,
    /// This process's owner id (`node#run`): a restarted node is another owner.
    pub(crate) owner: String,
    state: Mutex<State>,
    tx: Mutex<Sender<Batch>>,
    progress: watch::Receiver<Progress>,
    closed: watch::Sender<(u64, u64)>,
    pub(crate) counters: Arc<SessionCounters>,
    pub(crate) fetcher: fetch::Fetcher,
    /// What a session's deadline in Redis adds to its expiry (one sweep period).
    grace_ms: u64,
    /// Whether a session that moved here held any message (see `adopted.rs`): the
    /// reader looks nothing up while none did.
    any_adopted: AtomicBool,
    /// Dropped with the store, which stops the sweeper.
    _sweeper: Sender<()>,
}

fn key(msg: &Arc<Message>) -> usize {
    Arc::as_ptr(msg) as usize
}

fn num(n: impl ToString) -> Vec<u8> {
    n.to_string().into_bytes()
}

impl RedisSessions {
    /// What it counted.
    pub fn counters(&self) -> &SessionCounters {
        &self.inner.counters
    }
}

impl Inner {
    /// The store, its writer, sweeper and flusher threads started; with `wait`, each
    /// of its batches waits for that many replicas.
    pub(crate) fn start(
        client: redis::Client,
        prefix: String,
        owner: String,
        fetcher: fetch::Fetcher,
        (timeout, sweep): (Duration, Duration),
        wait: Option<Wait>,
    ) -> std::io::Result<Arc<Inner>> {
        let (tx, rx) = mpsc::channel();
        let (progress_tx, progress) = watch::channel(Progress::default());
        let counters = Arc::new(SessionCounters::default());
        let store = Arc::new(std::sync::OnceLock::new());
        let writer = writer::Writer {
            client,
            prefix: prefix.clone(),
            owner: owner.clone(),
            timeout,
            rx,
            progress: progress_tx,
            counters: counters.clone(),
            wait,
            store: store.clone(),
        };
        std::thread::Builder::new()
            .name("mqtt-session-writer".into())
            .spawn(move || writer.run())?;
        let (stop_sweeper, stop) = mpsc::channel();
        let sweeper = sweep::Sweeper {
            client: fetcher.client.clone(),
            prefix: prefix.clone(),
            owner: owner.clone(),
            period: sweep,
            timeout,
            counters: counters.clone(),
            stop,
        };
        std::thread::Builder::new()
            .name("mqtt-session-sweeper".into())
            .spawn(move || sweeper.run())?;
        let inner = Arc::new(Inner {
            prefix,
            owner,
            state: Mutex::default(),
            tx: Mutex::new(tx),
            progress,
            closed: watch::Sender::new((0, 0)),
            counters,
            fetcher,
            grace_ms: u64::try_from(sweep.as_millis()).unwrap_or(u64::MAX),
            any_adopted: AtomicBool::new(false),
            _sweeper: stop_sweeper,
        });
        let _ = store.set(Arc::downgrade(&inner));
        held::start_flusher(&inner)?;
        Ok(inner)
    }

    /// Queues `ops` in order: into the open group, or to the writer now.
    fn push(&self, state: &mut State, ops: Vec<Op>) {
        if ops.is_empty() {
            return;
        }
        if state.open > 0 {
            state.group.extend(ops);
            return;
        }
        self.submit(state, ops);
    }

    fn submit(&self, state: &mut State, ops: Vec<Op>) {
        self.submit_gated(state, ops, Vec::new());
    }

    fn submit_gated(&self, state: &mut State, ops: Vec<Op>, gates: Vec<Arc<Gate>>) {
        state.submitted += 1;
        // The writer lives as long as the process; a send fails only at exit.
        let _ = self.tx.lock().send((state.submitted, ops, gates));
    }

    /// The session `incarnation` is stored by this node from now on, with the bodies
    /// of its messages (moved here: they are in Redis already).
    pub(crate) fn adopted(&self, incarnation: u64, bodies: &[(Arc<Message>, Vec<u8>)]) {
        let mut state = self.state.lock();
        state.known.insert(incarnation);
        for (msg, id) in bodies {
            state
                .bodies
                .entry(key(msg))
                .or_insert_with(|| Body {
                    id: id.clone(),
                    refs: 0,
                    sent: true,
                    msg: msg.clone(),
                })
                .refs += 1;
        }
    }

    /// The session `incarnation` left this node for another, which asked at stream
    /// entry `at`: marked released once every change recorded before is written.
    /// `messages` are those its records refer to (this node lets go of them).
    ///
    /// `upto`: every message this node routed to the session is on the stream at or
    /// before this entry, and every one it routed after it left is after it (see
    /// `reader.rs::hand_off`); the node that takes the session does not replay this
    /// node's messages up to it (the session has them).
    pub(crate) fn released(
        &self,
        incarnation: u64,
        at: &str,
        messages: &[Arc<Message>],
        upto: Option<&str>,
    ) {
        let mut state = self.state.lock();
        // Fenced once released: what is held for it (or for any session, which keeps
        // the order simple) goes first.
        self.flush_held(&mut state);
        state.known.remove(&incarnation);
        self.forget_adopted(&mut state, incarnation);
        for msg in messages {
            Self::release_body(&mut state, msg);
        }
        let mut ops = state.origins.quiet_tombstones(incarnation);
        ops.push(vec![
            b"R".to_vec(),
            num(incarnation),
            at.as_bytes().to_vec(),
            self.fetcher.node.as_bytes().to_vec(),
            upto.unwrap_or_default().as_bytes().to_vec(),
        ]);
        self.push(&mut state, ops);
    }

    /// Another node asked, at stream entry `at`, for the session `incarnation`,
    /// which this node does not hold. Released in case this node owns it in Redis
    /// (its install here failed). If a fetch here is claiming it, that fetch must not
    /// install it either: the release may be written after the claim (then the other
    /// node takes it at once) or before (then the fetch releases it again once it
    /// sees this), and a copy installed here would be one Redis no longer lets this
    /// node write, while the other node resumes the real one.
    pub(crate) fn asked(&self, incarnation: u64, at: &str) {
        if let Some(asked) = self.state.lock().claiming.get_mut(&incarnation) {
            *asked = Some(at.to_owned());
        }
        self.released(incarnation, at, &[], None);
    }

    /// Waits until this node's stream writer appended everything handed to it, unless
    /// it holds for a reader elsewhere (`flush.rs`: the reader thread calls this).
    pub(crate) fn flush_stream_unless_held(&self) -> Result<(), crate::flush::FlushError> {
        let f = &self.fetcher;
        crate::flush::flush(&f.writer, &f.hold, crate::flush::Mode::UnlessHeld)
    }

    /// This node applied the message stream up to entry `at`: every change that
    /// applying it recorded is written with (or before) this mark.
    pub(crate) fn applied(&self, at: &str) {
        let mut state = self.state.lock();
        self.push(
            &mut state,
            vec![vec![b"P".to_vec(), at.as_bytes().to_vec()]],
        );
    }
}

impl SessionStore for RedisSessions {
    fn record(&self, change: SessionChange<'_>) {
        self.inner.record(change);
    }

    fn begin_group(&self) {
        self.inner.begin_group();
    }

    fn end_group(&self) {
        self.inner.end_group();
    }

    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        self.inner.barrier()
    }

    fn open_when_stored(&self, gate: Arc<Gate>) {
        self.inner.open_when_stored(gate);
    }

    fn fetch(
        &self,
        broker: &Broker,
        client_id: &str,
    ) -> BoxFuture<'static, Result<bool, SessionStoreError>> {
        fetch::fetch(self.inner.clone(), broker.clone(), client_id.to_owned())
    }
}

impl Inner {
    pub(crate) fn record(&self, change: SessionChange<'_>) {
        let mut state = self.state.lock();
        let ops = self.ops(&mut state, change);
        self.push(&mut state, ops);
        self.flush_due(&mut state);
    }

    pub(crate) fn begin_group(&self) {
        self.state.lock().open += 1;
    }

    pub(crate) fn end_group(&self) {
        self.end_group_gated(None);
    }

    /// Closes a group; `gate` opens once its changes are written (at once if it had
    /// none). Groups overlap: while another is open, this one's changes wait in it.
    pub(crate) fn end_group_gated(&self, gate: Option<Arc<Gate>>) {
        let mut state = self.state.lock();
        state.gates.extend(gate);
        state.open = state.open.saturating_sub(1);
        if state.open > 0 {
            return;
        }
        let group = std::mem::take(&mut state.group);
        let gates = std::mem::take(&mut state.gates);
        if !group.is_empty() {
            self.submit_gated(&mut state, group, gates);
        } else {
            gates.iter().for_each(|g| g.open());
        }
        state.closed += 1;
        self.closed.send_replace((state.closed, state.submitted));
    }

    pub(crate) fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        let mut state = self.state.lock();
        self.flush_held(&mut state);
        let open_group = (state.open > 0).then(|| (state.closed, self.closed.subscribe()));
        let target = state.submitted;
        drop(state);
        let mut progress = self.progress.clone();
        let failures = progress.borrow().failures;
        Box::pin(async move {
            let target = match open_group {
                None => target,
                Some((closed, mut rx)) => match rx.wait_for(|&(n, _)| n > closed).await {
                    Ok(state) => state.1,
                    Err(_) => return Err(store_error("the session store stopped")),
                },
            };
            // Written but not replicated (a shortfall before this barrier began) is
            // not safe either: no later batch may come to cover it.
            let reached = progress
                .wait_for(|p| p.written >= target || p.failures > failures)
                .await
                .map(|p| *p)
                .map_err(|_| store_error("the session store stopped"))?;
            if reached.failures > failures || reached.replicated < target {
                return Err(store_error(
                    "redis out of reach, or the session is owned by another node now",
                ));
            }
            Ok(())
        })
    }
}

/// A [`SessionStoreError`] saying `why`.
pub(crate) fn store_error(why: &str) -> SessionStoreError {
    SessionStoreError(Arc::new(std::io::Error::other(why.to_owned())))
}

#[cfg(test)]
mod late_tests;
#[cfg(test)]
mod replay_tests;
#[cfg(test)]
mod tests;
