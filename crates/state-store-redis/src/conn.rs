//! One blocking connection to Redis, made again after it breaks.
//!
//! The state store's machine runs a request start to end under its lock, so its engine
//! talks to Redis synchronously, one command (most often one script) at a time, on the
//! thread that handles the request. Every call is bounded by the configured timeout.
//! After a failed attempt to connect, calls fail at once for [`RECONNECT_BACKOFF`], so
//! that while Redis is down each request is refused quickly instead of each waiting for
//! a connect timeout.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisError, RedisResult, Value};

use crate::RedisEngineError;

/// How long calls fail at once after an attempt to connect failed.
pub const RECONNECT_BACKOFF: Duration = Duration::from_millis(250);

/// What a node's state store counted of its calls to Redis.
#[derive(Debug, Default)]
pub struct Counters {
    /// Calls made (each one round trip: a command, a script, or a script with its
    /// `WAIT`).
    pub calls: AtomicU64,
    /// Calls that failed: Redis out of reach or too slow (the request answered 503),
    /// refused without trying during [`RECONNECT_BACKOFF`], or answered with an error.
    pub errors: AtomicU64,
    /// Writes fewer replicas acknowledged than `wait` asks (answered 503).
    pub not_replicated: AtomicU64,
}

/// A connection that reconnects.
pub(crate) struct Link {
    client: Client,
    counters: Arc<Counters>,
    connection: Option<Connection>,
    /// Set after a failed connect: no new attempt before then.
    retry_at: Option<Instant>,
    timeout: Duration,
    /// The connection's name in Redis (`CLIENT LIST`).
    name: String,
    /// Whether scripts may be missing from the server: a connection made since they
    /// were last loaded (a restarted server lost them), or a `NOSCRIPT` seen.
    unloaded: bool,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("server", &self.client.get_connection_info().addr)
            .field("connected", &self.connection.is_some())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Link {
    /// `name` names the connection in Redis (`CLIENT SETNAME`), so that an operator
    /// (or a test) tells the store's connections from the node's others.
    pub(crate) fn new(client: Client, timeout: Duration, name: &str) -> Self {
        Self {
            client,
            counters: Arc::default(),
            connection: None,
            retry_at: None,
            timeout,
            name: client_name(name),
            unloaded: true,
        }
    }

    /// Runs `call` on the connection, connecting first if needed. A failure that may
    /// have broken the connection (I/O, a timeout) drops it, so the next call connects
    /// anew.
    pub(crate) fn run<T>(
        &mut self,
        call: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> Result<T, RedisEngineError> {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let result = call(self.connected()?);
        self.ended(result)
    }

    /// Sends `packed` (`count` commands) and reads their replies one at a time, stopping
    /// at the first that fails to arrive (an I/O error, the read timeout): the replies
    /// read, and that failure. The connection is then dropped (replies may still be
    /// due on it), so a stalled Redis costs one timeout, not one per command.
    pub(crate) fn exchange(
        &mut self,
        packed: &[u8],
        count: usize,
    ) -> (Vec<Value>, Option<RedisEngineError>) {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        let con = match self.connected() {
            Ok(con) => con,
            Err(error) => return (Vec::new(), Some(error)),
        };
        let (values, failure) = read_replies(con, packed, count);
        let Some(error) = failure else {
            return (values, None);
        };
        self.connection = None;
        (values, self.ended::<()>(Err(error)).err())
    }

    /// Whether the scripts that pipelines send by their hash are known to be loaded
    /// on the current connection (see [`Link::scripts_loaded`]): not before a
    /// connection is made (a restarted server lost them), nor after a `NOSCRIPT`.
    pub(crate) fn has_scripts(&self) -> bool {
        self.connection.is_some() && !self.unloaded
    }

    /// A call that loaded them succeeded on the current connection.
    pub(crate) fn scripts_loaded(&mut self) {
        self.unloaded = false;
    }

    /// The connection, connecting first if needed (a failure counted).
    fn connected(&mut self) -> Result<&mut Connection, RedisEngineError> {
        let counters = self.counters.clone();
        self.connect().inspect_err(|_| {
            counters.errors.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// A call's result: a failure that may have broken the connection (I/O, a timeout)
    /// drops it, so the next call connects anew.
    fn ended<T>(&mut self, result: RedisResult<T>) -> Result<T, RedisEngineError> {
        result.map_err(|error| {
            self.counters.errors.fetch_add(1, Ordering::Relaxed);
            if error.is_io_error() || error.is_timeout() || error.is_unrecoverable_error() {
                self.connection = None;
            }
            error.into()
        })
    }

    /// The server answered `NOSCRIPT`: the next pipeline loads them first.
    pub(crate) fn scripts_missing(&mut self) {
        self.unloaded = true;
    }

    pub(crate) fn count_into(&mut self, counters: Arc<Counters>) {
        self.counters = counters;
    }

    /// What it counted.
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    fn connect(&mut self) -> Result<&mut Connection, RedisEngineError> {
        if self.connection.is_none() {
            if self.retry_at.is_some_and(|at| Instant::now() < at) {
                return Err(RedisEngineError::Backoff);
            }
            let named = open(&self.client, self.timeout).and_then(|mut connection| {
                redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(&self.name)
                    .query::<()>(&mut connection)?;
                Ok(connection)
            });
            match named {
                Ok(connection) => {
                    self.retry_at = None;
                    self.unloaded = true;
                    self.connection = Some(connection);
                }
                Err(error) => {
                    self.retry_at = Some(Instant::now() + RECONNECT_BACKOFF);
                    return Err(error.into());
                }
            }
        }
        self.connection.as_mut().ok_or(RedisEngineError::Backoff)
    }
}

/// Sends `packed` and reads up to `count` replies (push messages skipped), stopping at
/// the first read that fails.
fn read_replies(
    con: &mut Connection,
    packed: &[u8],
    count: usize,
) -> (Vec<Value>, Option<RedisError>) {
    if let Err(error) = con.send_packed_command(packed) {
        return (Vec::new(), Some(error));
    }
    let mut values = Vec::with_capacity(count);
    while values.len() < count {
        match con.recv_response() {
            Ok(Value::Push { .. }) => {}
            Ok(value) => values.push(value),
            Err(error) => return (values, Some(error)),
        }
    }
    (values, None)
}

/// A new connection whose every read and write is bounded by `timeout`.
pub(crate) fn open(client: &Client, timeout: Duration) -> RedisResult<Connection> {
    let connection = client.get_connection_with_timeout(timeout)?;
    connection.set_read_timeout(Some(timeout))?;
    connection.set_write_timeout(Some(timeout))?;
    Ok(connection)
}

/// `name` as a Redis connection name: no spaces or other unprintable bytes.
fn client_name(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect()
}
