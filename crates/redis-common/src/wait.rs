//! Synchronous replication on request (`[cluster] redis_wait_replicas`).
//!
//! Redis replicates asynchronously: a write it answered may not be on any replica yet,
//! and a failover to a replica then loses it. With a [`Wait`], each check-and-write
//! script is followed by `WAIT replicas timeout` in the same pipeline (one round trip),
//! and the write counts as done only if at least that many replicas acknowledged it
//! within the timeout. Otherwise the request fails as when Redis is out of reach: the
//! write happened on the primary and may or may not survive a failover, which is what a
//! 503 tells a client (a `-ERR` would say the store refused it and changed nothing).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::{Connection, ErrorKind, FromRedisValue, RedisResult, ScriptInvocation};

/// How many replicas must have a write before it is acknowledged, and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// At least 1.
    pub replicas: u32,
    /// At least 1 ms (`WAIT` with 0 would block for ever), below the call timeout.
    pub timeout: Duration,
}

impl Wait {
    /// Ends `pipe` with `WAIT replicas timeout`, whose reply is how many replicas have
    /// every write of the connection so far.
    pub fn add_to(self, pipe: &mut redis::Pipeline) {
        pipe.cmd("WAIT").arg(self.replicas).arg(self.millis());
    }

    /// The timeout in whole milliseconds, at least 1 (`WAIT` with 0 blocks for ever).
    pub fn millis(self) -> u64 {
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

/// The replicas that have a write, when fewer than asked.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("redis WAIT: {acked} of {wanted} replicas acknowledged the write within {timeout:?}; it may be lost in a failover")]
pub struct NotReplicated {
    pub acked: u32,
    pub wanted: u32,
    pub timeout: Duration,
}

/// Runs `invocation`, then `WAIT` if `wait` is given, in one pipeline: the script's
/// reply and how many replicas acknowledged it.
pub fn invoke<T: FromRedisValue>(
    con: &mut Connection,
    invocation: &ScriptInvocation<'_>,
    wait: Option<Wait>,
) -> RedisResult<(T, Option<u32>)> {
    let Some(wait) = wait else {
        return Ok((invocation.invoke(con)?, None));
    };
    let mut pipe = redis::pipe();
    pipe.invoke_script(invocation);
    wait.add_to(&mut pipe);
    let (reply, acked): (T, u32) = match pipe.query(con) {
        // A pipeline does not load a script Redis lost (a restart): load it, run again.
        Err(e) if e.kind() == ErrorKind::NoScriptError => {
            invocation.load(con)?;
            pipe.query(con)?
        }
        other => other?,
    };
    Ok((reply, Some(acked)))
}

/// `Err` if fewer replicas than `wait` asks acknowledged the write.
pub fn check(wait: Option<Wait>, acked: Option<u32>) -> Result<(), NotReplicated> {
    match (wait, acked) {
        (Some(wait), Some(acked)) if acked < wait.replicas => Err(NotReplicated {
            acked,
            wanted: wait.replicas,
            timeout: wait.timeout,
        }),
        _ => Ok(()),
    }
}

/// Counts writes fewer replicas acknowledged than asked and says when to log one: at
/// most every [`ShortfallLog::EVERY`], so a replica that is down does not flood the log.
#[derive(Debug, Default)]
pub struct ShortfallLog {
    logged_at: Option<Instant>,
}

impl ShortfallLog {
    /// The least time between two log lines.
    pub const EVERY: Duration = Duration::from_secs(10);

    /// Counts one shortfall in `counter`; `Some(count so far)` if it is to be logged now.
    pub fn count(&mut self, counter: &AtomicU64) -> Option<u64> {
        let count = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        if self
            .logged_at
            .is_some_and(|at| now.duration_since(at) < Self::EVERY)
        {
            return None;
        }
        self.logged_at = Some(now);
        Some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shortfall_is_counted_and_the_log_is_rate_limited() {
        let counter = AtomicU64::new(0);
        let mut log = ShortfallLog::default();
        assert_eq!(log.count(&counter), Some(1), "the first one is logged");
        assert_eq!(log.count(&counter), None, "the next within EVERY is not");
        assert_eq!(log.count(&counter), None);
        assert_eq!(counter.load(Ordering::Relaxed), 3, "but each is counted");
    }
}
