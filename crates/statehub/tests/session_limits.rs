//! What persistent sessions may make the server hold, against the real binary: offline
//! sessions subscribed to everything and a flood of small messages stop at the bound
//! on what all sessions queue together (memory), persistent sessions stop at their cap,
//! and with `--data-dir` a message queued for many sessions is stored once (disk).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{start_configured, start_on, Server};
use statehub_broker::codec::{Packet, ProtocolVersion, QoS, ReasonCode};
use statehub_test_support::{opts, persistent_connect, publish, RawClient};

/// Bytes `server` has passed to `write` calls so far (its journal, mostly: the sockets
/// of the scenarios below carry only acknowledgements).
fn written(server: &Server) -> u64 {
    let io =
        std::fs::read_to_string(format!("/proc/{}/io", server.child.id())).expect("read /proc io");
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("wchar in /proc io")
}

/// Bytes of every file under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                dir_bytes(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

/// `n` persistent sessions subscribed to `#` (QoS 1), all disconnected.
async fn offline_subscribers(server: &Server, n: usize) {
    for i in 0..n {
        let (mut s, ack) =
            RawClient::connect_with(server.mqtt, persistent_connect(&format!("off-{i}"), 600))
                .await;
        assert_eq!(ack.reason_code, ReasonCode::SUCCESS, "session {i}: {ack:?}");
        s.subscribe("#", opts(QoS::AtLeastOnce)).await;
        s.disconnect().await;
    }
}

/// Publishes `count` QoS 1 messages of `size` bytes, `window` in flight at a time.
async fn flood(c: &mut RawClient, count: usize, size: usize, window: usize) {
    let payload = vec![b'x'; size];
    let mut sent = 0;
    while sent < count {
        let batch = window.min(count - sent);
        for _ in 0..batch {
            let p = publish("flood/t", QoS::AtLeastOnce, &payload);
            c.send(&Packet::Publish(p)).await;
        }
        for _ in 0..batch {
            c.expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
                .await;
        }
        sent += batch;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_sessions_on_everything_hold_no_more_than_the_total_queue_bound() {
    const SESSIONS: usize = 100;
    const MESSAGES: usize = 5_000;
    let server = start_configured(
        "[mqtt]\nmax_total_queued_messages = 20000\nmax_persistent_sessions = 100\n",
        &[],
    );
    offline_subscribers(&server, SESSIONS).await;
    let (mut over, ack) =
        RawClient::connect_with(server.mqtt, persistent_connect("one-more", 600)).await;
    assert_eq!(ack.reason_code, ReasonCode::QUOTA_EXCEEDED, "{ack:?}");
    over.expect_closed().await;

    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "flood").await;
    flood(&mut publisher, 100, 10, 100).await;
    let before = server.rss_kib();
    flood(&mut publisher, MESSAGES, 10, 100).await;
    let grown = server.rss_kib().saturating_sub(before);
    eprintln!("RSS +{grown} KiB for {SESSIONS} offline sessions x {MESSAGES} messages of 10 bytes");
    // Unbounded, each of the 500,000 deliveries held about 150 bytes: +75 MB and more.
    assert!(
        grown < 16 * 1024,
        "RSS grew by {grown} KiB; the bound is 20,000 queued messages"
    );
    // The server still serves: a new client connects and gets its answer.
    let mut late = RawClient::connect(server.mqtt, ProtocolVersion::V5, "late").await;
    late.ping().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_for_many_persistent_sessions_is_stored_once() {
    const SESSIONS: usize = 50;
    const MESSAGES: usize = 40;
    const SIZE: usize = 25_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let launch = || start_on(&data, &[]);
    let server = launch();
    offline_subscribers(&server, SESSIONS).await;
    let (size_before, written_before) = (dir_bytes(&data), written(&server));
    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "big").await;
    flood(&mut publisher, MESSAGES, SIZE, 1).await;
    let grown = dir_bytes(&data).saturating_sub(size_before);
    let wrote = written(&server) - written_before;
    eprintln!(
        "{MESSAGES} messages of {SIZE} bytes queued for {SESSIONS} sessions: {} KiB written, \
         the data directory +{} KiB",
        wrote / 1024,
        grown / 1024
    );
    // One copy per session would be 50 MB, in journal segments of 8 MiB.
    let published = (MESSAGES * SIZE) as u64;
    assert!(
        wrote < 3 * published,
        "{wrote} bytes written for {published} published"
    );
    assert!(
        grown < 20 << 20,
        "the data directory grew by {grown} bytes for {published} published"
    );

    // Each session still has every message after a restart.
    drop(publisher);
    drop(server);
    let server = launch();
    for i in [0, SESSIONS - 1] {
        let (mut s, ack) =
            RawClient::connect_with(server.mqtt, persistent_connect(&format!("off-{i}"), 600))
                .await;
        assert!(ack.session_present);
        for _ in 0..MESSAGES {
            let p = s.expect_publish().await;
            assert_eq!(p.payload.len(), SIZE);
            s.ack(&p).await;
        }
        s.expect_nothing(Duration::from_millis(300)).await;
    }
}
