//! Rate limiting for log lines a client can cause at will (a refused packet, a
//! dropped message): the first goes out, then at most one per interval, each saying
//! how many were left out since the last. Counters in [`crate::Metrics`] count them all.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let ms = EPOCH.get_or_init(Instant::now).elapsed().as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// One log line per interval; meant for a `static` at the call site.
#[derive(Debug)]
pub struct LogLimit {
    interval_ms: u64,
    next_ms: AtomicU64,
    left_out: AtomicU64,
}

impl LogLimit {
    pub const fn per_secs(secs: u64) -> LogLimit {
        LogLimit {
            interval_ms: secs * 1000,
            next_ms: AtomicU64::new(0),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(n)` if this occurrence may be logged, `n` being how many were not since
    /// the last one that was; `None` if it is to be left out.
    pub fn allow(&self) -> Option<u64> {
        let now = now_ms();
        let next = self.next_ms.load(Ordering::Relaxed);
        let mine = now >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now + self.interval_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok();
        if mine {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_goes_out_then_one_per_interval_with_the_count_left_out() {
        let limit = LogLimit::per_secs(3600);
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        // Pretend the interval passed.
        limit.next_ms.store(0, Ordering::Relaxed);
        assert_eq!(limit.allow(), Some(2));
        let zero = LogLimit::per_secs(0);
        assert_eq!(zero.allow(), Some(0));
        assert_eq!(zero.allow(), Some(0));
    }
}
