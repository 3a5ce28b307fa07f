//! The clock never wraps: out-of-range `__ts` and `__ft` are malformed, a counter at its
//! maximum moves the clock to the next millisecond, and whatever clients send, versions
//! strictly increase and fencing tokens keep their order.

mod common;

use common::{version, Harness, T0};
use proptest::prelude::*;
use statehub_state_store::hlc::{HlcClock, MAX_COUNTER, MAX_WALL_MS};
use statehub_state_store::{Hlc, Outcome};

const MALFORMED: &[u8] = b"-ERR malformed timestamp\r\n";
const FT_SKEW: &[u8] = b"-ERR the request fencing token timestamp is too far in the future; ensure that the client and broker system clocks are synchronized\r\n";
const FT_LOWER: &[u8] = b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n";

#[test]
fn a_counter_at_its_maximum_moves_to_the_next_millisecond() {
    let mut clock = HlcClock::new("n");
    clock.observe(&Hlc::new(1_000, MAX_COUNTER - 1, "c"));
    assert_eq!(clock.tick(1_000), Hlc::new(1_000, MAX_COUNTER, "n"));
    assert_eq!(clock.tick(1_000), Hlc::new(1_001, 0, "n"));
    assert_eq!(clock.tick(1_000), Hlc::new(1_001, 1, "n"));
    // A counter beyond the range (a version stored before it was enforced) too.
    let mut clock = HlcClock::new("n");
    clock.observe(&Hlc::new(1_000, u64::MAX, "n"));
    assert_eq!(clock.tick(999), Hlc::new(1_001, 0, "n"));
}

#[test]
fn out_of_range_stamps_are_malformed() {
    let mut h = Harness::new();
    let future = T0 + 20_000;
    for ts in [
        format!("{future:015}:{}:x", u64::MAX),
        format!("{}:0:x", MAX_WALL_MS + 1),
    ] {
        let outcome = h.send_with("c", &[b"SET", b"k", b"v"], Some(&ts), None);
        assert_eq!(&outcome.reply.payload[..], MALFORMED, "{ts}");
        let outcome = h.send_with("c", &[b"GET", b"k"], Some(&ts), None);
        assert_eq!(&outcome.reply.payload[..], MALFORMED, "{ts}");
        let now = common::client_ts(h.now);
        let outcome = h.send_with("c", &[b"SET", b"k", b"v"], Some(&now), Some(&ts));
        assert_eq!(&outcome.reply.payload[..], MALFORMED, "{ts}");
    }
    // The largest counter the SDKs send is accepted, and the clock moves past it.
    let ts = format!("{future:015}:{MAX_COUNTER}:x");
    let outcome = h.send_with("c", &[b"SET", b"k", b"v"], Some(&ts), None);
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    assert_eq!(outcome.reply.version, Some(version(future + 1, 0)));
}

/// The attack on the lock pattern: a `__ts` 20 s ahead with the largest
/// counter, sent between two holders' acquisitions. The later holder must get the higher
/// fencing token, its fenced write must win and the stale holder's be refused.
#[test]
fn a_later_lock_holder_gets_a_higher_token() {
    let mut h = Harness::new();
    let attack = |h: &mut Harness| {
        let ts = format!("{:015}:{MAX_COUNTER}:x", h.now + 20_000);
        h.send_with("x", &[b"GET", b"k"], Some(&ts), None);
    };
    attack(&mut h);
    let a = acquire(&mut h, "a");
    let ft_a = a.to_string();
    assert_eq!(fenced_set(&mut h, "a", &ft_a), b"+OK\r\n");
    h.send("a", &[b"DEL", b"lock"]);
    attack(&mut h);
    let b = acquire(&mut h, "b");
    assert!(b > a, "{b} after {a}");
    assert_eq!(fenced_set(&mut h, "b", &b.to_string()), b"+OK\r\n");
    assert_eq!(fenced_set(&mut h, "a", &ft_a), FT_LOWER);
}

fn acquire(h: &mut Harness, holder: &str) -> Hlc {
    let outcome = h.send(
        holder,
        &[b"SET", b"lock", holder.as_bytes(), b"NX", b"PX", b"10000"],
    );
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    outcome.reply.version.expect("version")
}

fn fenced_set(h: &mut Harness, holder: &str, ft: &str) -> Vec<u8> {
    let ts = common::client_ts(h.now);
    let outcome = h.send_with(
        holder,
        &[b"SET", b"resource", holder.as_bytes()],
        Some(&ts),
        Some(ft),
    );
    outcome.reply.payload.to_vec()
}

/// Wall clocks around the present and the skew bound (60 s), counters at the edges.
fn stamp() -> impl Strategy<Value = (i64, u64, String)> {
    let wall = prop_oneof![
        Just(0i64),
        -5i64..5,
        59_990i64..60_010,
        Just(-(T0 as i64)),
        Just((MAX_WALL_MS - T0) as i64),
    ];
    let counter = prop_oneof![
        Just(0),
        Just(1),
        Just(MAX_COUNTER - 1),
        Just(MAX_COUNTER),
        Just(u64::MAX),
        any::<u64>(),
    ];
    let node = prop_oneof![
        Just(""),
        Just("a"),
        Just("state-store"),
        Just("~~~~"),
        Just("0")
    ];
    (wall, counter, node.prop_map(str::to_owned))
}

#[derive(Debug, Clone)]
enum Step {
    /// A request stamped at `now + offset` (a GET: it only merges the stamp).
    Stamp((i64, u64, String)),
    /// A holder takes the lock (DEL then SET NX) and writes the resource with its token.
    Acquire,
    /// A plain SET.
    Set,
    /// The wall clock moves (backwards too, as a real one may).
    Advance(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => stamp().prop_map(Step::Stamp),
        2 => Just(Step::Acquire),
        2 => Just(Step::Set),
        1 => (-3i64..5).prop_map(Step::Advance),
    ]
}

/// The fencing rule, as the notes give it, for one resource.
#[derive(Default)]
struct Fencing {
    stored: Option<Hlc>,
}

impl Fencing {
    /// The reply to a write with `ft` at `now`; an accepted token replaces the stored one.
    fn write(&mut self, ft: &Hlc, now: u64) -> Vec<u8> {
        if ft.wall_ms > now + 60_000 {
            return FT_SKEW.to_vec();
        }
        if self.stored.as_ref().is_some_and(|stored| ft < stored) {
            return FT_LOWER.to_vec();
        }
        self.stored = Some(ft.clone());
        b"+OK\r\n".to_vec()
    }
}

fn version_of(outcome: &Outcome) -> Option<Hlc> {
    outcome.reply.version.clone()
}

proptest! {
    /// Whatever stamps clients send, every version issued is above every one before it
    /// and above the request's accepted stamp; every token a holder gets is above the
    /// previous holder's, whose fenced writes are then refused.
    #[test]
    fn versions_strictly_increase_and_fencing_keeps_order(
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let mut h = Harness::new();
        let mut last: Option<Hlc> = None;
        let mut tokens: Vec<Hlc> = Vec::new();
        let mut fencing = Fencing::default();
        let issued = |v: Option<Hlc>, last: &mut Option<Hlc>| {
            let v = v.expect("a write carries its version");
            if let Some(prev) = last.as_ref() {
                prop_assert!(v > *prev, "{} not above {}", v, prev);
            }
            *last = Some(v.clone());
            Ok(v)
        };
        for step in steps {
            match step {
                Step::Stamp((offset, counter, node)) => {
                    let wall = h.now.saturating_add_signed(offset);
                    let ts = format!("{wall:015}:{counter}:{node}");
                    let outcome = h.send_with("x", &[b"SET", b"x", b"v"], Some(&ts), None);
                    let payload = &outcome.reply.payload[..];
                    if counter > MAX_COUNTER || wall > MAX_WALL_MS {
                        prop_assert_eq!(payload, MALFORMED);
                    } else if payload == b"+OK\r\n" {
                        let v = issued(version_of(&outcome), &mut last)?;
                        prop_assert!(v > Hlc::new(wall, counter, node.as_str()));
                    } else {
                        prop_assert!(offset > 60_000, "{:?}", payload);
                    }
                }
                Step::Acquire => {
                    h.send("a", &[b"DEL", b"lock"]);
                    let outcome = h.send("a", &[b"SET", b"lock", b"h", b"NX"]);
                    let token = issued(version_of(&outcome), &mut last)?;
                    if let Some(previous) = tokens.last() {
                        prop_assert!(token > *previous);
                    }
                    // The new holder writes, then the previous one tries to.
                    for ft in std::iter::once(&token).chain(tokens.last()) {
                        let expected = fencing.write(ft, h.now);
                        prop_assert_eq!(fenced_set(&mut h, "w", &ft.to_string()), expected);
                    }
                    tokens.push(token);
                }
                Step::Set => {
                    let outcome = h.send("c", &[b"SET", b"k", b"v"]);
                    issued(version_of(&outcome), &mut last)?;
                }
                Step::Advance(ms) => h.now = h.now.saturating_add_signed(ms),
            }
        }
    }
}
