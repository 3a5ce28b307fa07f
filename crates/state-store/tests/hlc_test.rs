//! Hybrid logical clocks: wire form, ordering, the server clock.

use statehub_state_store::hlc::{check_skew, Hlc, HlcClock, DEFAULT_NODE_ID};

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

#[test]
fn page_example_set_version() {
    let mut clock = HlcClock::new(DEFAULT_NODE_ID);
    let t = 1_696_374_425_000;
    clock.observe(&Hlc::new(t, 0, "CLIENT"));
    assert_eq!(
        clock.tick(t).to_string(),
        "001696374425000:00001:state-store"
    );
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
