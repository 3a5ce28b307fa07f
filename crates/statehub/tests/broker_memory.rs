//! Memory a client can make the broker hold, measured on the real binary (RSS from
//! /proc): retained messages, idle connections, half-sent packets, subscriptions.

mod common;

use common::{start, Server};
use statehub_broker::codec::{Publish, QoS, ReasonCode};
use statehub_test_support::{bs, opts, publish, RawClient, V5};

fn launch() -> Server {
    start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    )
}

/// Resident set size of `server`'s process, in KiB.
fn rss_kib(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}

/// 10,000 retained messages of 10 bytes, each published in a read of its own (QoS 1,
/// one at a time): each used to keep the whole read buffer it arrived in (8 KiB or
/// more) alive for as long as it stayed retained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_message_holds_its_own_bytes_not_its_read_buffer() {
    let server = launch();
    let mut c = RawClient::connect(server.mqtt, V5, "retainer").await;
    c.publish_simple("warm/up", QoS::AtLeastOnce, b"x").await;
    let before = rss_kib(&server);
    const N: usize = 10_000;
    for i in 0..N {
        let p = Publish {
            retain: true,
            ..publish(&format!("r/{i}"), QoS::AtLeastOnce, b"0123456789")
        };
        c.publish(p).await;
    }
    let grown = rss_kib(&server).saturating_sub(before);
    eprintln!("RSS +{grown} KiB for {N} retained messages");
    // About 1 KiB each (message, topic, index entry); 8 KiB each when pinned.
    assert!(
        grown < 30 * 1024,
        "RSS grew by {grown} KiB for {N} retained messages of 10 bytes"
    );
}

/// One client asks for 20,000 wildcard subscriptions (about 1.4 KiB of index and
/// session each): it gets the per-client limit (1,000 by default), the rest 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_holds_at_most_the_subscription_limit() {
    let server = launch();
    let mut c = RawClient::connect(server.mqtt, V5, "collector").await;
    c.ping().await;
    let before = rss_kib(&server);
    let mut granted = 0;
    for chunk in 0..80 {
        let filters = (0..250)
            .map(|i| (bs(&format!("+/f{chunk}-{i}/#")), opts(QoS::AtMostOnce)))
            .collect();
        let ack = c.subscribe_with(filters, None).await;
        granted += ack.reason_codes.iter().filter(|r| r.is_success()).count();
        let refused = ack.reason_codes.iter().filter(|r| !r.is_success());
        assert!(refused
            .into_iter()
            .all(|r| *r == ReasonCode::QUOTA_EXCEEDED));
    }
    let grown = rss_kib(&server).saturating_sub(before);
    eprintln!("RSS +{grown} KiB for 20,000 wildcard SUBSCRIBE filters, {granted} granted");
    assert_eq!(granted, 1000);
    assert!(grown < 10 * 1024, "RSS grew by {grown} KiB");
}
