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
    let (generation, replay) = s.attach(out).unwrap();
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
    h.join(&b, "g");
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
    let (_, replay) = s2.attach(out).unwrap();
    let ids: Vec<bool> = replay
        .iter()
        .enumerate()
        .map(|(i, f)| {
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
    assert_eq!(h.recover(s.id(), "forged").unwrap_err(), Gone);
    assert_eq!(
        h.recover("nope", s.reconnection_token().unwrap())
            .unwrap_err(),
        Gone
    );
    let (plain, _, _rx2) = connect(&h, Subprotocol::Json, &[]);
    assert!(plain.reconnection_token().is_none());
    assert_eq!(h.recover(plain.id(), "").unwrap_err(), Gone);
}

#[tokio::test]
async fn unacked_overflow_deletes_the_session_with_1008() {
    let h = hub(Limits {
        max_unacked_messages: 2,
        ..Limits::default()
    });
    let (s, _, mut rx) = connect(&h, Subprotocol::JsonReliable, &["g"]);
    publish(&h, "g", &text("1"), None);
    publish(&h, "g", &text("2"), None);
    assert_eq!(publish(&h, "g", &text("3"), None), 0);
    assert_eq!(h.session_count(), 0);
    assert_eq!(rx.closed().await.code, CLOSE_POLICY);
    assert_eq!(
        h.recover(s.id(), s.reconnection_token().unwrap())
            .unwrap_err(),
        Gone
    );
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
    let (generation, _) = s.attach(out).unwrap();
    assert_eq!(generation, 2);
    assert_eq!(old.closed().await.code, 1000);
    h.socket_closed(&s, 1);
    assert_eq!(
        h.session_count(),
        1,
        "a stale generation does not detach the new socket"
    );
}
