//! A latency histogram that hot paths record into with two relaxed atomic adds (no
//! lock, no allocation), and that the metrics endpoint reads at scrape time.
//!
//! Buckets are powers of two of microseconds, from 8 µs to about 16.8 s (22 bounds and
//! +Inf): the bucket of a duration is found with one `leading_zeros`, with no search,
//! and doubling bounds cover both a memory request (microseconds) and an fsync on a
//! slow disk (seconds) with one layout. Prometheus' `histogram_quantile` interpolates
//! within a bucket, so a factor of two between bounds is enough to tell a regression.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// log2 of the first bucket's upper bound in microseconds (8 µs).
const FIRST_SHIFT: u32 = 3;
/// Finite bucket bounds: 2^3 .. 2^24 µs.
pub const BOUNDS: usize = 22;

/// Counts of durations per bucket, and their sum.
#[derive(Debug)]
pub struct Histogram {
    /// Non-cumulative counts; the last slot is +Inf.
    buckets: [AtomicU64; BOUNDS + 1],
    sum_ns: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one duration.
    pub fn record(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// What was recorded so far.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let mut buckets = [(0.0, 0); BOUNDS + 1];
        for (i, (slot, n)) in buckets.iter_mut().zip(&self.buckets).enumerate() {
            cumulative += n.load(Ordering::Relaxed);
            *slot = (upper_bound_secs(i), cumulative);
        }
        HistogramSnapshot {
            buckets,
            count: cumulative,
            sum_secs: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

/// A histogram as read at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound in seconds, cumulative count), the last bound `f64::INFINITY`.
    pub buckets: [(f64, u64); BOUNDS + 1],
    /// Durations recorded.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_secs: f64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        Histogram::default().snapshot()
    }
}

/// The bucket of a duration of `ns` nanoseconds: the first whose bound it does not
/// exceed.
fn bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    // ceil(log2(us)), 0 for 0 and 1 µs.
    let log2 = u64::BITS - us.saturating_sub(1).leading_zeros();
    (log2.saturating_sub(FIRST_SHIFT) as usize).min(BOUNDS)
}

fn upper_bound_secs(i: usize) -> f64 {
    if i >= BOUNDS {
        return f64::INFINITY;
    }
    (1u64 << (i as u32 + FIRST_SHIFT)) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_the_first_bucket_it_fits() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(8_000), 0, "8 µs is within the 8 µs bound");
        assert_eq!(bucket(8_001), 1);
        assert_eq!(bucket(16_000), 1);
        assert_eq!(bucket(1_000_000), 7, "1 ms: bound 1.024 ms");
        assert_eq!(bucket(u64::MAX), BOUNDS, "+Inf");
        assert!((upper_bound_secs(7) - 0.001024).abs() < 1e-12);
    }

    #[test]
    fn snapshot_is_cumulative_with_sum_and_count() {
        let h = Histogram::default();
        h.record(Duration::from_micros(5));
        h.record(Duration::from_millis(1));
        h.record(Duration::from_secs(100));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.000008, 1));
        assert_eq!(s.buckets[7].1, 2);
        assert_eq!(s.buckets[BOUNDS - 1].1, 2);
        assert_eq!(s.buckets[BOUNDS], (f64::INFINITY, 3));
        assert!((s.sum_secs - 100.001005).abs() < 1e-9);
    }
}
