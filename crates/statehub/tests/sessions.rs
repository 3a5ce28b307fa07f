//! Persistent MQTT sessions on the data directory, against the real binary: a session
//! with an expiry above 0 keeps its subscriptions, its queued messages, its in-flight
//! QoS 1/2 messages (under their packet ids) and its expiry clock across a restart
//! and a SIGKILL; and every QoS 1 publish acknowledged to a publisher reaches the
//! persistent subscriber, however often the server is killed (`session_crash.rs`).
//!
//! The exact-protocol checks use the raw client of `statehub-test-support` (our codec
//! over TCP).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{start_on, Server};
use statehub_broker::codec::{
    Connect, Packet, ProtocolVersion, PubResponse, Publish, QoS, ReasonCode,
};
use statehub_test_support::{bs, opts, persistent_connect, RawClient};

fn launch(dir: &Path) -> Server {
    start_on(dir, &[])
}

fn terminate(mut server: Server) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status();
    common::wait_exit(&mut server.child, Duration::from_secs(10));
}

async fn resume(server: &Server, client_id: &str, expiry: u32) -> (RawClient, bool) {
    let (c, ack) =
        RawClient::connect_with(server.mqtt, persistent_connect(client_id, expiry)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS, "{ack:?}");
    (c, ack.session_present)
}

fn payload(p: &Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_messages_and_subscriptions_survive_sigkill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub", 3600).await;
    assert!(!present);
    sub.subscribe("s/#", opts(QoS::AtLeastOnce)).await;
    sub.subscribe("q/#", opts(QoS::ExactlyOnce)).await;
    sub.subscribe("gone/#", opts(QoS::AtLeastOnce)).await;
    sub.unsubscribe(&["gone/#"]).await;
    sub.disconnect().await;

    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "pub").await;
    for i in 0..30 {
        assert_eq!(
            publisher
                .publish_simple("s/a", QoS::AtLeastOnce, format!("s{i}").as_bytes())
                .await,
            ReasonCode::SUCCESS
        );
    }
    for i in 0..10 {
        assert_eq!(
            publisher
                .publish_simple("q/a", QoS::ExactlyOnce, format!("q{i}").as_bytes())
                .await,
            ReasonCode::SUCCESS
        );
    }
    assert_eq!(
        publisher
            .publish_simple("gone/a", QoS::AtLeastOnce, b"x")
            .await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    server.kill();

    let server = launch(dir.path());
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("1 persistent sessions")),
        "start-up log counts the session: {:?}",
        server.startup
    );
    let (mut sub, present) = resume(&server, "sub", 3600).await;
    assert!(present, "the session survived the SIGKILL");
    let mut got = Vec::new();
    for _ in 0..40 {
        let p = sub.expect_publish_ack().await;
        assert!(
            p.dup,
            "a message loaded after a restart may have been sent before: DUP set"
        );
        got.push(payload(&p));
    }
    let s: Vec<_> = got.iter().filter(|p| p.starts_with('s')).cloned().collect();
    let q: Vec<_> = got.iter().filter(|p| p.starts_with('q')).cloned().collect();
    assert_eq!(
        s,
        (0..30).map(|i| format!("s{i}")).collect::<Vec<_>>(),
        "QoS 1 queue, in order"
    );
    assert_eq!(
        q,
        (0..10).map(|i| format!("q{i}")).collect::<Vec<_>>(),
        "QoS 2 queue, in order"
    );
    sub.expect_nothing(Duration::from_millis(300)).await;

    // The subscriptions came back without a new SUBSCRIBE; the unsubscribed one did not.
    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "pub").await;
    assert_eq!(
        publisher
            .publish_simple("s/b", QoS::AtLeastOnce, b"live")
            .await,
        ReasonCode::SUCCESS
    );
    assert_eq!(payload(&sub.expect_publish_ack().await), "live");
    assert_eq!(
        publisher
            .publish_simple("gone/b", QoS::AtLeastOnce, b"x")
            .await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    sub.disconnect().await;

    // Acknowledged messages are not sent again after a graceful restart.
    terminate(server);
    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub", 3600).await;
    assert!(present);
    sub.expect_nothing(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_qos2_keeps_its_packet_id_and_its_stage_across_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    let (mut sub, _) = resume(&server, "sub2", 3600).await;
    sub.subscribe("x", opts(QoS::ExactlyOnce)).await;
    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "pub2").await;
    for text in ["one", "two"] {
        assert_eq!(
            publisher
                .publish_simple("x", QoS::ExactlyOnce, text.as_bytes())
                .await,
            ReasonCode::SUCCESS
        );
    }
    // Received, not acknowledged.
    let first = sub.expect_publish().await;
    let second = sub.expect_publish().await;
    assert!(!first.dup);
    let (id1, id2) = (first.packet_id.unwrap(), second.packet_id.unwrap());
    server.kill();

    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub2", 3600).await;
    assert!(present);
    let again = sub.expect_publish().await;
    assert_eq!(
        (payload(&again), again.packet_id, again.dup),
        ("one".into(), Some(id1), true),
        "same id, DUP"
    );
    // PUBREC for the first: its PUBREL is stored before it is sent.
    sub.send(&Packet::PubRec(PubResponse::ok(id1))).await;
    let rel = sub
        .expect_reply("PUBREL", |p| matches!(p, Packet::PubRel(_)))
        .await;
    assert!(matches!(rel, Packet::PubRel(r) if r.packet_id == id1));
    let again2 = sub.expect_publish().await;
    assert_eq!(
        (payload(&again2), again2.packet_id),
        ("two".into(), Some(id2))
    );
    server.kill();

    // The first was released: it comes back as a PUBREL, never again as a PUBLISH.
    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub2", 3600).await;
    assert!(present);
    match sub.expect().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, id1),
        other => panic!("expected the PUBREL of {id1} first, got {other:?}"),
    }
    sub.send(&Packet::PubComp(PubResponse::ok(id1))).await;
    let p = sub.expect_publish().await;
    assert_eq!((payload(&p), p.packet_id), ("two".into(), Some(id2)));
    sub.ack(&p).await;
    sub.disconnect().await;
    server.kill();

    // The PUBCOMP's deletion may not have reached the disk before the kill (nothing
    // waits for it): then the PUBREL comes again, which the protocol allows, but
    // never the PUBLISH.
    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub2", 3600).await;
    assert!(present);
    loop {
        match sub.next_event(Duration::from_millis(500)).await {
            statehub_test_support::Event::Packet(Packet::PubRel(r)) if r.packet_id == id2 => {
                sub.send(&Packet::PubComp(PubResponse::ok(id2))).await;
            }
            statehub_test_support::Event::Timeout => break,
            other => panic!("expected at most the PUBREL of {id2}, got {other:?}"),
        }
    }
    sub.disconnect().await;
    terminate(server);
    let server = launch(dir.path());
    let (mut sub, present) = resume(&server, "sub2", 3600).await;
    assert!(present);
    sub.expect_nothing(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos2_receipt_survives_so_a_resent_publish_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    let (mut watcher, _) = resume(&server, "watcher", 3600).await;
    watcher.subscribe("w", opts(QoS::AtLeastOnce)).await;
    let (mut sender, _) = resume(&server, "sender", 3600).await;
    let publish = Publish {
        qos: QoS::ExactlyOnce,
        topic: bs("w"),
        packet_id: Some(9),
        payload: "once".into(),
        ..Default::default()
    };
    sender.send(&Packet::Publish(publish.clone())).await;
    sender
        .expect_reply(
            "PUBREC",
            |p| matches!(p, Packet::PubRec(r) if r.packet_id == 9),
        )
        .await;
    assert_eq!(payload(&watcher.expect_publish_ack().await), "once");
    server.kill();

    let server = launch(dir.path());
    let (mut watcher, _) = resume(&server, "watcher", 3600).await;
    let (mut sender, present) = resume(&server, "sender", 3600).await;
    assert!(present);
    // The sender did not see the PUBREC (as far as the test pretends) and resends.
    sender
        .send(&Packet::Publish(Publish {
            dup: true,
            ..publish
        }))
        .await;
    sender
        .expect_reply(
            "PUBREC",
            |p| matches!(p, Packet::PubRec(r) if r.packet_id == 9),
        )
        .await;
    sender.send(&Packet::PubRel(PubResponse::ok(9))).await;
    match sender
        .expect_reply("PUBCOMP", |p| matches!(p, Packet::PubComp(_)))
        .await
    {
        Packet::PubComp(c) => {
            assert_eq!(c.reason_code, ReasonCode::SUCCESS, "the receipt was known")
        }
        _ => unreachable!(),
    }
    // The watcher may get the pre-crash copy again (QoS 1, possibly unacknowledged on
    // disk), but the resent PUBLISH was not routed a second time.
    let mut copies = 0;
    while let statehub_test_support::Event::Packet(Packet::Publish(p)) =
        watcher.next_event(Duration::from_millis(500)).await
    {
        watcher.ack(&p).await;
        copies += 1;
    }
    assert!(
        copies <= 1,
        "a duplicate QoS 2 PUBLISH was routed again ({copies} copies)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_clocks_count_the_time_statehub_was_down() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    for (id, expiry) in [("short", 1), ("long", 3600), ("zero", 0)] {
        let (mut c, _) = resume(&server, id, expiry).await;
        c.subscribe("t", opts(QoS::AtLeastOnce)).await;
        c.disconnect().await;
    }
    // Connected when killed: its clock starts when statehub is back.
    let (_connected, _) = resume(&server, "connected", 2).await;
    server.kill();
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let server = launch(dir.path());
    assert!(
        !resume(&server, "short", 60).await.1,
        "expired while statehub was down"
    );
    assert!(
        !resume(&server, "zero", 60).await.1,
        "an expiry of 0 ends with the connection"
    );
    assert!(resume(&server, "long", 3600).await.1);
    assert!(
        resume(&server, "connected", 2).await.1,
        "a full interval from start-up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_start_forgets_the_stored_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    let (mut c, _) = resume(&server, "c", 3600).await;
    c.subscribe("t", opts(QoS::AtLeastOnce)).await;
    c.disconnect().await;
    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "p").await;
    assert_eq!(
        publisher
            .publish_simple("t", QoS::AtLeastOnce, b"old")
            .await,
        ReasonCode::SUCCESS
    );
    let (c, ack) = RawClient::connect_with(
        server.mqtt,
        Connect {
            clean_start: true,
            ..persistent_connect("c", 3600)
        },
    )
    .await;
    assert!(!ack.session_present);
    c.disconnect().await;
    server.kill();

    let server = launch(dir.path());
    let (mut c, present) = resume(&server, "c", 3600).await;
    assert!(present, "the new session (expiry 3600) is stored");
    c.expect_nothing(Duration::from_millis(500)).await;
    let mut publisher = RawClient::connect(server.mqtt, ProtocolVersion::V5, "p").await;
    assert_eq!(
        publisher.publish_simple("t", QoS::AtLeastOnce, b"x").await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_311_sessions_without_clean_session_are_kept_too() {
    let dir = tempfile::tempdir().unwrap();
    let server = launch(dir.path());
    let v311 = Connect {
        clean_start: false,
        ..statehub_test_support::connect_packet(ProtocolVersion::V311, "old-client")
    };
    let (mut c, ack) = RawClient::connect_with(server.mqtt, v311.clone()).await;
    assert!(!ack.session_present);
    c.subscribe("legacy/#", opts(QoS::AtLeastOnce)).await;
    c.disconnect().await;
    let mut publisher =
        RawClient::connect(server.mqtt, ProtocolVersion::V311, "old-publisher").await;
    assert_eq!(
        publisher
            .publish_simple("legacy/a", QoS::AtLeastOnce, b"kept")
            .await,
        ReasonCode::SUCCESS
    );
    server.kill();

    let server = launch(dir.path());
    let (mut c, ack) = RawClient::connect_with(server.mqtt, v311).await;
    assert!(
        ack.session_present,
        "Clean Session 0 keeps the session for ever, across a SIGKILL too"
    );
    let p = c.expect_publish_ack().await;
    assert_eq!((payload(&p), p.dup), ("kept".into(), true));
}
