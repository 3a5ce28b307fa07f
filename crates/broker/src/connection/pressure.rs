//! Publisher back-pressure, the publisher's side: a connection whose QoS 1/2 PUBLISH
//! was routed to a connected session past its high-water mark (see
//! `session/pressure.rs`) is paused until every such session has drained to its
//! low-water mark, left, or been cut off as a slow consumer.
//!
//! Paused, the connection handles no PUBLISH: it keeps reading, handles at once what
//! only completes earlier exchanges or answers a ping (PUBACK, PUBREC, PUBCOMP,
//! PINGREQ), and holds every other packet, in order, for when the pause ends. Once it
//! holds [`HELD_PACKETS`] packets, [`HELD_BYTES`] bytes or a DISCONNECT, it stops
//! reading: TCP then holds the client back.
//!
//! Why pause the PUBLISHes rather than hold the PUBACKs: every client is then held
//! back the same way, MQTT 3.1.1 and QoS 0 publishers included, whatever in-flight
//! window it keeps (a held PUBACK only slows a client that honours a Receive Maximum,
//! while the broker would go on routing what the others send). The pause does not
//! hold the PUBACK of the message that caused it: that message is queued for every
//! subscriber, as the acknowledgement says, so it goes as soon as whatever else it
//! waits for ends (in a cluster, its write to Redis: `acks.rs`); the PUBLISHes held
//! are not acknowledged until they are routed. Why keep reading the acknowledgements: a paused client may
//! subscribe too, and its own session drains only as they are read; two clients
//! publishing to each other would otherwise wait for each other until one was cut
//! off. (A client's own session never pauses it, see `broker.rs::Blockers`.)
//!
//! The bound this gives, per subscriber: its backlog passes the mark by at most one
//! message (one per matching subscription) per publisher that routed to it while it
//! was past the mark, since each such publisher is paused right after that message.
//! What pauses no one (QoS 0, wills, the state store's replies and notifications,
//! retained messages on SUBSCRIBE, a client's messages to itself) stays bounded by
//! 1.5 x the queue bounds, where a connected session is cut off as before. A paused
//! publisher holds at most [`HELD_PACKETS`] packets of at most [`HELD_BYTES`] bytes
//! (or one packet, if larger).
//!
//! While paused, the connection's keep alive and packet deadline do not run (the client
//! is not the one that stopped; they start afresh when the pause ends); its
//! credential's expiry does.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use bytes::BytesMut;
use smallvec::SmallVec;
use statehub_mqtt_codec::Packet;

use super::buffers::Deadlines;
use super::{inbound, Close, Conn};
use crate::clock::Timer;
use crate::ratelimit::LogLimit;
use crate::session::Session;

/// Packets a paused connection holds before it stops reading.
pub(super) const HELD_PACKETS: usize = 1024;
/// Bytes of packets a paused connection holds before it stops reading.
pub(super) const HELD_BYTES: usize = 256 * 1024;

/// The packets read while paused, to be handled once the pause ends.
#[derive(Debug, Default)]
pub(super) struct Held {
    packets: VecDeque<Packet>,
    bytes: usize,
    /// A DISCONNECT is among them: nothing after it is read.
    last: bool,
}

impl Held {
    /// Whether no more may be read.
    pub fn full(&self) -> bool {
        self.last || self.packets.len() >= HELD_PACKETS || self.bytes >= HELD_BYTES
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    fn push(&mut self, p: Packet, size: usize) {
        self.last |= matches!(p, Packet::Disconnect(_));
        self.bytes += size;
        self.packets.push_back(p);
    }

    fn pop(&mut self) -> Option<Packet> {
        let p = self.packets.pop_front()?;
        if self.packets.is_empty() {
            // A burst's room is not kept for the connection's life.
            *self = Held::default();
        }
        Some(p)
    }
}

/// Whether a paused connection handles `p` at once (see the module docs).
fn handled_while_paused(p: &Packet) -> bool {
    matches!(
        p,
        Packet::PubAck(_) | Packet::PubRec(_) | Packet::PubComp(_) | Packet::PingReq
    )
}

/// The sessions a paused connection waits for, and since when it does.
#[derive(Debug)]
pub(super) struct Pause {
    blockers: SmallVec<[Arc<Session>; 2]>,
    since: Instant,
}

impl Conn {
    /// How long a session may stay past its mark while publishers wait; `None`: no
    /// back-pressure (`slow_consumer_timeout_secs = 0`).
    pub(super) fn slow_consumer_timeout(&self) -> Option<Duration> {
        let secs = self.broker.config().slow_consumer_timeout_secs;
        (secs > 0).then(|| Duration::from_secs(secs))
    }

    /// Stops reading for the sessions in `pressed` (none: nothing to wait for).
    pub(super) fn pause_for(&mut self, pressed: SmallVec<[Arc<Session>; 2]>) {
        if pressed.is_empty() || self.paused.is_some() {
            return;
        }
        let m = self.broker.metrics();
        m.publisher_pauses.fetch_add(1, Ordering::Relaxed);
        self.paused = Some(Box::new(Pause {
            blockers: pressed,
            since: self.broker.now(),
        }));
    }

    /// Whether `p`, a packet just read, is to be held: the connection is paused (or
    /// packets held before it wait). Asked on a borrow, so that a packet handled at
    /// once is not moved in and out.
    pub(super) fn must_hold(&self, p: &Packet) -> bool {
        (self.paused.is_some() || !self.held.is_empty()) && !handled_while_paused(p)
    }

    /// Holds `p`, a packet of `size` bytes for which [`Conn::must_hold`] holds.
    pub(super) fn hold(&mut self, p: Packet, size: usize) {
        self.held.push(p, size);
    }

    /// Settles a pause before the connection waits: while some session still holds it,
    /// registers this connection to be woken when that changes and sets the deadline
    /// at which the one pressed longest is a slow consumer; once none does, resumes,
    /// handling first the packets held, then those read but not decoded (either may
    /// pause it again).
    pub(super) async fn settle_pause(
        &mut self,
        rbuf: &mut BytesMut,
        deadlines: &mut Deadlines,
        timer: &mut Timer,
    ) -> Result<(), Close> {
        while self.paused.is_some() {
            if let Some(at) = self.still_paused() {
                deadlines.pause(at);
                if at < timer.deadline() {
                    timer.reset(at);
                }
                return Ok(());
            }
            deadlines.resume(self.broker.now());
            while self.paused.is_none() {
                let Some(p) = self.held.pop() else { break };
                self.handle(p, inbound::Served::Undecided).await?;
            }
            if self.paused.is_none() {
                let handled = self.handle_buffered(rbuf).await?;
                if handled > 0 {
                    deadlines.read(self.broker.now(), handled, !rbuf.is_empty());
                }
            }
        }
        // The keep alive runs again.
        if let Some(at) = deadlines.next().filter(|at| *at < timer.deadline()) {
            timer.reset(at);
        }
        Ok(())
    }

    /// The slow-consumer deadline if a session still holds the pause; else ends it
    /// (and counts the time it took).
    fn still_paused(&mut self) -> Option<Instant> {
        let timeout = self.slow_consumer_timeout().unwrap_or_default();
        let pause = self.paused.as_mut()?;
        let signal = &self.signal;
        let mut earliest: Option<Instant> = None;
        pause.blockers.retain(|s| match s.hold(signal) {
            Some(since) => {
                earliest = Some(earliest.map_or(since, |e| e.min(since)));
                true
            }
            None => false,
        });
        if let Some(since) = earliest {
            return Some(since + timeout);
        }
        let since = self.paused.take()?.since;
        let micros = self
            .broker
            .now()
            .saturating_duration_since(since)
            .as_micros();
        let m = self.broker.metrics();
        m.publisher_paused_micros
            .fetch_add(u64::try_from(micros).unwrap_or(u64::MAX), Ordering::Relaxed);
        None
    }

    /// The pause's deadline passed: each session it waits for that has been past its
    /// mark for `slow_consumer_timeout_secs` is cut off (DISCONNECT 0x97; counted and
    /// logged, rate-limited).
    pub(super) fn cut_off_slow(&mut self) {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let (Some(pause), Some(timeout)) = (&self.paused, self.slow_consumer_timeout()) else {
            return;
        };
        let now = self.broker.now();
        for s in &pause.blockers {
            if !s.cut_off_slow(now, timeout) {
                continue;
            }
            let m = self.broker.metrics();
            m.slow_consumers.fetch_add(1, Ordering::Relaxed);
            if let Some(left_out) = LOG.allow() {
                tracing::warn!(
                    client = s.client_id(),
                    publisher = %self.info.client_id,
                    ?timeout,
                    left_out,
                    "slow consumer: past its backlog's high-water mark for slow_consumer_timeout_secs while publishers waited; DISCONNECT 0x97"
                );
            }
        }
    }
}
