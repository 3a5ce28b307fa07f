//! Connections that have not sent CONNECT: they do not count against
//! `max_connections`, and past the pending limits the oldest of them is closed.

use std::sync::atomic::Ordering;
use std::time::Duration;

use statehub_broker::codec::ReasonCode;
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

#[tokio::test]
async fn silent_sockets_do_not_count_against_max_connections() {
    let (broker, addr) = start_broker(BrokerConfig {
        max_connections: 2,
        ..Default::default()
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..5 {
        silent.push(RawClient::open(addr, V5).await);
    }
    let _a = RawClient::connect(addr, V5, "a").await;
    let _b = RawClient::connect(addr, V5, "b").await;
    assert_eq!(broker.connection_count(), 2);
    // The limit still holds for connections that did send CONNECT.
    let (_c, ack) = RawClient::connect_with(addr, connect_packet(V5, "c")).await;
    assert_eq!(ack.reason_code, ReasonCode::QUOTA_EXCEEDED);
    assert_eq!(silent.len(), 5);
}

/// A pending connection is safe from eviction for this long (`pending.rs`).
const GRACE: Duration = Duration::from_secs(1);

#[tokio::test]
async fn past_the_per_address_limit_the_oldest_silent_socket_makes_room() {
    let (broker, addr, clock) = start_with_clock(BrokerConfig {
        max_pending_per_address: 3,
        connect_timeout_secs: 60,
        ..Default::default()
    })
    .await;
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(RawClient::open(addr, V5).await);
    }
    // All three are young: a fourth is closed, not one of them.
    let mut fourth = RawClient::open(addr, V5).await;
    fourth.expect_closed().await;
    let evicted = || broker.metrics().pending_evicted.load(Ordering::Relaxed);
    assert_eq!(evicted(), 1);
    // Once they have been silent past the grace, a real client from the same address
    // takes the oldest one's place.
    clock.advance(GRACE);
    let mut c = RawClient::connect(addr, V5, "real").await;
    c.ping().await;
    silent[0].expect_closed().await;
    assert_eq!(evicted(), 2);
    for young in &mut silent[1..] {
        young.expect_nothing(QUIET).await;
    }
}

#[tokio::test]
async fn past_the_total_limit_the_oldest_silent_socket_makes_room() {
    let (_broker, addr, clock) = start_with_clock(BrokerConfig {
        max_pending_connections: 2,
        connect_timeout_secs: 60,
        ..Default::default()
    })
    .await;
    let mut first = RawClient::open(addr, V5).await;
    let mut second = RawClient::open(addr, V5).await;
    clock.advance(GRACE);
    let mut c = RawClient::connect(addr, V5, "real").await;
    c.ping().await;
    first.expect_closed().await;
    second.expect_nothing(QUIET).await;
}

/// Real clients send CONNECT at once: a burst of them from one address stays under
/// the default per-address limit and none is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_real_clients_from_one_address_all_get_in() {
    let (broker, addr) = start_default().await;
    let clients = (0..500).map(|i| {
        tokio::spawn(async move {
            let (c, ack) =
                RawClient::connect_with(addr, connect_packet(V5, &format!("b{i}"))).await;
            (c, ack.reason_code)
        })
    });
    let clients: Vec<_> = futures_util::future::join_all(clients).await;
    for c in &clients {
        assert_eq!(c.as_ref().unwrap().1, ReasonCode::SUCCESS);
    }
    assert_eq!(broker.metrics().pending_evicted.load(Ordering::Relaxed), 0);
}
