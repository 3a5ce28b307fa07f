//! Connections that have not sent CONNECT yet.
//!
//! They do not count against `max_connections` (sockets that never speak would lock
//! real clients out); they are bounded here instead, in total and per source address
//! (per /64 prefix for IPv6, where one host has many addresses). At either limit the
//! oldest pending connection in its scope is closed to make room if it has been
//! silent for [`GRACE`]: a real client sends CONNECT as soon as its socket opens, so
//! the socket silent longest is the one to go, and silent sockets cannot keep new
//! clients out. If every one in scope is younger (a burst of real clients opening
//! at once), the new connection is closed instead and the limit stays a limit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::ratelimit::LogLimit;

/// The unit the per-address limit counts: an IPv4 address, or an IPv6 /64 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl Source {
    pub(crate) fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(v4) => Source::V4(v4.octets()),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let o = v6.octets();
                    Source::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
                }
            },
        }
    }
}

/// How long a pending connection is safe from eviction: far more than a real
/// client needs between its TCP handshake and its CONNECT.
pub(crate) const GRACE: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Entry {
    source: Source,
    since: Instant,
    close: CancellationToken,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// By admission order: the first is the oldest.
    entries: BTreeMap<u64, Entry>,
    by_source: HashMap<Source, BTreeSet<u64>>,
}

impl Table {
    /// Makes room for one more in a scope whose oldest pending connection is
    /// `oldest`: evicts it if it is past the grace. False if it is not.
    fn make_room(&mut self, oldest: Option<u64>, now: Instant, evicted: &mut Vec<Entry>) -> bool {
        let Some(id) = oldest else { return true };
        let young = self
            .entries
            .get(&id)
            .is_some_and(|e| now.duration_since(e.since) < GRACE);
        if young {
            return false;
        }
        evicted.extend(self.remove(id));
        true
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        let entry = self.entries.remove(&id)?;
        if let Some(ids) = self.by_source.get_mut(&entry.source) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_source.remove(&entry.source);
            }
        }
        Some(entry)
    }
}

/// The pending connections of one listener.
#[derive(Debug)]
pub(crate) struct Pending {
    table: Mutex<Table>,
    clock: Clock,
    max_total: usize,
    max_per_source: usize,
}

/// A connection's place among the pending ones; leaving it (drop) frees the place.
/// `closed` is cancelled if the connection is evicted to make room.
#[derive(Debug)]
pub(crate) struct Admission {
    pending: Arc<Pending>,
    id: u64,
    pub closed: CancellationToken,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.pending.table.lock().remove(self.id);
    }
}

impl Pending {
    pub fn new(max_total: usize, max_per_source: usize, clock: Clock) -> Arc<Pending> {
        Arc::new(Pending {
            table: Mutex::new(Table::default()),
            clock,
            max_total: max_total.max(1),
            max_per_source: max_per_source.max(1),
        })
    }

    /// Admits a new connection from `ip`, evicting the oldest pending ones it must;
    /// `None` if there is no room for it (the caller closes it).
    pub fn admit(self: &Arc<Self>, ip: IpAddr, metrics: &Metrics) -> Option<Admission> {
        let source = Source::of(ip);
        let now = self.clock.now();
        let mut evicted = Vec::new();
        let closed = CancellationToken::new();
        let id = {
            let mut t = self.table.lock();
            let full = t
                .by_source
                .get(&source)
                .filter(|ids| ids.len() >= self.max_per_source);
            let oldest_here = full.map(|ids| ids.first().copied());
            let mut room = match oldest_here {
                Some(oldest) => t.make_room(oldest, now, &mut evicted),
                None => true,
            };
            if room && t.entries.len() >= self.max_total {
                let oldest = t.entries.keys().next().copied();
                room = t.make_room(oldest, now, &mut evicted);
            }
            room.then(|| {
                let id = t.next_id;
                t.next_id += 1;
                let close = closed.clone();
                t.entries.insert(
                    id,
                    Entry {
                        source,
                        since: now,
                        close,
                    },
                );
                t.by_source.entry(source).or_default().insert(id);
                id
            })
        };
        for e in &evicted {
            e.close.cancel();
        }
        let closing = evicted.len() as u64 + u64::from(id.is_none());
        if closing > 0 {
            metrics
                .pending_evicted
                .fetch_add(closing, Ordering::Relaxed);
            static LOG: LogLimit = LogLimit::per_secs(10);
            if let Some(left_out) = LOG.allow() {
                tracing::warn!(
                    %ip,
                    left_out,
                    "too many connections without CONNECT; closing the oldest (or this one)"
                );
            }
        }
        Some(Admission {
            pending: self.clone(),
            id: id?,
            closed,
        })
    }

    /// Number of connections pending.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Makes every pending connection look past the grace.
    fn age(p: &Pending) {
        for e in p.table.lock().entries.values_mut() {
            e.since -= GRACE;
        }
    }

    #[test]
    fn the_oldest_of_the_same_source_goes_first_then_the_oldest_of_all() {
        let m = Metrics::default();
        let p = Pending::new(3, 2, Clock::system());
        let a1 = p.admit(ip("10.0.0.1"), &m).unwrap();
        let a2 = p.admit(ip("10.0.0.1"), &m).unwrap();
        let b1 = p.admit(ip("10.0.0.2"), &m).unwrap();
        assert_eq!(p.len(), 3);
        // Within the grace nobody is evicted: the newcomer is refused.
        assert!(p.admit(ip("10.0.0.1"), &m).is_none());
        assert!(p.admit(ip("10.0.0.3"), &m).is_none());
        assert_eq!(m.pending_evicted.load(Ordering::Relaxed), 2);
        age(&p);
        // A third from 10.0.0.1: its oldest goes (and the total is kept).
        let a3 = p.admit(ip("10.0.0.1"), &m).unwrap();
        assert!(a1.closed.is_cancelled() && !a2.closed.is_cancelled());
        assert_eq!(p.len(), 3);
        // Someone new: the oldest of all goes.
        let c1 = p.admit(ip("10.0.0.3"), &m).unwrap();
        assert!(a2.closed.is_cancelled() && !b1.closed.is_cancelled());
        assert_eq!(m.pending_evicted.load(Ordering::Relaxed), 4);
        // Leaving frees the place; an evicted one leaving changes nothing.
        drop((a1, a2, c1));
        assert_eq!(p.len(), 2);
        drop((a3, b1));
        assert_eq!(p.len(), 0);
        assert!(p.table.lock().by_source.is_empty());
    }

    #[test]
    fn ipv6_counts_per_64_prefix_and_mapped_ipv4_as_ipv4() {
        assert_eq!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Source::of(ip("2001:db8:1:2::1")),
            Source::of(ip("2001:db8:1:3::1"))
        );
        assert_eq!(
            Source::of(ip("::ffff:10.0.0.1")),
            Source::of(ip("10.0.0.1"))
        );
    }
}
