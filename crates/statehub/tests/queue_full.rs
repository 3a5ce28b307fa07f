//! `queue_full_policy` against the real binary with a data directory: an offline
//! persistent subscriber whose queue holds 10, a rumqttc MQTT 5 publisher sending
//! more, a SIGKILL and a restart before the subscriber comes back. What the store
//! keeps is exactly what the policy says: the newest for drop-oldest (a dropped
//! message's record is deleted, restored ones included), the first for drop-newest
//! and refuse, and the publisher was told 0x97 for what refuse did not take (an MQTT
//! 3.1.1 publisher has its connection closed instead).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{start, Server};
use statehub_broker::codec::{Connect, ConnectProperties, Packet, ProtocolVersion, QoS};
use statehub_test_support::v5pub::{publish_each, PubAckReason};
use statehub_test_support::{opts, Event, RawClient, QUIET, WAIT};

const CAP: usize = 10;

/// Starts statehub on `dir` (data in `dir/data`) with a queue of 10 per session and
/// `policy`.
fn launch(dir: &Path, policy: &str) -> Server {
    let config = dir.join("statehub.toml");
    std::fs::write(
        &config,
        format!("[mqtt]\nmax_queued_messages = {CAP}\nqueue_full_policy = \"{policy}\"\n"),
    )
    .unwrap();
    let data = dir.join("data");
    start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    )
}

fn kill(mut server: Server) {
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

fn persistent(id: &str) -> Connect {
    Connect {
        clean_start: false,
        properties: ConnectProperties {
            session_expiry_interval: Some(600),
            ..Default::default()
        },
        ..statehub_test_support::connect_packet(ProtocolVersion::V5, id)
    }
}

/// Starts statehub with a persistent subscriber to `t` that is offline for sure (the
/// server was restarted since it left).
async fn with_offline_subscriber(dir: &Path, policy: &str) -> Server {
    let server = launch(dir, policy);
    let (mut s, _) = RawClient::connect_with(server.mqtt, persistent("sub")).await;
    s.subscribe("t", opts(QoS::AtLeastOnce)).await;
    s.disconnect().await;
    kill(server);
    launch(dir, policy)
}

/// Resumes the subscriber and returns the payloads it gets, in order.
async fn come_back(server: &Server) -> Vec<String> {
    let (mut s, ack) = RawClient::connect_with(server.mqtt, persistent("sub")).await;
    assert!(ack.session_present);
    let mut got = Vec::new();
    while let Event::Packet(Packet::Publish(p)) = s.next_event(QUIET).await {
        s.ack(&p).await;
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    got
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// Waits (bounded) for a log line containing every one of `words`.
fn logged(server: &Server, words: &[&str]) -> bool {
    let deadline = std::time::Instant::now() + WAIT;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match server.log.recv_timeout(left) {
            Ok(line) if words.iter().all(|w| line.contains(w)) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_oldest_deletes_what_it_drops_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let server = with_offline_subscriber(dir.path(), "drop-oldest").await;
    let reasons = publish_each(server.mqtt, "pub", "t", &names(0..15)).await;
    assert_eq!(reasons, vec![PubAckReason::Success; 15]);
    assert!(
        logged(
            &server,
            &["WARN", "client=\"sub\"", "oldest queued messages dropped"]
        ),
        "the drop is logged, naming the session"
    );
    kill(server);
    // Restored messages go the same way, and stay gone after another restart.
    let server = launch(dir.path(), "drop-oldest");
    let reasons = publish_each(server.mqtt, "pub", "t", &names(15..18)).await;
    assert_eq!(reasons, vec![PubAckReason::Success; 3]);
    kill(server);
    let server = launch(dir.path(), "drop-oldest");
    assert_eq!(come_back(&server).await, names(8..18));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_newest_keeps_the_first_ten_across_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let server = with_offline_subscriber(dir.path(), "drop-newest").await;
    let reasons = publish_each(server.mqtt, "pub", "t", &names(0..15)).await;
    assert_eq!(reasons, vec![PubAckReason::Success; 15]);
    assert!(logged(
        &server,
        &["WARN", "client=\"sub\"", "new QoS 1/2 message dropped"]
    ));
    kill(server);
    let server = launch(dir.path(), "drop-newest");
    assert_eq!(come_back(&server).await, names(0..10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_acknowledges_only_what_the_store_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = with_offline_subscriber(dir.path(), "refuse").await;
    let reasons = publish_each(server.mqtt, "pub", "t", &names(0..15)).await;
    let mut want = vec![PubAckReason::Success; CAP];
    want.extend([PubAckReason::QuotaExceeded; 5]);
    assert_eq!(reasons, want);
    assert!(logged(
        &server,
        &["WARN", "client=\"sub\"", "PUBLISH refused"]
    ));
    kill(server);
    let server = launch(dir.path(), "refuse");
    assert_eq!(come_back(&server).await, names(0..10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_closes_an_mqtt_311_publisher_at_the_first_message_it_cannot_take() {
    use rumqttc::{AsyncClient, Event as E311, MqttOptions, Packet as In311, QoS as Q311};
    let dir = tempfile::tempdir().unwrap();
    let server = with_offline_subscriber(dir.path(), "refuse").await;
    let addr = server.mqtt;
    let mut o = MqttOptions::new("pub311", addr.ip().to_string(), addr.port());
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut el) = AsyncClient::new(o, 20);
    for p in names(0..11) {
        client
            .publish("t", Q311::AtLeastOnce, false, p)
            .await
            .unwrap();
    }
    let mut acked = 0;
    let closed = async {
        loop {
            match el.poll().await {
                Ok(E311::Incoming(In311::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(_) => return,
            }
        }
    };
    tokio::time::timeout(WAIT, closed)
        .await
        .expect("the connection closes");
    assert_eq!(acked, CAP, "m0..m9 acknowledged, m10 not");
    drop(el);
    kill(server);
    let server = launch(dir.path(), "refuse");
    assert_eq!(come_back(&server).await, names(0..10));
}
