//! Hybrid logical clocks: the versions the store gives keys.
//!
//! Wire form `{ms since epoch, 15 digits}:{counter, 5 digits}:{nodeId}`; ordering is wall
//! clock, then counter, then node id as a string. The server issues versions from one
//! [`HlcClock`] with a constant node id, so every version it issues is strictly greater
//! than every earlier one and than every request `__ts` it has observed.
//!
//! One departure from the textbook update rule, for the clients: a request stamped in the
//! very millisecond the server handles it is stepped past (the version is `(ms + 1, 0)`,
//! not `(ms, counter + 1)`; see [`HlcClock::observe_request`]). With the textbook rule a
//! lone writer's versions carry counter 0 or 1 depending on whether its request crossed a
//! millisecond boundary on the way, and the Rust SDK's lease test expects two renewals'
//! fencing tokens to have the same counter.
//!
//! The clock never wraps. A value is in range ([`Stamp::in_range`]) when its counter is at
//! most [`MAX_COUNTER`] (`u64::MAX - 1`, the SDKs' own bound: their clocks refuse a
//! counter that the next increment would overflow) and its wall clock fits the wire
//! form's 15 digits; the store refuses any other `__ts` or `__ft` as `malformed
//! timestamp`, so only values in range reach the clock. The clock itself, once at
//! [`MAX_COUNTER`] (merged from a client, or read back from storage), moves to the next
//! millisecond with counter 0 instead of incrementing: `(w + 1, 0)` is greater than
//! every value of millisecond `w`, so versions still strictly increase, every version is
//! still above every value observed, and fencing tokens (versions handed out in order)
//! keep their order. The price is that the clock runs one millisecond ahead, which an
//! HLC allows. Wrapping instead would hand a later lock holder a lower token than the
//! previous one, making the stale holder's writes win and the current one's fail.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The node id of the real state store, used unless configured otherwise.
pub const DEFAULT_NODE_ID: &str = "state-store";

/// How far ahead of the server clock a `__ts` or `__ft` may be, in milliseconds.
pub const DEFAULT_MAX_SKEW_MS: u64 = 60_000;

/// The greatest counter a value may carry: one more increment must not overflow.
pub const MAX_COUNTER: u64 = u64::MAX - 1;

/// The greatest wall clock the wire form's 15 digits hold (about the year 33658).
pub const MAX_WALL_MS: u64 = 999_999_999_999_999;

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
    /// Appends the wire form, exactly as `Display` writes it
    /// (`{wall_ms:015}:{counter:05}:{node_id}`), without going through `fmt`.
    pub fn put_wire(&self, out: &mut bytes::BytesMut) {
        use bytes::BufMut;
        crate::resp::put_decimal(out, self.wall_ms, 15);
        out.put_u8(b':');
        crate::resp::put_decimal(out, self.counter, 5);
        out.put_u8(b':');
        out.put_slice(self.node_id.as_bytes());
    }

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

/// Reads one all-digits field (no sign, no spaces, as the SDKs format them) that ends
/// at the next ':'; returns its value and what follows the ':'.
fn digits_then_colon(s: &[u8]) -> Result<(u64, &[u8]), HlcParseError> {
    let mut value: u64 = 0;
    for (i, &b) in s.iter().enumerate() {
        match b {
            b'0'..=b'9' => {
                value = value
                    .checked_mul(10)
                    .and_then(|v| v.checked_add(u64::from(b - b'0')))
                    .ok_or(HlcParseError)?;
            }
            b':' if i > 0 => return Ok((value, &s[i + 1..])),
            _ => return Err(HlcParseError),
        }
    }
    Err(HlcParseError)
}

/// Exactly three ':'-separated fields, the first two decimal digits (any width that fits
/// in a u64), the node id anything without ':' (possibly empty).
///
/// Every request's `__ts` is read here, so it is one pass over the bytes rather than a
/// split and two `parse` calls (about a fifth of the instructions, callgrind).
fn fields(s: &str) -> Result<(u64, u64, &str), HlcParseError> {
    let (wall, rest) = digits_then_colon(s.as_bytes())?;
    let (counter, node) = digits_then_colon(rest)?;
    if memchr::memchr(b':', node).is_some() {
        return Err(HlcParseError);
    }
    // The node id is the tail of `s` after an ASCII ':', so a char boundary.
    Ok((wall, counter, &s[s.len() - node.len()..]))
}

impl FromStr for Hlc {
    type Err = HlcParseError;

    fn from_str(s: &str) -> Result<Self, HlcParseError> {
        let (wall_ms, counter, node) = fields(s)?;
        Ok(Self::new(wall_ms, counter, node))
    }
}

/// A clock value without its node id: all that a request's `__ts` is used for (merging
/// into the clock, the skew check) needs, so reading one allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp {
    /// Milliseconds since the Unix epoch.
    pub wall_ms: u64,
    /// Logical counter within one wall-clock millisecond.
    pub counter: u64,
}

impl Stamp {
    /// Whether the clock can merge this value and still advance past it: the counter at
    /// most [`MAX_COUNTER`], the wall clock at most [`MAX_WALL_MS`].
    pub fn in_range(self) -> bool {
        self.counter <= MAX_COUNTER && self.wall_ms <= MAX_WALL_MS
    }
}

impl From<&Hlc> for Stamp {
    fn from(hlc: &Hlc) -> Self {
        Self {
            wall_ms: hlc.wall_ms,
            counter: hlc.counter,
        }
    }
}

impl FromStr for Stamp {
    type Err = HlcParseError;

    /// The same syntax as an [`Hlc`] (the node id must be there, and free of ':').
    fn from_str(s: &str) -> Result<Self, HlcParseError> {
        let (wall_ms, counter, _node) = fields(s)?;
        Ok(Self { wall_ms, counter })
    }
}

/// The server's clock: issues strictly increasing versions under one node id.
#[derive(Debug, Clone)]
pub struct HlcClock {
    wall_ms: u64,
    counter: u64,
    /// Set by a step ([`HlcClock::observe_request`]): `(wall_ms, counter)` is not issued
    /// yet, so the next tick within `wall_ms` issues it instead of incrementing.
    stepped: bool,
    node_id: Arc<str>,
}

impl HlcClock {
    /// A clock at the epoch; the first [`HlcClock::tick`] jumps to the wall clock.
    pub fn new(node_id: impl Into<Arc<str>>) -> Self {
        Self {
            wall_ms: 0,
            counter: 0,
            stepped: false,
            node_id: node_id.into(),
        }
    }

    /// The node id every issued version carries.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The last value issued or observed (or the next one after a step), under this
    /// node's id: never below anything issued or observed.
    pub fn current(&self) -> Hlc {
        Hlc::new(self.wall_ms, self.counter, self.node_id.clone())
    }

    /// Merges a remote value (a request `__ts`, a persisted version) so the next
    /// [`HlcClock::tick`] is greater than it. Does not check skew: see [`check_skew`].
    pub fn observe(&mut self, remote: &Hlc) {
        self.merge(remote.into());
    }

    fn merge(&mut self, remote: Stamp) {
        if (remote.wall_ms, remote.counter) > (self.wall_ms, self.counter) {
            self.wall_ms = remote.wall_ms;
            self.counter = remote.counter;
            self.stepped = false;
        }
    }

    /// Merges a request's `__ts` read at wall clock `now_ms`. Like [`HlcClock::observe`],
    /// except for a stamp from this very millisecond that is at least the clock: the clock
    /// steps to `(now_ms + 1, 0)`, and that is the next version issued. So a request gets
    /// counter 0 whether it reached us within the millisecond it was stamped in or after,
    /// and the clock runs at most one millisecond ahead of the latest wall clock it has
    /// read or been sent (a stamp from a later millisecond is merged as usual).
    pub fn observe_request(&mut self, remote: impl Into<Stamp>, now_ms: u64) {
        let remote = remote.into();
        let dominates = (remote.wall_ms, remote.counter) >= (self.wall_ms, self.counter);
        if remote.wall_ms == now_ms && dominates {
            self.wall_ms = now_ms.saturating_add(1);
            self.counter = 0;
            self.stepped = true;
        } else {
            self.merge(remote);
        }
    }

    /// Issues a new version, greater than everything issued or observed before. A
    /// counter at [`MAX_COUNTER`] (or beyond, read from storage) moves the clock to the next
    /// millisecond rather than wrap (see the module docs); that holds while the wall clock
    /// is below `u64::MAX`, which values in range and a real clock keep it.
    pub fn tick(&mut self, now_ms: u64) -> Hlc {
        if now_ms > self.wall_ms {
            self.wall_ms = now_ms;
            self.counter = 0;
        } else if !self.stepped {
            if self.counter < MAX_COUNTER {
                self.counter += 1;
            } else {
                self.wall_ms = self.wall_ms.saturating_add(1);
                self.counter = 0;
            }
        }
        self.stepped = false;
        self.current()
    }
}

/// Whether `hlc` is at most `max_skew_ms` ahead of `now_ms`.
pub fn check_skew(hlc: impl Into<Stamp>, now_ms: u64, max_skew_ms: u64) -> bool {
    hlc.into().wall_ms <= now_ms.saturating_add(max_skew_ms)
}
