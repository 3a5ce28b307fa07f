//! The session store's writer: one thread applies the recorded changes in order, as
//! many as are waiting (up to [`MOST`]) per round trip in one script call. A batch
//! that Redis does not answer is retried, in order, until it does; meanwhile every
//! barrier fails (the broker then closes the connection waiting on it, and its client
//! resends after reconnecting). With a [`Wait`], each batch is followed by one `WAIT`
//! in the same pipeline; a batch fewer replicas acknowledged is on the primary but not
//! safe from a failover, so the barriers waiting for it fail (the broker refuses their
//! acknowledgements with 0x80) and it is not written again. Its gates (QoS 2 copies)
//! stay shut until a later `WAIT` sees enough replicas (one is asked every [`RETRY`]
//! while any waits): a copy given before its record is safe from a failover has a
//! packet id the new primary does not know, which it may give to another message.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use redis::{Client, Connection, Script};
use statehub_redis_common::{ShortfallLog, Wait};
use tokio::sync::watch;

use statehub_broker::Gate;

use super::{lua, Batch, Inner, Op, Progress, SessionCounters};
use crate::writer::open;

/// Most changes in one script call.
const MOST: usize = 1024;
/// Pause before a failed batch is tried again.
const RETRY: Duration = Duration::from_millis(250);

pub(super) struct Writer {
    pub client: Client,
    pub prefix: String,
    pub owner: String,
    pub timeout: Duration,
    pub rx: Receiver<Batch>,
    pub progress: watch::Sender<Progress>,
    pub counters: Arc<SessionCounters>,
    pub wait: Option<Wait>,
    /// The store, for the bodies of records Redis refused for want of one.
    pub store: Arc<OnceLock<Weak<Inner>>>,
}

/// What a batch's script call gave: how many changes were fenced, the ordinals of
/// the message records refused only for want of a body, how many replicas
/// acknowledged it.
type Applied = (u64, Vec<u64>, Option<u32>);

impl Writer {
    /// Runs until the store is dropped.
    pub(super) fn run(self) {
        let script = Script::new(lua::APPLY);
        let mut connection: Option<Connection> = None;
        let mut down_logged = false;
        let mut shortfalls = ShortfallLog::default();
        // Gates of copies written but not on enough replicas yet (with a `Wait` only).
        let mut unreplicated: Vec<Arc<Gate>> = Vec::new();
        loop {
            let (mut last, mut ops, mut gates) = match self.rx.recv_timeout(RETRY) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => {
                    if !unreplicated.is_empty() {
                        self.catch_up(&mut connection, &mut unreplicated);
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            while ops.len() < MOST {
                match self.rx.try_recv() {
                    Ok((seq, more, more_gates)) => {
                        last = seq;
                        ops.extend(more);
                        gates.extend(more_gates);
                    }
                    Err(_) => break,
                }
            }
            if ops.is_empty() {
                self.gates_only(last, gates, &mut connection, &mut unreplicated);
                continue;
            }
            loop {
                match self.apply(&script, &mut connection, &ops) {
                    Ok((fenced, bodiless, acked)) => {
                        let (fenced, acked) = match bodiless.is_empty() {
                            true => (fenced, acked),
                            false => {
                                let refused = (fenced, &bodiless[..]);
                                self.with_bodies(&script, &mut connection, &ops, refused)
                            }
                        };
                        let replicated = self.replicated(acked, &mut shortfalls);
                        if down_logged {
                            tracing::info!("mqtt sessions: redis is back; storing again");
                            down_logged = false;
                        }
                        self.written(last, (fenced, replicated), gates, &mut unreplicated);
                        break;
                    }
                    Err(e) => {
                        connection = None;
                        self.counters.failed.fetch_add(1, Ordering::Relaxed);
                        self.progress.send_modify(|p| p.failures += 1);
                        if !down_logged {
                            tracing::warn!(
                                "mqtt sessions: redis out of reach ({e}); acknowledgements that need a session stored are refused until it is back"
                            );
                            down_logged = true;
                        }
                        std::thread::sleep(RETRY);
                    }
                }
            }
        }
    }

    /// A batch was written (`fenced` of its changes refused, `replicated` or not):
    /// counts it, opens its gates if it is safe from a failover, moves the progress.
    fn written(
        &self,
        last: u64,
        (fenced, replicated): (u64, bool),
        gates: Vec<Arc<Gate>>,
        unreplicated: &mut Vec<Arc<Gate>>,
    ) {
        self.counters.written.fetch_add(1, Ordering::Relaxed);
        if fenced > 0 {
            self.counters.fenced.fetch_add(fenced, Ordering::Relaxed);
            tracing::warn!(
                fenced,
                "mqtt sessions: changes to sessions another node owns now (or records of a message whose body only such a change carried) were not stored"
            );
        }
        // The QoS 2 copies these changes stored may go now (with every earlier one: a
        // WAIT covers all writes before it).
        if replicated {
            unreplicated.drain(..).for_each(|g| g.open());
            gates.iter().for_each(|g| g.open());
        } else {
            unreplicated.extend(gates);
        }
        self.progress.send_modify(|p| {
            p.written = last;
            if replicated {
                p.replicated = last;
            }
            if fenced > 0 || !replicated {
                p.failures += 1;
            }
        });
    }

    /// A batch of gates only: every change before them is applied (see
    /// `open_when_stored`), so they open at once unless some of it is not on enough
    /// replicas yet; then they wait with the others for a `WAIT` that sees it there.
    fn gates_only(
        &self,
        last: u64,
        gates: Vec<Arc<Gate>>,
        connection: &mut Option<Connection>,
        unreplicated: &mut Vec<Arc<Gate>>,
    ) {
        let behind = {
            let p = self.progress.borrow();
            p.replicated != p.written
        };
        if !behind && unreplicated.is_empty() {
            gates.iter().for_each(|g| g.open());
            self.progress.send_modify(|p| {
                p.replicated = last;
                p.written = last;
            });
            return;
        }
        unreplicated.extend(gates);
        self.progress.send_modify(|p| p.written = last);
        self.catch_up(connection, unreplicated);
    }

    /// Asks whether enough replicas have everything written so far: a small write of
    /// this writer's own mark, then `WAIT` (which covers every write before it, on any
    /// connection; a fresh connection's `WAIT` without a write of its own would count
    /// replicas that have nothing). If they do, the waiting gates open and everything
    /// written counts as replicated.
    fn catch_up(&self, connection: &mut Option<Connection>, unreplicated: &mut Vec<Arc<Gate>>) {
        let Some(wait) = self.wait else {
            unreplicated.drain(..).for_each(|g| g.open());
            return;
        };
        let con = match connection {
            Some(con) => con,
            None => match open(&self.client, self.timeout) {
                Ok(con) => connection.insert(con),
                Err(_) => return,
            },
        };
        let millis = u64::try_from(wait.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(format!("{}wait-mark:{}", self.prefix, self.owner))
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .ignore()
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(millis);
        match pipe.query::<(u32,)>(con) {
            Ok((acked,)) if acked >= wait.replicas => {
                unreplicated.drain(..).for_each(|g| g.open());
                self.progress.send_modify(|p| p.replicated = p.written);
            }
            Ok(_) => {}
            Err(_) => *connection = None,
        }
    }

    /// Whether enough replicas acknowledged a batch (`acked` of them; `None`: not
    /// asked). A shortfall is counted and logged at most every 10 s.
    fn replicated(&self, acked: Option<u32>, shortfalls: &mut ShortfallLog) -> bool {
        let (Some(wait), Some(acked)) = (self.wait, acked) else {
            return true;
        };
        if acked >= wait.replicas {
            return true;
        }
        if let Some(batches) = shortfalls.count(&self.counters.not_replicated) {
            tracing::warn!(
                batches,
                "mqtt sessions: redis WAIT: {acked} of {} replicas acknowledged within {:?}; acknowledgements that need these session changes are refused with 0x80",
                wait.replicas,
                wait.timeout
            );
        }
        false
    }

    /// The message records at `bodiless` (ordinals from 1) of the batch `ops` were
    /// refused only because Redis has no body for them (the record that carried it
    /// was for a session another node owns now, and refused). They are sent again
    /// with their bodies, until Redis answers, so that the copy a gate of this batch
    /// holds back is stored before it goes: one given unstored has a packet id a
    /// node its session moves to gives to another message (decision 0005, "No QoS 2
    /// copy goes out unstored"). A record a later change of the batch deletes, or
    /// whose body this node let go (no session here holds the message), is left.
    /// Returns how many changes stay fenced and the replicas of the last call.
    fn with_bodies(
        &self,
        script: &Script,
        connection: &mut Option<Connection>,
        ops: &[Op],
        (fenced, bodiless): (u64, &[u64]),
    ) -> (u64, Option<u32>) {
        let store = self.store.get().and_then(Weak::upgrade);
        let mut again = Vec::new();
        for at in bodiless
            .iter()
            .filter_map(|n| usize::try_from(*n).ok()?.checked_sub(1))
        {
            let Some(op) = ops.get(at) else { continue };
            if op.len() != 6 || ops[at + 1..].iter().any(|later| deletes(later, op)) {
                continue;
            }
            if let Some(data) = store.as_ref().and_then(|s| s.body_data(&op[4])) {
                let mut op = op.clone();
                op[5] = data;
                again.push(op);
            }
        }
        // Not kept alive by this thread while it retries below.
        drop(store);
        let left = fenced.saturating_sub(bodiless.len() as u64);
        if again.is_empty() {
            return (left, None);
        }
        loop {
            match self.apply(script, connection, &again) {
                Ok((still, _, acked)) => return (left + still, acked),
                Err(_) => {
                    *connection = None;
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    self.progress.send_modify(|p| p.failures += 1);
                    std::thread::sleep(RETRY);
                }
            }
        }
    }

    /// Runs the batch (and `WAIT`, with [`Writer::wait`]): how many changes were
    /// fenced, the records refused for want of a body, how many replicas
    /// acknowledged.
    fn apply(
        &self,
        script: &Script,
        connection: &mut Option<Connection>,
        ops: &[Op],
    ) -> redis::RedisResult<Applied> {
        let con = match connection {
            Some(con) => con,
            None => connection.insert(open(&self.client, self.timeout)?),
        };
        let mut invocation = script.prepare_invoke();
        invocation.arg(&self.prefix).arg(&self.owner);
        for op in ops {
            for arg in op {
                invocation.arg(arg.as_slice());
            }
        }
        let (out, acked): (Vec<u64>, _) =
            statehub_redis_common::invoke(con, &invocation, self.wait)?;
        let fenced = out.first().copied().unwrap_or(0);
        Ok((fenced, out.get(1..).unwrap_or_default().to_vec(), acked))
    }
}

/// Whether change `later` deletes the message record `op` (`M`, incarnation, seq).
fn deletes(later: &Op, op: &Op) -> bool {
    match later.first().map(Vec::as_slice) {
        Some(b"D") => later.get(1..3) == op.get(1..3),
        Some(b"E") => later.get(1) == op.get(1),
        _ => false,
    }
}

impl Inner {
    /// Opens `gate` once the writer is past every change recorded so far: with the
    /// open group's if it holds any, else after what was handed to the writer (it
    /// retries a batch until Redis answers it, in order).
    pub(crate) fn open_when_stored(&self, gate: Arc<Gate>) {
        let mut state = self.state.lock();
        if state.open > 0 && !state.group.is_empty() {
            state.gates.push(gate);
            return;
        }
        self.submit_gated(&mut state, Vec::new(), vec![gate]);
    }
}
