//! Rates a client controls: new connections per source address
//! (`connect_rate_per_address`, refused with CONNACK 0x9F), PUBLISH packets per
//! connection (`max_publish_rate`, closed with DISCONNECT 0x96) and bytes per
//! connection (`max_bytes_per_second`, throttled: the socket is not read until the
//! budget is back). All are token buckets: a burst up to the bucket's size, then the
//! sustained rate.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

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
        self.take_at(now, f64::from(rate), burst)
    }

    /// As [`Bucket::take`] with a rate per minute and a burst of a minute's worth.
    pub(crate) fn take_per_minute(&mut self, now: Instant, per_minute: u32) -> bool {
        self.take_at(now, f64::from(per_minute) / 60.0, per_minute)
    }

    fn take_at(&mut self, now: Instant, per_second: f64, burst: u32) -> bool {
        self.refill(now, per_second, burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Instant, per_second: f64, burst: u32) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(f64::from(burst));
        self.at = self.at.max(now);
    }
}

/// A connection's byte budget: `bytes_per_second` after a burst of `burst` bytes
/// (`[mqtt] max_bytes_per_second`, `max_bytes_burst`, or a listener's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bandwidth {
    bytes_per_second: u64,
    burst: u64,
}

impl Bandwidth {
    /// `None` for a rate of 0 (no limit); a burst of 0 is one second's worth.
    pub fn new(bytes_per_second: u64, burst: u64) -> Option<Bandwidth> {
        let burst = if burst == 0 { bytes_per_second } else { burst };
        (bytes_per_second > 0).then_some(Bandwidth {
            bytes_per_second,
            burst,
        })
    }

    /// The limit the `[mqtt]` table sets for every listener without its own.
    pub fn of(config: &crate::BrokerConfig) -> Option<Bandwidth> {
        Bandwidth::new(config.max_bytes_per_second, config.max_bytes_burst)
    }

    pub fn bytes_per_second(&self) -> u64 {
        self.bytes_per_second
    }

    pub fn burst(&self) -> u64 {
        self.burst
    }
}

/// The bucket of one connection's [`Bandwidth`]. A read may take more than the
/// bucket holds (a read is not split): the bucket goes into debt, and the socket is
/// not read again until the debt is paid, so the average stays at the rate.
#[derive(Debug)]
pub(crate) struct ByteBucket {
    limit: Bandwidth,
    tokens: f64,
    at: Instant,
}

impl ByteBucket {
    /// A full bucket.
    pub(crate) fn new(limit: Bandwidth, now: Instant) -> ByteBucket {
        ByteBucket {
            limit,
            tokens: limit.burst as f64,
            at: now,
        }
    }

    /// Spends `n` bytes read at `now`; if that leaves the bucket in debt, returns
    /// when it is paid off (the earliest the socket may be read again).
    pub(crate) fn spend(&mut self, n: usize, now: Instant) -> Option<Instant> {
        let rate = self.limit.bytes_per_second as f64;
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        let full = self.limit.burst as f64;
        self.tokens = (self.tokens + elapsed * rate).min(full) - n as f64;
        self.at = self.at.max(now);
        (self.tokens < 0.0).then(|| now + Duration::from_secs_f64(-self.tokens / rate))
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
                b.refill(now, f64::from(rate), burst);
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
    fn a_rate_per_minute_has_a_burst_of_a_minute() {
        let t0 = Instant::now();
        let mut bucket = Bucket::full(3, t0);
        assert!((0..3).all(|_| bucket.take_per_minute(t0, 3)));
        assert!(!bucket.take_per_minute(t0, 3));
        assert!(!bucket.take_per_minute(t0 + Duration::from_secs(19), 3));
        assert!(bucket.take_per_minute(t0 + Duration::from_secs(20), 3));
    }

    #[test]
    fn bytes_past_the_burst_are_paid_for_by_a_pause_at_the_rate() {
        let t0 = Instant::now();
        let limit = Bandwidth::new(1000, 0).unwrap();
        assert_eq!(limit.burst(), 1000, "a burst of 0 is one second's worth");
        assert_eq!(Bandwidth::new(0, 5), None, "0 is no limit");
        let mut bucket = ByteBucket::new(limit, t0);
        assert_eq!(bucket.spend(600, t0), None);
        assert_eq!(bucket.spend(400, t0), None, "the whole burst");
        // One read past it: a debt of 500 bytes at 1000/s is half a second.
        let until = bucket.spend(500, t0).unwrap();
        assert_eq!(until, t0 + Duration::from_millis(500));
        // Paid off: 100 ms of refill buys 100 bytes.
        let t1 = until + Duration::from_millis(100);
        assert_eq!(bucket.spend(100, t1), None);
        assert!(bucket.spend(1, t1).is_some());
        // Idle for long: the bucket holds no more than the burst.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(bucket.spend(1000, t2), None);
        assert!(bucket.spend(1, t2).is_some());
    }

    #[test]
    fn zero_is_no_limit() {
        let limit = ConnectRate::new(0, 0);
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        assert!((0..10_000).all(|_| limit.admit(ip, Instant::now())));
    }
}
