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
use std::sync::Arc;
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
}

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
                    Ok((fenced, acked)) => {
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

    /// Runs the batch (and `WAIT`, with [`Writer::wait`]): how many changes were fenced,
    /// and how many replicas acknowledged.
    fn apply(
        &self,
        script: &Script,
        connection: &mut Option<Connection>,
        ops: &[Op],
    ) -> redis::RedisResult<(u64, Option<u32>)> {
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
        statehub_redis_common::invoke(con, &invocation, self.wait)
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
