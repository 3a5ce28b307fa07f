//! How a store syncs and how much it lets callers queue.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// When a completed ticket's batch reaches stable storage. See the crate docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// `fdatasync` before any ticket of the group completes (group commit: writers that
    /// arrive while one sync runs share the next). Nothing acknowledged is ever lost.
    #[default]
    Always,
    /// Tickets complete once their batch is written to the operating system; an
    /// `fdatasync` runs at most this long after a commit. Survives `kill -9`; a power
    /// failure or kernel crash may lose the last interval of acknowledged writes.
    Interval(Duration),
}

/// `--sync` values other than `always` and `interval=<ms>` (ms from 1 to one hour).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sync policy {0:?}: expected `always` or `interval=<ms>` with 1 <= ms <= 3600000")]
pub struct SyncPolicyParseError(pub String);

/// Longest `interval=<ms>`: an hour. Longer windows are almost surely a typo.
const MAX_INTERVAL_MS: u64 = 3_600_000;

impl FromStr for SyncPolicy {
    type Err = SyncPolicyParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "always" {
            return Ok(Self::Always);
        }
        let ms = s
            .strip_prefix("interval=")
            .and_then(|ms| ms.parse::<u64>().ok())
            .filter(|ms| (1..=MAX_INTERVAL_MS).contains(ms))
            .ok_or_else(|| SyncPolicyParseError(s.to_owned()))?;
        Ok(Self::Interval(Duration::from_millis(ms)))
    }
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Always => f.write_str("always"),
            Self::Interval(d) => write!(f, "interval={}", d.as_millis()),
        }
    }
}

/// Options of [`crate::Store::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// When tickets complete.
    pub sync: SyncPolicy,
    /// Bytes (keys plus values) submitted but not yet committed above which
    /// [`crate::Store::admit`] makes callers wait.
    pub max_pending_bytes: usize,
    /// Size of a journal segment. Each is a file of this many zeros, written and synced
    /// before it is needed (by the compactor thread, or at open), which commits then
    /// overwrite: an `fdatasync` after an append also writes the file's size, one more
    /// I/O per commit. The committer starts a new segment once the current one holds
    /// this much.
    pub segment_bytes: u64,
    /// How much closed journal the compactor waits for before it folds it into a new
    /// snapshot: half the snapshot's size, and at least this. Smaller keeps a small
    /// store's disk footprint smaller at the cost of compacting more often: each
    /// compaction reads the journal it folds and rewrites the snapshot, work taken from
    /// the requests when they share a core. The default, 64 MiB, is what Redis waits for
    /// before it first rewrites its append-only file.
    pub compact_after_bytes: u64,
    /// Closed journal the compactor may leave unfolded before commits wait for it (or
    /// twice the compaction threshold, if that is more): the bound that keeps the journal,
    /// and so the disk used and the start-up time, finite under a write flood however
    /// little CPU the compactor gets. Writes past it are acknowledged only as the
    /// compactor catches up (and state store requests wait for admission meanwhile).
    pub max_journal_bytes: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sync: SyncPolicy::Always,
            max_pending_bytes: 64 << 20,
            segment_bytes: 8 << 20,
            compact_after_bytes: 64 << 20,
            max_journal_bytes: 256 << 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("always".parse(), Ok(SyncPolicy::Always));
        assert_eq!(
            "interval=250".parse(),
            Ok(SyncPolicy::Interval(Duration::from_millis(250)))
        );
        for bad in [
            "",
            "Always",
            "interval=",
            "interval=0",
            "interval=-1",
            "interval=1s",
            "interval=3600001",
            "never",
        ] {
            assert!(bad.parse::<SyncPolicy>().is_err(), "{bad:?} accepted");
        }
        for policy in [
            SyncPolicy::Always,
            SyncPolicy::Interval(Duration::from_millis(7)),
        ] {
            assert_eq!(policy.to_string().parse(), Ok(policy));
        }
    }
}
