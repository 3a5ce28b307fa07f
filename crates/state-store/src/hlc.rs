//! Hybrid logical clocks: the versions the store gives keys.
//!
//! Wire form `{ms since epoch, 15 digits}:{counter, 5 digits}:{nodeId}`; ordering is wall
//! clock, then counter, then node id as a string. The server issues versions from one
//! [`HlcClock`] with a constant node id, so every version it issues is strictly greater
//! than every earlier one and than every request `__ts` it has observed.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The node id of the real state store, used unless configured otherwise.
pub const DEFAULT_NODE_ID: &str = "state-store";

/// How far ahead of the server clock a `__ts` or `__ft` may be, in milliseconds.
pub const DEFAULT_MAX_SKEW_MS: u64 = 60_000;

/// One hybrid logical clock value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hlc {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// Logical counter within one wall-clock millisecond.
    pub counter: u64,
    /// The node that issued the value; never contains ':'. Shared, since every version
    /// the server issues (and every copy of one) names the same node.
    pub node_id: Arc<str>,
}

/// A string that is not an HLC.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed hybrid logical clock")]
pub struct HlcParseError;

impl Hlc {
    /// A clock value.
    pub fn new(wall_ms: u64, counter: u64, node_id: impl Into<Arc<str>>) -> Self {
        Self {
            wall_ms,
            counter,
            node_id: node_id.into(),
        }
    }
}

impl Ord for Hlc {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.wall_ms, self.counter, &self.node_id).cmp(&(
            other.wall_ms,
            other.counter,
            &other.node_id,
        ))
    }
}

impl PartialOrd for Hlc {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Hlc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:015}:{:05}:{}",
            self.wall_ms, self.counter, self.node_id
        )
    }
}

/// Parses one all-digits field (no sign, no spaces), as the SDKs format them.
fn digits(field: &str) -> Result<u64, HlcParseError> {
    if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HlcParseError);
    }
    field.parse().map_err(|_| HlcParseError)
}

impl FromStr for Hlc {
    type Err = HlcParseError;

    /// Exactly three ':'-separated fields, the first two decimal digits (any width that
    /// fits in a u64), the node id anything without ':' (possibly empty).
    fn from_str(s: &str) -> Result<Self, HlcParseError> {
        let mut parts = s.split(':');
        let (Some(wall), Some(counter), Some(node), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(HlcParseError);
        };
        Ok(Self::new(digits(wall)?, digits(counter)?, node))
    }
}

/// The server's clock: issues strictly increasing versions under one node id.
#[derive(Debug, Clone)]
pub struct HlcClock {
    wall_ms: u64,
    counter: u64,
    node_id: Arc<str>,
}

impl HlcClock {
    /// A clock at the epoch; the first [`HlcClock::tick`] jumps to the wall clock.
    pub fn new(node_id: impl Into<Arc<str>>) -> Self {
        Self {
            wall_ms: 0,
            counter: 0,
            node_id: node_id.into(),
        }
    }

    /// The node id every issued version carries.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The last value issued or observed, under this node's id.
    pub fn current(&self) -> Hlc {
        Hlc::new(self.wall_ms, self.counter, self.node_id.clone())
    }

    /// Merges a remote value (a request `__ts`, a persisted version) so the next
    /// [`HlcClock::tick`] is greater than it. Does not check skew: see [`check_skew`].
    pub fn observe(&mut self, remote: &Hlc) {
        if (remote.wall_ms, remote.counter) > (self.wall_ms, self.counter) {
            self.wall_ms = remote.wall_ms;
            self.counter = remote.counter;
        }
    }

    /// Issues a new version, greater than everything issued or observed before.
    pub fn tick(&mut self, now_ms: u64) -> Hlc {
        if now_ms > self.wall_ms {
            self.wall_ms = now_ms;
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        self.current()
    }
}

/// Whether `hlc` is at most `max_skew_ms` ahead of `now_ms`.
pub fn check_skew(hlc: &Hlc, now_ms: u64, max_skew_ms: u64) -> bool {
    hlc.wall_ms <= now_ms.saturating_add(max_skew_ms)
}
