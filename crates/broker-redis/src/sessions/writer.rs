//! The session store's writer: one thread applies the recorded changes in order, as
//! many as are waiting (up to [`MOST`]) per round trip in one script call. A batch
//! that Redis does not answer is retried, in order, until it does; meanwhile every
//! barrier fails (the broker then closes the connection waiting on it, and its client
//! resends after reconnecting).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection, Script};
use tokio::sync::watch;

use super::{lua, Op, Progress, SessionCounters};
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
    pub rx: Receiver<(u64, Vec<Op>)>,
    pub progress: watch::Sender<Progress>,
    pub counters: Arc<SessionCounters>,
}

impl Writer {
    /// Runs until the store is dropped.
    pub(super) fn run(self) {
        let script = Script::new(lua::APPLY);
        let mut connection: Option<Connection> = None;
        let mut down_logged = false;
        loop {
            let (mut last, mut ops) = match self.rx.recv_timeout(RETRY) {
                Ok(first) => first,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            while ops.len() < MOST {
                match self.rx.try_recv() {
                    Ok((seq, more)) => {
                        last = seq;
                        ops.extend(more);
                    }
                    Err(_) => break,
                }
            }
            loop {
                match self.apply(&script, &mut connection, &ops) {
                    Ok(fenced) => {
                        if down_logged {
                            tracing::info!("mqtt sessions: redis is back; storing again");
                            down_logged = false;
                        }
                        if fenced > 0 {
                            self.counters.fenced.fetch_add(fenced, Ordering::Relaxed);
                            tracing::warn!(
                                fenced,
                                "mqtt sessions: changes to sessions another node owns now were not stored"
                            );
                        }
                        self.progress.send_modify(|p| {
                            p.written = last;
                            if fenced > 0 {
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

    fn apply(
        &self,
        script: &Script,
        connection: &mut Option<Connection>,
        ops: &[Op],
    ) -> redis::RedisResult<u64> {
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
        invocation.invoke(con)
    }
}
