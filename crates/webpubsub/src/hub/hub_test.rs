use std::time::Duration;

use axum::extract::ws::Message;

use super::*;
use crate::outbox::{outbox, OutboxReceiver};
use crate::protocol::json::MessageSource;
use crate::protocol::{Payload, Subprotocol};
use crate::token::ClientClaims;

fn claims(groups: &[&str]) -> ClientClaims {
    ClientClaims {
        user_id: Some("u".into()),
        roles: vec![],
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

fn hub(limits: Limits) -> Arc<Hub> {
    Arc::new(Hub::new("chat", limits))
}

fn connect(
    hub: &Hub,
    protocol: Subprotocol,
    groups: &[&str],
) -> (Arc<Session>, u64, OutboxReceiver) {
    let s = hub.create_session(&claims(groups), protocol);
    let (out, rx) = outbox(16, 1 << 20);
    let (generation, replay, _) = s.attach(out).unwrap();
    assert!(replay.is_empty());
    (s, generation, rx)
}

fn text(p: &str) -> Payload {
    Payload::Text(p.into())
}

fn publish(hub: &Hub, group: &str, payload: &Payload, exclude: Option<&str>) -> usize {
    let msg = DataMessageRef {
        from: MessageSource::Group,
        group: Some(group),
        from_user_id: None,
        payload,
        stream: None,
    };
    hub.send_to_group(group, &msg, exclude)
}

async fn next_text(rx: &mut OutboxReceiver) -> String {
    match rx.recv().await {
        Some(Message::Text(t)) => t.as_str().to_owned(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn groups_fan_out_and_exclude() {
    let h = hub(Limits::default());
    let (a, _, mut ra) = connect(&h, Subprotocol::Json, &["g"]);
    let (b, _, mut rb) = connect(&h, Subprotocol::Raw, &[]);
    h.join(&b, "g").unwrap();
    assert_eq!(publish(&h, "g", &text("hi"), Some(a.id())), 1);
    assert_eq!(next_text(&mut rb).await, "hi");
    assert_eq!(publish(&h, "g", &text("all"), None), 2);
    assert!(next_text(&mut ra).await.contains(r#""data":"all""#));
    h.leave(&b, "g");
    assert_eq!(publish(&h, "g", &text("x"), None), 1);
    assert_eq!(publish(&h, "nobody", &text("x"), None), 0);
}

#[tokio::test]
async fn reliable_frames_are_sequenced_and_replayed_on_attach() {
    let h = hub(Limits::default());
    let (s, generation, mut rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    for i in 0..3 {
        publish(&h, "g", &text(&format!("m{i}")), None);
    }
    assert!(next_text(&mut rx).await.contains(r#""sequenceId":1"#));
    s.sequence_ack(1);
    h.socket_closed(&s, generation);
    assert_eq!(h.session_count(), 1, "kept for recovery");
    publish(&h, "g", &text("m3"), None);
    let s2 = h.recover(s.id(), s.reconnection_token().unwrap()).unwrap();
    let (out, _rx2) = outbox(16, 1 << 20);
    let (_, replay, _) = s2.attach(out).unwrap();
    let ids: Vec<bool> = replay
        .iter()
        .enumerate()
        .map(|(i, (_, f))| {
            f.to_text()
                .unwrap()
                .contains(&format!(r#""sequenceId":{}"#, i + 2))
        })
        .collect();
    assert_eq!(ids, [true, true, true]);
    assert_eq!(s2.groups(), ["g"]);
}

#[tokio::test]
async fn recovery_needs_the_right_token() {
    let h = hub(Limits::default());
    let (s, _, _rx) = connect(&h, Subprotocol::JsonReliable, &[]);
    assert_eq!(
        h.recover(s.id(), "forged").unwrap_err(),
        Unrecoverable::Gone
    );
    assert_eq!(
        h.recover("nope", s.reconnection_token().unwrap())
            .unwrap_err(),
        Unrecoverable::Gone
    );
    let (plain, _, _rx2) = connect(&h, Subprotocol::Json, &[]);
    assert!(plain.reconnection_token().is_none());
    assert_eq!(h.recover(plain.id(), "").unwrap_err(), Unrecoverable::Gone);
}

/// Publishes `n` messages of about 100 bytes to group `g`.
fn flood(h: &Hub, n: usize) {
    for i in 0..n {
        publish(h, "g", &text(&format!("{i:0>100}")), None);
    }
}

fn small_replay_buffer() -> Limits {
    Limits {
        replay_buffer_bytes: 4 * (200 + crate::reliable::ENTRY_OVERHEAD),
        ..Limits::default()
    }
}

#[tokio::test]
async fn a_full_replay_buffer_never_closes_a_live_socket() {
    let h = hub(small_replay_buffer());
    let s = h.create_session(&claims(&["g"]), Subprotocol::JsonReliable);
    let (out, mut rx) = outbox(64, 1 << 20);
    s.attach(out).unwrap();
    flood(&h, 20);
    assert_eq!(h.session_count(), 1, "the session lives on");
    for i in 1..=20 {
        let frame = next_text(&mut rx).await;
        assert!(
            frame.ends_with(&format!(r#""sequenceId":{i}}}"#)),
            "{frame}"
        );
    }
    let c = h.stats().counters();
    assert!(c.replay_evictions >= 16, "{c:?}");
    assert_eq!(c.slow_consumers, 0);
}

#[tokio::test]
async fn recovery_needing_an_evicted_frame_fails_and_deletes_the_session() {
    let h = hub(small_replay_buffer());
    let (s, generation, _rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    flood(&h, 10);
    let (out, _rx2) = outbox(64, 1 << 20);
    let err = s.attach(out).unwrap_err();
    assert_eq!(
        err,
        session::AttachError::ReplayLost(crate::reliable::ReplayLost { first: 1, last: 6 })
    );
    // A second recovery before the session is deleted is told why it ended.
    let (out, _rx3) = outbox(64, 1 << 20);
    let again = s.attach(out).unwrap_err().to_string();
    assert!(again.contains("cannot be recovered"), "{again}");
    h.socket_closed(&s, generation);
    assert_eq!(h.session_count(), 0);
    assert_eq!(h.stats().counters().replay_lost_sessions, 1);
}

#[tokio::test]
async fn recovery_succeeds_when_the_ack_covers_the_evicted_frames() {
    let h = hub(small_replay_buffer());
    let (s, generation, _rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    flood(&h, 10);
    s.sequence_ack(7);
    h.socket_closed(&s, generation);
    assert_eq!(
        h.session_count(),
        1,
        "kept: every unacked frame is buffered"
    );
    let (out, _rx2) = outbox(64, 1 << 20);
    let (_, replay, _) = s.attach(out).unwrap();
    let ids: Vec<u64> = replay.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [8, 9, 10]);
}

#[tokio::test]
async fn a_detached_session_whose_buffer_overflows_is_deleted_at_once() {
    let h = hub(small_replay_buffer());
    let (s, generation, _rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    flood(&h, 2);
    h.socket_closed(&s, generation);
    flood(&h, 2);
    assert_eq!(h.session_count(), 1, "4 frames fit");
    assert_eq!(publish(&h, "g", &text(&"x".repeat(100)), None), 0);
    assert_eq!(h.session_count(), 0, "the 5th could not be kept for replay");
    let why = h
        .recover(s.id(), s.reconnection_token().unwrap())
        .unwrap_err()
        .to_string();
    assert!(why.contains("cannot be recovered"), "{why}");
}

#[tokio::test]
async fn slow_reliable_consumer_is_closed_with_1013_and_stays_recoverable() {
    let h = hub(Limits::default());
    let s = h.create_session(&claims(&["g"]), Subprotocol::JsonReliable);
    let (out, mut rx) = outbox(2, 1 << 20);
    let (generation, _, _) = s.attach(out).unwrap();
    flood(&h, 5);
    assert_eq!(rx.closed().await.code, CLOSE_TRY_AGAIN);
    assert_eq!(h.stats().counters().slow_consumers, 1, "counted once");
    h.socket_closed(&s, generation);
    let (out, _rx2) = outbox(64, 1 << 20);
    let (_, replay, _) = s.attach(out).unwrap();
    assert_eq!(replay.len(), 5, "nothing lost");
}

#[tokio::test]
async fn slow_non_reliable_consumer_is_disconnected() {
    let h = hub(Limits::default());
    let s = h.create_session(&claims(&["g"]), Subprotocol::Json);
    let (out, mut rx) = outbox(1, 1 << 20);
    s.attach(out).unwrap();
    publish(&h, "g", &text("1"), None);
    publish(&h, "g", &text("2"), None);
    assert_eq!(h.session_count(), 0);
    assert_eq!(rx.closed().await.code, CLOSE_POLICY);
    assert_eq!(h.stats().counters().slow_consumers, 1);
}

#[tokio::test(start_paused = true)]
async fn dropped_reliable_session_expires_after_retention() {
    let h = hub(Limits {
        session_retention: Duration::from_secs(60),
        ..Limits::default()
    });
    let (s, generation, _rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    h.socket_closed(&s, generation);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(h.session_count(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(h.session_count(), 0);
    let (plain, generation, _rx) = connect(&h, Subprotocol::Json, &[]);
    h.socket_closed(&plain, generation);
    assert_eq!(
        h.session_count(),
        0,
        "non-reliable sessions end with their socket"
    );
}

#[tokio::test]
async fn attach_replaces_the_old_socket() {
    let h = hub(Limits::default());
    let (s, _, mut old) = connect(&h, Subprotocol::JsonReliable, &[]);
    let (out, _rx) = outbox(4, 1024);
    let (generation, _, _) = s.attach(out).unwrap();
    assert_eq!(generation, 2);
    assert_eq!(old.closed().await.code, 1000);
    h.socket_closed(&s, 1);
    assert_eq!(
        h.session_count(),
        1,
        "a stale generation does not detach the new socket"
    );
}
