//! Rates a client controls: new connections per source address
//! (`connect_rate_per_address`, refused with CONNACK 0x9F) and PUBLISH packets per
//! connection (`max_publish_rate`, closed with DISCONNECT 0x96). Both are token
//! buckets: a burst up to the bucket's size, then the sustained rate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use parking_lot::Mutex;

use crate::pending::Source;

/// Sources tracked at once. Past it, sources whose bucket has refilled are
/// forgotten (they are as if never seen); if every one is still draining, a new
/// source is let through untracked: the table's memory stays bounded, and the
/// pending-connection limits still hold.
const MAX_SOURCES: usize = 65_536;

/// A token bucket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket.
    pub(crate) fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: f64::from(burst),
            at: now,
        }
    }

    /// Refills for the time since the last call, then takes one token if there is one.
    pub(crate) fn take(&mut self, now: Instant, rate: u32, burst: u32) -> bool {
        self.refill(now, rate, burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Instant, rate: u32, burst: u32) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * f64::from(rate)).min(f64::from(burst));
        self.at = self.at.max(now);
    }
}

/// New connections per source address (IPv4 address, IPv6 /64).
#[derive(Debug)]
pub(crate) struct ConnectRate {
    rate: u32,
    burst: u32,
    sources: Mutex<HashMap<Source, Bucket>>,
}

impl ConnectRate {
    /// `rate` per second after a burst of `burst`; a `rate` of 0 admits everything.
    pub(crate) fn new(rate: u32, burst: u32) -> ConnectRate {
        ConnectRate {
            rate,
            burst: burst.max(1),
            sources: Mutex::new(HashMap::new()),
        }
    }

    /// Whether one more connection from `ip` is within the rate.
    pub(crate) fn admit(&self, ip: IpAddr, now: Instant) -> bool {
        if self.rate == 0 {
            return true;
        }
        let (rate, burst) = (self.rate, self.burst);
        let source = Source::of(ip);
        let mut sources = self.sources.lock();
        if !sources.contains_key(&source) && sources.len() >= MAX_SOURCES {
            sources.retain(|_, b| {
                b.refill(now, rate, burst);
                b.tokens < f64::from(burst)
            });
            if sources.len() >= MAX_SOURCES {
                return true;
            }
        }
        sources
            .entry(source)
            .or_insert_with(|| Bucket::full(burst, now))
            .take(now, rate, burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate_per_source() {
        let limit = ConnectRate::new(2, 3);
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!((0..3).all(|_| limit.admit(a, t0)));
        assert!(!limit.admit(a, t0), "past the burst");
        assert!(limit.admit(b, t0), "another source has its own bucket");
        let later = t0 + Duration::from_millis(500);
        assert!(limit.admit(a, later), "one more after half a second at 2/s");
        assert!(!limit.admit(a, later));
        // An IPv6 host is counted by its /64.
        let v6a: IpAddr = "2001:db8::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8::2".parse().unwrap();
        assert!((0..3).all(|_| limit.admit(v6a, t0)));
        assert!(!limit.admit(v6b, t0));
    }

    #[test]
    fn zero_is_no_limit() {
        let limit = ConnectRate::new(0, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert!((0..10_000).all(|_| limit.admit(ip, Instant::now())));
    }
}
