//! The connection's buffers and read deadlines.
//!
//! Memory: an idle connection holds no read or write buffer (both are released when
//! empty and allocated when bytes come or go), and a packet being read gets exactly
//! the room it still needs once its fixed header is in, instead of a buffer grown by
//! doubling (a 1 MiB PUBLISH held 2 MiB).
//!
//! Time: besides the keep alive, a packet whose first byte has arrived must be whole
//! within `packet_read_timeout_secs`: any byte resets the keep alive, so a packet
//! trickled in (or stopped half-way with keep alive 0) held its buffer for ever.
//! While the connection is throttled (`max_bytes_per_second`), its socket is not read
//! until a resume time; that pause is ours, so both deadlines move by it.
//!
//! The write buffer holds whole packets, the first possibly part-written; the length
//! of that part is tracked so the unsent packets behind it can be dropped when a slow
//! consumer is cut off, for the DISCONNECT to come right after it.

use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};

use super::{Close, Conn};
use statehub_mqtt_codec::ReasonCode;

/// Bytes reserved for a read when no packet is under way.
const READ_CHUNK: usize = 4096;

/// Room an empty write buffer gets before the first packet goes in: a drain's packets
/// (a burst of replies and PUBACKs) then fit without the buffer growing, and copying
/// itself, several times on the way.
const WRITE_CHUNK: usize = 4096;

/// The keep alive (1.5 times the negotiated one; zero for none), the deadline of
/// the packet being read, the expiry of the client's credential, and the end of a
/// bandwidth pause. One timer serves them all.
#[derive(Debug)]
pub(super) struct Deadlines {
    keep_alive: Duration,
    packet_timeout: Duration,
    idle_at: Option<Instant>,
    packet_at: Option<Instant>,
    credential_at: Option<Instant>,
    /// While the socket is not read for the bandwidth limit: when reading resumes.
    resume_at: Option<Instant>,
    /// While the connection is paused (publisher back-pressure, not reading): when a
    /// session it waits for becomes a slow consumer. The keep alive and the packet
    /// deadline do not run meanwhile.
    paused_until: Option<Instant>,
}

impl Deadlines {
    pub fn new(keep_alive: Duration, packet_timeout: Duration, now: Instant) -> Deadlines {
        Deadlines {
            keep_alive,
            packet_timeout,
            idle_at: (!keep_alive.is_zero()).then(|| now + keep_alive),
            packet_at: None,
            credential_at: None,
            resume_at: None,
            paused_until: None,
        }
    }

    /// The earliest, if any.
    pub fn next(&self) -> Option<Instant> {
        let earlier = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let throttle = earlier(self.resume_at, self.credential_at);
        if self.paused_until.is_some() {
            return earlier(self.paused_until, throttle);
        }
        earlier(earlier(self.idle_at, self.packet_at), throttle)
    }

    /// The socket is not read from `now` until `until` (the bandwidth limit): the keep
    /// alive and the packet deadline move by the pause (the client's bytes wait in the
    /// socket meanwhile, so it is not late). The credential's expiry does not move.
    pub fn throttle(&mut self, now: Instant, until: Instant) {
        let by = until.saturating_duration_since(now);
        self.idle_at = self.idle_at.map(|at| at + by);
        self.packet_at = self.packet_at.map(|at| at + by);
        self.resume_at = Some(until);
    }

    /// Whether reading is throttled.
    pub fn throttled(&self) -> bool {
        self.resume_at.is_some()
    }

    /// Ends the throttle if its time has come.
    pub fn unthrottle(&mut self, now: Instant) {
        if self.resume_at.is_some_and(|at| now >= at) {
            self.resume_at = None;
        }
    }

    /// The connection stopped reading until `at` at the latest (see `pressure.rs`).
    pub fn pause(&mut self, at: Instant) {
        self.paused_until = Some(at);
    }

    /// Whether the pause's deadline has come.
    pub fn pause_due(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|at| now >= at)
    }

    /// The connection reads again at `now`: the keep alive, and the deadline of a
    /// packet under way, start afresh (the client was not the one waiting).
    pub fn resume(&mut self, now: Instant) {
        if self.paused_until.take().is_none() {
            return;
        }
        if !self.keep_alive.is_zero() {
            self.idle_at = Some(now + self.keep_alive);
        }
        if self.packet_at.is_some() {
            self.packet_at = Some(now + self.packet_timeout);
        }
    }

    /// The client's credential expires at `at` (`None`: never).
    pub fn credential(&mut self, at: Option<Instant>) {
        self.credential_at = at;
    }

    /// Bytes were read and `decoded` packets handled; `partial`: a packet is still
    /// incomplete in the buffer (a new one if any packet completed, else the same).
    pub fn read(&mut self, now: Instant, decoded: usize, partial: bool) {
        if !self.keep_alive.is_zero() {
            self.idle_at = Some(now + self.keep_alive);
        }
        self.packet_at = match (partial, self.packet_at) {
            (false, _) => None,
            (true, Some(at)) if decoded == 0 => Some(at),
            (true, _) => Some(now + self.packet_timeout),
        };
    }

    /// Whether the packet being read is past its deadline.
    pub fn packet_late(&self, now: Instant) -> bool {
        self.paused_until.is_none() && self.packet_at.is_some_and(|at| now >= at)
    }

    /// The close a deadline that passed asks for.
    pub fn expired(&self, now: Instant) -> Option<Close> {
        if self.credential_at.is_some_and(|at| now >= at) {
            return Some(Close::Expired);
        }
        if self.paused_until.is_some() {
            return None;
        }
        if self.packet_late(now) {
            return Some(Close::ByServer(
                ReasonCode::KEEP_ALIVE_TIMEOUT,
                "packet not completed within packet_read_timeout_secs",
            ));
        }
        if self.idle_at.is_some_and(|at| now >= at) {
            return Some(Close::ByServer(
                ReasonCode::KEEP_ALIVE_TIMEOUT,
                "keep alive timeout",
            ));
        }
        None
    }
}

impl Conn {
    /// Makes room in `rbuf` for the next read: what the packet under way still needs,
    /// or a chunk.
    pub(super) fn reserve_read(&self, rbuf: &mut BytesMut) {
        let want = self.codec.missing(rbuf).unwrap_or(READ_CHUNK);
        rbuf.reserve(want);
    }

    /// Gives an empty write buffer its [`WRITE_CHUNK`] (idle connections keep none, see
    /// [`Conn::release_idle`]).
    pub(super) fn reserve_write(&mut self) {
        if self.wbuf.capacity() == 0 {
            self.wbuf.reserve(WRITE_CHUNK);
        }
    }

    /// `n` bytes of the write buffer reached the socket.
    pub(super) fn written(&mut self, mut n: usize) {
        while n > 0 && !self.wbuf.is_empty() {
            if self.wbuf_front_left == 0 {
                self.wbuf_front_left = packet_len(&self.wbuf);
            }
            let k = n.min(self.wbuf_front_left);
            self.wbuf.advance(k);
            self.wbuf_front_left -= k;
            n -= k;
        }
    }

    /// Drops the packets not started yet; keeps the rest of the one part-written (the
    /// peer would read a truncated packet otherwise).
    pub(super) fn drop_unsent(&mut self) {
        self.wbuf.truncate(self.wbuf_front_left);
    }

    /// Lets go of empty buffers while the connection waits.
    pub(super) fn release_idle(&mut self, rbuf: &mut BytesMut) {
        if rbuf.is_empty() && rbuf.capacity() > 0 {
            *rbuf = BytesMut::new();
        }
        if self.wbuf.is_empty() && self.wbuf.capacity() > 0 {
            self.wbuf = BytesMut::new();
            self.wbuf_front_left = 0;
        }
    }
}

/// Length of the whole packet at the start of `buf` (which starts with one).
fn packet_len(buf: &[u8]) -> usize {
    let mut remaining = 0usize;
    for (i, &byte) in buf.iter().enumerate().skip(1).take(4) {
        remaining |= usize::from(byte & 0x7F) << (7 * (i - 1));
        if byte & 0x80 == 0 {
            return 1 + i + remaining;
        }
    }
    // Not a packet we wrote; treat the rest as one.
    buf.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_len_reads_the_fixed_header() {
        assert_eq!(packet_len(&[0xC0, 0x00]), 2);
        assert_eq!(packet_len(&[0x30, 0x05, 0, 1, b't', b'x', b'y']), 7);
        assert_eq!(packet_len(&[0x30, 0xC8, 0x01]), 3 + 200);
    }

    #[test]
    fn a_packet_deadline_runs_from_the_first_byte_of_each_packet() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Deadlines::new(Duration::ZERO, 10 * s, t0);
        assert_eq!(d.next(), None);
        d.read(t0, 0, true);
        assert_eq!(d.next(), Some(t0 + 10 * s));
        // More bytes of the same packet: its deadline stays.
        d.read(t0 + s, 0, true);
        assert_eq!(d.next(), Some(t0 + 10 * s));
        assert!(d.expired(t0 + 10 * s).is_some());
        // A packet completed and another started: a new deadline.
        d.read(t0 + 2 * s, 1, true);
        assert_eq!(d.next(), Some(t0 + 12 * s));
        d.read(t0 + 3 * s, 1, false);
        assert_eq!(d.next(), None);
        // With a keep alive, the earlier of the two.
        let mut d = Deadlines::new(3 * s, 10 * s, t0);
        d.read(t0, 0, true);
        assert_eq!(d.next(), Some(t0 + 3 * s));
    }

    #[test]
    fn a_throttle_moves_the_keep_alive_and_the_packet_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Deadlines::new(3 * s, 10 * s, t0);
        d.credential(Some(t0 + 20 * s));
        d.read(t0, 0, true);
        d.throttle(t0, t0 + 5 * s);
        assert!(d.throttled());
        assert_eq!(d.next(), Some(t0 + 5 * s), "the timer wakes to resume");
        d.unthrottle(t0 + 4 * s);
        assert!(d.throttled(), "not yet");
        d.unthrottle(t0 + 5 * s);
        assert!(!d.throttled());
        // Three seconds of keep alive after the pause, not during it.
        assert_eq!(d.expired(t0 + 7 * s), None);
        assert!(d.expired(t0 + 8 * s).is_some());
        assert_eq!(d.next(), Some(t0 + 8 * s));
        // The packet deadline moved likewise; the credential's did not.
        let mut d = Deadlines::new(Duration::ZERO, 10 * s, t0);
        d.credential(Some(t0 + 12 * s));
        d.read(t0, 0, true);
        d.throttle(t0, t0 + 5 * s);
        d.unthrottle(t0 + 5 * s);
        assert_eq!(d.next(), Some(t0 + 12 * s));
        assert_eq!(d.expired(t0 + 12 * s), Some(Close::Expired));
        d.credential(None);
        assert_eq!(d.next(), Some(t0 + 15 * s));
    }

    /// A connection paused by publisher back-pressure is the one not reading: neither
    /// its keep alive nor a packet deadline closes it meanwhile, and both start afresh
    /// when it resumes; its credential still expires.
    #[test]
    fn a_pause_stops_the_keep_alive_and_the_packet_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Deadlines::new(3 * s, 10 * s, t0);
        d.read(t0, 1, true);
        d.pause(t0 + 20 * s);
        assert_eq!(d.next(), Some(t0 + 20 * s));
        assert!(
            d.expired(t0 + 15 * s).is_none(),
            "keep alive and packet deadline wait"
        );
        assert!(!d.pause_due(t0 + 15 * s));
        assert!(d.pause_due(t0 + 20 * s));
        d.credential(Some(t0 + 5 * s));
        assert_eq!(d.expired(t0 + 15 * s), Some(Close::Expired));
        d.credential(None);
        d.resume(t0 + 30 * s);
        assert_eq!(d.next(), Some(t0 + 33 * s));
        assert!(d.expired(t0 + 32 * s).is_none());
        assert!(d.expired(t0 + 33 * s).is_some());
    }
}
