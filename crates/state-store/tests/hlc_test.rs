//! Hybrid logical clocks: wire form, ordering, the server clock.

use statehub_state_store::hlc::{check_skew, Hlc, HlcClock, DEFAULT_NODE_ID};

/// The reply path writes versions with `put_wire`; it must match `Display` exactly.
#[test]
fn wire_form_matches_display() {
    for (wall, counter, node) in [
        (0, 0, "n"),
        (1_700_000_000_123, 7, "state-store"),
        (u64::MAX, 123_456, ""),
        (12, u64::MAX, "a"),
    ] {
        let v = Hlc::new(wall, counter, node);
        let mut buf = bytes::BytesMut::new();
        v.put_wire(&mut buf);
        assert_eq!(&buf[..], v.to_string().as_bytes());
    }
}

#[test]
fn formats_with_padding() {
    assert_eq!(
        Hlc::new(1_696_374_425_000, 1, "state-store").to_string(),
        "001696374425000:00001:state-store"
    );
    assert_eq!(Hlc::new(0, 0, "").to_string(), "000000000000000:00000:");
    assert_eq!(
        Hlc::new(5, 123_456, "n").to_string(),
        "000000000000005:123456:n"
    );
}

#[test]
fn parses_what_it_formats_and_what_sdks_send() {
    let h = Hlc::new(1_696_374_425_000, 0, "CLIENT");
    assert_eq!(h.to_string().parse::<Hlc>(), Ok(h.clone()));
    assert_eq!("1696374425000:0:CLIENT".parse::<Hlc>(), Ok(h));
    assert_eq!(
        "001696374425000:00007:".parse::<Hlc>(),
        Ok(Hlc::new(1_696_374_425_000, 7, ""))
    );
    assert_eq!(
        "1:2:node id with spaces".parse::<Hlc>(),
        Ok(Hlc::new(1, 2, "node id with spaces"))
    );
}

/// The reference reading of the wire form: split on ':', exactly three fields, the first
/// two all ASCII digits that fit a u64.
fn reference(s: &str) -> Option<Hlc> {
    let parts: Vec<&str> = s.split(':').collect();
    let [wall, counter, node] = parts[..] else {
        return None;
    };
    let number = |f: &str| -> Option<u64> {
        if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        f.parse().ok()
    };
    Some(Hlc::new(number(wall)?, number(counter)?, node))
}

proptest::proptest! {
    /// The one-pass parser reads every string exactly as the reference does, HLC-shaped
    /// strings with damage and arbitrary text alike.
    #[test]
    fn parser_agrees_with_the_reference(
        s in proptest::prop_oneof![
            "[0-9]{0,22}:[0-9]{0,22}:[a-z:\\-]{0,12}",
            "[0-9:+ x-]{0,30}",
            proptest::string::string_regex(".{0,24}").unwrap(),
        ]
    ) {
        proptest::prop_assert_eq!(s.parse::<Hlc>().ok(), reference(&s));
    }
}

#[test]
fn rejects_malformed() {
    for bad in [
        "",
        "1696374425000",
        "1696374425000:0",
        "1696374425000:0:a:b",
        ":0:n",
        "1::n",
        "+1:0:n",
        "1:-1:n",
        "x:0:n",
        "1:0x1:n",
        " 1:0:n",
        "99999999999999999999:0:n",
        "1:99999999999999999999:n",
    ] {
        assert!(bad.parse::<Hlc>().is_err(), "{bad:?}");
    }
}

#[test]
fn orders_by_wall_then_counter_then_node() {
    let a = Hlc::new(1, 5, "z");
    let b = Hlc::new(2, 0, "a");
    let c = Hlc::new(2, 1, "a");
    let d = Hlc::new(2, 1, "b");
    assert!(a < b && b < c && c < d);
    assert_eq!(Hlc::new(2, 1, "b"), d);
}

/// The page's worked example stamps the request `1696374425000:0:CLIENT` and shows the
/// version `1696374425000:1:StateStore`: the textbook update for a request handled within
/// the millisecond it was stamped in. statehub steps past such a stamp instead (see the
/// module docs of `hlc.rs`): the version is the next millisecond with counter 0.
#[test]
fn a_stamp_from_this_millisecond_is_stepped_past() {
    let mut clock = HlcClock::new(DEFAULT_NODE_ID);
    let t = 1_696_374_425_000;
    clock.observe_request(&Hlc::new(t, 0, "CLIENT"), t);
    assert_eq!(
        clock.tick(t).to_string(),
        "001696374425001:00000:state-store"
    );
    // The next request of the same millisecond is below the clock: merged as usual.
    clock.observe_request(&Hlc::new(t, 0, "OTHER"), t);
    assert_eq!(clock.tick(t), Hlc::new(t + 1, 1, DEFAULT_NODE_ID));
    // When the wall clock reaches the stepped millisecond, a stamp from it that is below
    // the clock is merged as usual; one from the next millisecond steps once more.
    assert_eq!(clock.tick(t + 1), Hlc::new(t + 1, 2, DEFAULT_NODE_ID));
    clock.observe_request(&Hlc::new(t + 1, 0, "CLIENT"), t + 1);
    assert_eq!(clock.tick(t + 1), Hlc::new(t + 1, 3, DEFAULT_NODE_ID));
    clock.observe_request(&Hlc::new(t + 2, 0, "CLIENT"), t + 2);
    assert_eq!(clock.tick(t + 2), Hlc::new(t + 3, 0, DEFAULT_NODE_ID));
}

/// A lone writer's versions have counter 0 whether its request reached the server in the
/// millisecond it was stamped in or a later one (what the Rust SDK's lease test checks of
/// two renewals), and each is greater than its request's stamp.
#[test]
fn lone_writer_versions_keep_counter_zero() {
    for delay in [0, 1, 3] {
        let mut clock = HlcClock::new("n");
        let mut last = clock.tick(1_000);
        for i in 1..5u64 {
            let stamped = 1_000 + i * 2_000;
            let stamp = Hlc::new(stamped, 0, "client");
            clock.observe_request(&stamp, stamped + delay);
            let version = clock.tick(stamped + delay);
            assert_eq!(version.counter, 0, "delay {delay}");
            assert!(version > stamp && version > last);
            last = version;
        }
    }
}

/// A client that adopts every version it is sent (the SDK's HLC does) and sends requests
/// faster than one per millisecond cannot drag the clock ahead: it stays within one
/// millisecond of the wall clock.
#[test]
fn adopting_clients_do_not_drag_the_clock_ahead() {
    let mut clock = HlcClock::new("n");
    let mut client = Hlc::new(0, 0, "client");
    let mut last = clock.current();
    for step in 0..10_000u64 {
        let now = 5_000 + step / 20; // 20 requests per millisecond
        client = if now > client.wall_ms {
            Hlc::new(now, 0, "client")
        } else {
            Hlc::new(client.wall_ms, client.counter + 1, "client")
        };
        clock.observe_request(&client, now);
        let version = clock.tick(now);
        assert!(version > client && version > last);
        assert!(version.wall_ms <= now + 1, "{version} at {now}");
        client = Hlc::new(version.wall_ms, version.counter + 1, "client");
        last = version;
    }
}

#[test]
fn ticks_strictly_increase() {
    let mut clock = HlcClock::new("n");
    let first = clock.tick(100);
    assert_eq!(first, Hlc::new(100, 0, "n"));
    let second = clock.tick(100);
    assert_eq!(second, Hlc::new(100, 1, "n"));
    // Wall clock going backwards does not go backwards in versions.
    let third = clock.tick(50);
    assert_eq!(third, Hlc::new(100, 2, "n"));
    let fourth = clock.tick(101);
    assert_eq!(fourth, Hlc::new(101, 0, "n"));
    assert!(first < second && second < third && third < fourth);
}

#[test]
fn observed_future_values_are_exceeded() {
    let mut clock = HlcClock::new("n");
    clock.observe(&Hlc::new(5_000, 9, "CLIENT"));
    assert_eq!(clock.tick(1_000), Hlc::new(5_000, 10, "n"));
    // Observing an older value changes nothing.
    clock.observe(&Hlc::new(10, 0, "CLIENT"));
    assert_eq!(clock.tick(1_000), Hlc::new(5_000, 11, "n"));
    assert_eq!(clock.current(), Hlc::new(5_000, 11, "n"));
}

#[test]
fn later_wall_clock_later_version_same_node() {
    let mut clock = HlcClock::new(DEFAULT_NODE_ID);
    let first = clock.tick(1_000_000);
    let second = clock.tick(1_002_000);
    assert!(second.wall_ms > first.wall_ms);
    assert_eq!(first.node_id, second.node_id);
}

#[test]
fn skew_limit_is_inclusive() {
    let now = 1_000_000;
    assert!(check_skew(&Hlc::new(now + 60_000, 99, "c"), now, 60_000));
    assert!(!check_skew(&Hlc::new(now + 60_001, 0, "c"), now, 60_000));
    assert!(check_skew(&Hlc::new(0, 0, "c"), now, 60_000));
    assert!(check_skew(
        &Hlc::new(u64::MAX, 0, "c"),
        u64::MAX - 1,
        60_000
    ));
}
