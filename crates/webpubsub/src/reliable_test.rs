use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn msg(id: u64, len: usize) -> Message {
    let mut s = format!("{id}:");
    s.extend(std::iter::repeat_n('x', len.saturating_sub(s.len())));
    Message::from(s)
}

fn cost(len: usize) -> usize {
    len + ENTRY_OVERHEAD
}

/// Pushes a frame of `len` bytes at `now` and trims with `written`.
fn push(s: &mut Sequencer, len: usize, written: u64, now: Instant) -> Evicted {
    s.push(|id| msg(id, len), None, now);
    s.trim(written, now)
}

fn replayed(s: &Sequencer, now: Instant) -> Vec<u64> {
    s.replay(now).unwrap().iter().map(|(id, _)| *id).collect()
}

#[test]
fn ids_start_at_one_and_acks_trim() {
    let now = Instant::now();
    let mut s = Sequencer::new(1 << 20, None);
    for _ in 0..4 {
        push(&mut s, 10, 0, now);
    }
    assert_eq!(replayed(&s, now), [1, 2, 3, 4]);
    s.ack(2);
    assert_eq!(replayed(&s, now), [3, 4]);
    s.ack(1);
    assert_eq!(s.buffered(), [3, 4], "acks never go back");
    s.ack(u64::MAX);
    assert!(s.buffered().is_empty());
    assert_eq!(s.bytes(), 0);
    assert_eq!(s.push(|id| msg(id, 1), None, now).0, 5);
    s.ack(u64::MAX);
    s.push(|id| msg(id, 1), None, now);
    assert_eq!(
        replayed(&s, now),
        [6],
        "an ack beyond the last id sent does not cover later ones"
    );
}

#[test]
fn a_full_buffer_evicts_the_oldest_and_replay_then_fails() {
    let now = Instant::now();
    let mut s = Sequencer::new(3 * cost(10), None);
    for _ in 0..3 {
        assert_eq!(push(&mut s, 10, 3, now), Evicted::default());
    }
    assert_eq!(
        push(&mut s, 10, 3, now),
        Evicted {
            written: 1,
            unwritten: 0
        }
    );
    assert_eq!(s.buffered(), [2, 3, 4]);
    assert_eq!(s.replay(now), Err(ReplayLost { first: 1, last: 1 }));
    s.ack(1);
    assert_eq!(
        replayed(&s, now),
        [2, 3, 4],
        "the client's ack covers what was evicted"
    );
    assert_eq!(
        push(&mut s, 10, 0, now),
        Evicted {
            written: 0,
            unwritten: 1
        },
        "without a draining socket, unwritten frames go too"
    );
    assert_eq!(s.replay(now), Err(ReplayLost { first: 2, last: 2 }));
    assert!(s.bytes() <= 3 * cost(10));
}

#[test]
fn a_frame_larger_than_the_buffer_is_evicted_itself() {
    let now = Instant::now();
    let mut s = Sequencer::new(100, None);
    assert_eq!(push(&mut s, 500, 1, now).written, 1);
    assert_eq!(s.bytes(), 0);
    assert!(s.replayable().is_err());
}

#[test]
fn written_frames_age_out_unwritten_ones_do_not() {
    let t0 = Instant::now();
    let mut s = Sequencer::new(1 << 20, Some(Duration::from_secs(10)));
    push(&mut s, 10, 0, t0);
    push(&mut s, 10, 0, t0 + Duration::from_secs(5));
    let later = t0 + Duration::from_secs(12);
    assert_eq!(s.trim(0, later), Evicted::default(), "nothing written");
    assert_eq!(
        s.trim(2, later),
        Evicted {
            written: 1,
            unwritten: 0
        }
    );
    assert_eq!(s.buffered(), [2]);
    assert!(s.replayable().is_err());
}

#[test]
fn frames_past_their_deadline_are_not_replayed_and_go_first() {
    let t0 = Instant::now();
    let mut s = Sequencer::new(2 * cost(10), None);
    s.push(|id| msg(id, 10), Some(t0 + Duration::from_secs(5)), t0);
    push(&mut s, 10, 0, t0);
    let later = t0 + Duration::from_secs(6);
    assert_eq!(replayed(&s, later), [2]);
    assert_eq!(push(&mut s, 10, 0, later), Evicted::default());
    assert_eq!(s.buffered(), [2, 3], "the expired frame made room");
    assert_eq!(replayed(&s, later), [2, 3], "and its loss is no loss");
}

#[test]
fn processed_acks_forget_the_oldest() {
    let mut a = ProcessedAcks::new(3);
    for id in [1, 2, 3, 2] {
        a.insert(id);
    }
    assert!(a.contains(1) && a.contains(2) && a.contains(3));
    a.insert(4);
    assert!(!a.contains(1));
    assert!(a.contains(2) && a.contains(4));
}

#[derive(Debug, Clone)]
enum Op {
    /// A message of this many bytes, with a deadline this many ticks ahead.
    Send(usize, Option<u64>),
    /// The client acknowledges this fraction (per mille) of what was sent.
    Ack(u16),
    /// The socket has written this fraction (per mille) of what was sent.
    Write(u16),
    /// The socket drops; a recovery would start with nothing written.
    Drop,
    /// Time passes.
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..300, prop::option::weighted(0.2, 1u64..20)).prop_map(|(l, d)| Op::Send(l, d)),
        2 => (0u16..=1000).prop_map(Op::Ack),
        3 => (0u16..=1000).prop_map(Op::Write),
        1 => Just(Op::Drop),
        2 => (1u64..10).prop_map(Op::Tick),
    ]
}

/// What the test knows from outside: every id sent (its deadline and when), the ack,
/// the written watermark, and for each id that left the buffer unacknowledged whether
/// it was past its deadline then.
struct Model {
    base: Instant,
    tick: u64,
    /// Deadline and send tick by id.
    sent: BTreeMap<u64, (Option<Instant>, u64)>,
    acked: u64,
    written: u64,
    /// Ids evicted before they were acknowledged, and whether they were expired then.
    evicted: BTreeMap<u64, bool>,
}

impl Model {
    fn now(&self) -> Instant {
        self.base + Duration::from_secs(self.tick)
    }

    fn last(&self) -> u64 {
        self.sent.keys().next_back().copied().unwrap_or(0)
    }

    fn frac(&self, per_mille: u16) -> u64 {
        self.last() * u64::from(per_mille) / 1000
    }

    fn expired(&self, id: u64, now: Instant) -> bool {
        self.sent[&id].0.is_some_and(|d| now >= d)
    }

    /// Whether a buffered, written frame is past the age bound.
    fn any_aged(&self, buffered: &BTreeSet<u64>, max_age: Option<u64>) -> bool {
        max_age.is_some_and(|age| {
            buffered
                .iter()
                .any(|id| *id <= self.written && self.tick >= self.sent[id].1 + age)
        })
    }

    /// Records which buffered ids disappeared since `before`.
    fn note_left(&mut self, before: &BTreeSet<u64>, after: &BTreeSet<u64>, now: Instant) {
        for id in before.difference(after) {
            if *id > self.acked {
                let expired = self.expired(*id, now);
                self.evicted.insert(*id, expired);
            }
        }
    }

    /// Unacknowledged ids that must be replayed: not past their deadline now.
    fn owed(&self, now: Instant) -> Vec<u64> {
        self.sent
            .range(self.acked + 1..)
            .map(|(id, _)| *id)
            .filter(|id| !self.expired(*id, now))
            .collect()
    }

    /// Checks a recovery now against what the model knows.
    fn check_recovery(&self, s: &Sequencer) -> Result<(), TestCaseError> {
        let now = self.now();
        let lost = self
            .evicted
            .iter()
            .any(|(id, expired)| *id > self.acked && !expired);
        match s.replay(now) {
            Ok(frames) => {
                prop_assert!(!lost, "served a recovery that misses frames");
                let ids: Vec<u64> = frames.iter().map(|(id, _)| *id).collect();
                prop_assert_eq!(ids, self.owed(now));
            }
            Err(e) => {
                prop_assert!(lost, "refused a recovery that could be served: {}", e);
                prop_assert_eq!(e.first, self.acked + 1);
            }
        }
        Ok(())
    }
}

const MAX_BYTES: usize = 6 * (100 + ENTRY_OVERHEAD);

/// One send as the session does it: push, then trim with the socket's watermark.
fn send(
    s: &mut Sequencer,
    m: &mut Model,
    len: usize,
    ttl: Option<u64>,
    max_age: Option<u64>,
) -> Result<(), TestCaseError> {
    let now = m.now();
    let mut before: BTreeSet<u64> = s.buffered().into_iter().collect();
    let deadline = ttl.map(|t| now + Duration::from_secs(t));
    let (id, _) = s.push(|id| msg(id, len), deadline, now);
    prop_assert_eq!(id, m.last() + 1);
    m.sent.insert(id, (deadline, m.tick));
    before.insert(id);
    let quiet = s.bytes() <= MAX_BYTES && !m.any_aged(&before, max_age);
    s.trim(m.written, now);
    let after: BTreeSet<u64> = s.buffered().into_iter().collect();
    if quiet {
        prop_assert_eq!(&before, &after, "evicted while within the bounds");
    }
    prop_assert!(s.bytes() <= MAX_BYTES);
    let ids: Vec<u64> = after.iter().copied().collect();
    prop_assert_eq!(ids, s.buffered(), "kept in order");
    m.note_left(&before, &after, now);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// For any interleaving of sends, acks, writes, socket drops and time, a recovery
    /// is served iff every frame the client has not acknowledged (and whose deadline
    /// has not passed) is still buffered, and it replays exactly those, in order. The
    /// byte bound holds after every trim, and nothing is evicted within the bounds.
    #[test]
    fn recovery_succeeds_iff_every_unacked_frame_is_buffered(
        ops in prop::collection::vec(op(), 1..80),
        max_age in prop::option::of(3u64..15),
    ) {
        let mut s = Sequencer::new(MAX_BYTES, max_age.map(Duration::from_secs));
        let mut m = Model {
            base: Instant::now(),
            tick: 0,
            sent: BTreeMap::new(),
            acked: 0,
            written: 0,
            evicted: BTreeMap::new(),
        };
        for op in ops {
            let before: BTreeSet<u64> = s.buffered().into_iter().collect();
            match op {
                Op::Send(len, ttl) => send(&mut s, &mut m, len, ttl, max_age)?,
                Op::Ack(p) => {
                    let id = m.frac(p);
                    m.acked = m.acked.max(id);
                    s.ack(id);
                }
                Op::Write(p) => m.written = m.written.max(m.frac(p)),
                Op::Drop => m.written = 0,
                Op::Tick(t) => m.tick += t,
            }
            let after: BTreeSet<u64> = s.buffered().into_iter().collect();
            let now = m.now();
            m.note_left(&before, &after, now);
            m.check_recovery(&s)?;
        }
    }
}

#[test]
fn a_buffer_taken_over_from_its_window_replays_the_same_and_numbers_on() {
    let now = Instant::now();
    let mut a = Sequencer::new(3 * cost(10), None);
    for _ in 0..5 {
        push(&mut a, 10, 5, now);
    }
    a.ack(1);
    let (first, acked, evicted_through) = a.window();
    assert_eq!(
        (first, acked, evicted_through),
        (3, 1, 2),
        "2 evicted unacknowledged"
    );
    let frames: Vec<_> = (a.frames.iter())
        .map(|e| (e.id, e.frame.clone(), None))
        .collect();
    let mut b = Sequencer::new(3 * cost(10), None);
    b.restore((6, acked, evicted_through), frames, now);
    assert_eq!(b.buffered(), [3, 4, 5]);
    assert!(
        b.replay(now).is_err(),
        "what was lost stays lost on the new node"
    );
    b.ack(2);
    assert_eq!(replayed(&b, now), [3, 4, 5]);
    let (id, _) = b.push(|id| msg(id, 10), None, now);
    assert_eq!(id, 6, "sequence ids go on where the old node stopped");
    let mut c = Sequencer::new(1 << 20, None);
    let stale = vec![
        (1, msg(1, 10), None),
        (4, msg(4, 10), None),
        (9, msg(9, 10), None),
    ];
    c.restore((5, 2, 0), stale, now);
    assert_eq!(
        c.buffered(),
        [4],
        "frames acknowledged or never numbered are dropped"
    );
    assert_eq!(c.bytes(), cost(10));
}
