//! The session store's writer: one thread applies the recorded changes in order, as
//! many as are waiting (up to [`MOST`]) per round trip in one script call. A batch
//! that Redis does not answer is retried, in order, until it does; meanwhile every
//! barrier fails (the broker then closes the connection waiting on it, and its client
//! resends after reconnecting). With a [`Wait`], each batch is followed by one `WAIT`
//! in the same pipeline; a batch fewer replicas acknowledged is on the primary but not
//! safe from a failover, so the barriers waiting for it fail (the broker refuses their
//! acknowledgements with 0x80) and it is not written again.

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
        loop {
            let (mut last, mut ops, mut gates) = match self.rx.recv_timeout(RETRY) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => continue,
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
                // Only gates: every change before them is applied (see `open_when_stored`).
                gates.iter().for_each(|g| g.open());
                self.progress.send_modify(|p| {
                    if p.replicated == p.written {
                        p.replicated = last;
                    }
                    p.written = last;
                });
                continue;
            }
            loop {
                match self.apply(&script, &mut connection, &ops) {
                    Ok((fenced, acked)) => {
                        let replicated = self.replicated(acked, &mut shortfalls);
                        self.counters.written.fetch_add(1, Ordering::Relaxed);
                        if down_logged {
                            tracing::info!("mqtt sessions: redis is back; storing again");
                            down_logged = false;
                        }
                        if fenced > 0 {
                            self.counters.fenced.fetch_add(fenced, Ordering::Relaxed);
                            tracing::warn!(
                                fenced,
                                "mqtt sessions: changes to sessions another node owns now (or records of a message whose body only such a change carried) were not stored"
                            );
                        }
                        // The QoS 2 copies these changes stored may go now.
                        gates.iter().for_each(|g| g.open());
                        self.progress.send_modify(|p| {
                            p.written = last;
                            if replicated {
                                p.replicated = last;
                            }
                            if fenced > 0 || !replicated {
                                p.failures += 1;
                            }
                        });
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
