//! Memory a client can make the broker hold, measured on the real binary (RSS from
//! /proc): retained messages, idle connections, half-sent packets, subscriptions.

mod common;

use std::time::Duration;

use common::{start_configured, start_local};
use statehub_broker::codec::{Publish, QoS, ReasonCode};
use statehub_test_support::{bs, opts, publish, RawClient, V5};

/// 10,000 retained messages of 10 bytes, each published in a read of its own (QoS 1,
/// one at a time): each used to keep the whole read buffer it arrived in (8 KiB or
/// more) alive for as long as it stayed retained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_message_holds_its_own_bytes_not_its_read_buffer() {
    let server = start_local(&[]);
    let mut c = RawClient::connect(server.mqtt, V5, "retainer").await;
    c.publish_simple("warm/up", QoS::AtLeastOnce, b"x").await;
    let before = server.rss_kib();
    const N: usize = 10_000;
    for i in 0..N {
        let p = Publish {
            retain: true,
            ..publish(&format!("r/{i}"), QoS::AtLeastOnce, b"0123456789")
        };
        c.publish(p).await;
    }
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("RSS +{grown} KiB for {N} retained messages");
    // About 1 KiB each (message, topic, index entry); 8 KiB each when pinned.
    assert!(
        grown < 30 * 1024,
        "RSS grew by {grown} KiB for {N} retained messages of 10 bytes"
    );
}

/// One client asks for 40,000 wildcard subscriptions (about 1.5 KiB of index and
/// session each): it gets the per-client limit (1,000 by default), the rest 0x97.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_holds_at_most_the_subscription_limit() {
    let server = start_local(&[]);
    let mut c = RawClient::connect(server.mqtt, V5, "collector").await;
    c.ping().await;
    let before = server.rss_kib();
    let mut granted = 0;
    for chunk in 0..160 {
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
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("RSS +{grown} KiB for 40,000 wildcard SUBSCRIBE filters, {granted} granted");
    assert_eq!(granted, 1000);
    // All granted, they took about 60 MiB.
    assert!(grown < 25 * 1024, "RSS grew by {grown} KiB");
}

/// RSS per idle MQTT connection (connected, subscribed to one topic, nothing sent):
/// its read and write buffers are released while it is idle, and what it keeps (client
/// id, filter) does not hold the buffer it was read into, and its task holds no
/// packet handler's state. About 7 KiB in a debug build; 13.4 KiB when every handler's
/// state was in the task, 19.5 KiB when the strings held their read buffers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_costs_a_few_kib() {
    let server = start_local(&[]);
    let mut conns = Vec::new();
    for i in 0..200 {
        conns.push(RawClient::connect(server.mqtt, V5, &format!("warm-{i}")).await);
    }
    let before = server.rss_kib();
    const N: usize = 2000;
    for i in 0..N {
        let mut c = RawClient::connect(server.mqtt, V5, &format!("idle-{i}")).await;
        c.subscribe(&format!("idle/{i}"), opts(QoS::AtLeastOnce))
            .await;
        conns.push(c);
    }
    let per = server.rss_kib().saturating_sub(before) as f64 / N as f64;
    eprintln!("RSS {per:.1} KiB per idle connection");
    assert!(per < 9.0, "{per:.1} KiB per idle connection");
}

/// Connections (keep alive 0) that each send all but the last byte of a 1 MiB PUBLISH:
/// each holds about its packet's size (its buffer used to grow by doubling to 2 MiB),
/// and only until the packet read deadline closes it (it used to be for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_packet_holds_its_size_until_its_deadline() {
    let server = start_configured("[mqtt]\npacket_read_timeout_secs = 4\n", &[]);
    let mut probe = RawClient::connect(server.mqtt, V5, "probe").await;
    probe.ping().await;
    let before = server.rss_kib();
    const N: usize = 40;
    // PUBLISH QoS 0 of 1 MiB in all: remaining length 1,048,572 (0xFC 0xFF 0x3F).
    let remaining = 1024 * 1024 - 4;
    let mut packet = vec![0x30, 0xFC, 0xFF, 0x3F, 0x00, 0x01, b't', 0x00];
    packet.resize(4 + remaining - 1, b'x');
    let mut conns = Vec::new();
    for i in 0..N {
        let mut c = statehub_test_support::connect_packet(V5, &format!("half-{i}"));
        c.keep_alive = 0;
        let (mut c, _) = RawClient::connect_with(server.mqtt, c).await;
        c.send_raw(&packet).await;
        conns.push(c);
    }
    probe.ping().await;
    let per = server.rss_kib().saturating_sub(before) / N as u64;
    eprintln!("RSS {per} KiB per connection holding a 1 MiB PUBLISH but its last byte");
    assert!(per < 1536, "{per} KiB per half-sent 1 MiB packet");
    for c in &mut conns {
        c.expect_disconnect_within(ReasonCode::KEEP_ALIVE_TIMEOUT, Duration::from_secs(30))
            .await;
    }
}
