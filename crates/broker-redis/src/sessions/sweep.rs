//! The sweeper: once per period one live node runs [`lua::SWEEP`], so that a session
//! whose owner died while its client was connected, or that nobody claimed, is
//! forgotten at its expiry with the bodies it referred to, as its owner would have
//! (docs/decisions/0005). Bounded work per script call ([`MOST`]); a full round is
//! followed by another at once.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection, Script};

use super::{lua, SessionCounters};
use crate::writer::open;

/// Most sessions one script call handles.
pub(super) const MOST: i64 = 128;

pub(super) struct Sweeper {
    pub client: Client,
    pub prefix: String,
    pub owner: String,
    pub period: Duration,
    pub timeout: Duration,
    pub counters: Arc<SessionCounters>,
    /// Disconnected when the store is dropped: the sweeper stops.
    pub stop: Receiver<()>,
}

impl Sweeper {
    pub(super) fn run(self) {
        let script = Script::new(lua::SWEEP);
        let mut connection: Option<Connection> = None;
        loop {
            match self.stop.recv_timeout(self.period) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            loop {
                match self.round(&script, &mut connection) {
                    Ok(true) => continue,
                    Ok(false) => break,
                    Err(e) => {
                        tracing::debug!("mqtt sessions: sweep failed ({e}); next period");
                        connection = None;
                        break;
                    }
                }
            }
        }
    }

    /// One script call; whether it reached its limit (more may be due).
    fn round(
        &self,
        script: &Script,
        connection: &mut Option<Connection>,
    ) -> redis::RedisResult<bool> {
        let con = match connection {
            Some(con) => con,
            None => connection.insert(open(&self.client, self.timeout)?),
        };
        let period = u64::try_from(self.period.as_millis()).unwrap_or(u64::MAX);
        let (status, started, forgotten): (i64, i64, i64) = script
            .arg(&self.prefix)
            .arg(&self.owner)
            .arg(period)
            .arg(MOST)
            .invoke(con)?;
        if status != 0 {
            return Ok(false);
        }
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        self.counters
            .expiring
            .fetch_add(n(started), Ordering::Relaxed);
        self.counters
            .swept
            .fetch_add(n(forgotten), Ordering::Relaxed);
        if forgotten > 0 || started > 0 {
            tracing::debug!(started, forgotten, "mqtt sessions: swept");
        }
        Ok(started + forgotten >= MOST)
    }
}
