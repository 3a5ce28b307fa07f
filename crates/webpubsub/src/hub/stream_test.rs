use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::Message;
use serde_json::{json, Value};

use crate::config::Limits;
use crate::dispatch::handle_text;
use crate::hub::{Hub, Session};
use crate::outbox::{outbox, OutboxReceiver};
use crate::protocol::Subprotocol;
use crate::token::ClientClaims;

fn hub() -> Arc<Hub> {
    Arc::new(Hub::new("chat", Limits::default()))
}

fn connect(
    hub: &Hub,
    roles: &[&str],
    groups: &[&str],
    protocol: Subprotocol,
) -> (Arc<Session>, OutboxReceiver) {
    let claims = ClientClaims {
        user_id: Some(format!("u{}", roles.len())),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let s = hub.create_session(&claims, protocol);
    let (out, rx) = outbox(64, 1 << 20);
    s.attach(out).unwrap();
    (s, rx)
}

/// Handles one frame; returns its replies, spawning the idle timer like the connection.
fn send(hub: &Arc<Hub>, s: &Arc<Session>, frame: Value) -> Vec<Value> {
    let fx = handle_text(hub, s, &frame.to_string());
    assert_eq!(fx.close, None);
    if let Some(timer) = fx.stream_timer {
        super::spawn_idle_timer(Arc::clone(hub), Arc::clone(s), timer);
    }
    fx.replies
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

fn next(rx: &mut OutboxReceiver) -> Option<Value> {
    match rx.try_frame().map(|f| f.msg) {
        Some(Message::Text(t)) => Some(serde_json::from_str(t.as_str()).unwrap()),
        None => None,
        other => panic!("{other:?}"),
    }
}

const SENDER: &[&str] = &["webpubsub.sendToGroup"];

#[tokio::test]
async fn fragments_reach_the_group_in_order_and_end() {
    let h = hub();
    let (pubr, _) = connect(&h, SENDER, &[], Subprotocol::JsonReliable);
    let (_sub, mut rx) = connect(&h, &[], &["g"], Subprotocol::JsonReliable);
    let start = json!({"type":"streamStart","streamId":"s1","target":"group","group":"g"});
    assert_eq!(
        send(&h, &pubr, start),
        [json!({"type":"streamAck","streamId":"s1","expectedSequenceId":1})]
    );
    let d1 = json!({"type":"streamData","streamId":"s1","streamSequenceId":1,"dataType":"text","data":"hello "});
    assert_eq!(
        send(&h, &pubr, d1.clone())[0]["expectedSequenceId"],
        json!(2)
    );
    // A retry of fragment 1 is acknowledged again, not published twice.
    assert_eq!(send(&h, &pubr, d1)[0]["expectedSequenceId"], json!(2));
    let skip = json!({"type":"streamData","streamId":"s1","streamSequenceId":3,"dataType":"text","data":"x"});
    let nack = send(&h, &pubr, skip);
    assert_eq!(nack[0]["type"], json!("streamNack"));
    assert_eq!(nack[0]["name"], json!("InvalidSequenceId"));
    assert_eq!(nack[0]["expectedSequenceId"], json!(2));
    let keepalive = json!({"type":"streamData","streamId":"s1"});
    assert_eq!(
        send(&h, &pubr, keepalive)[0]["expectedSequenceId"],
        json!(2)
    );
    let d2 = json!({"type":"streamData","streamId":"s1","streamSequenceId":2,"dataType":"json","data":{"a":1}});
    send(&h, &pubr, d2);
    let end = json!({"type":"streamEnd","streamId":"s1"});
    assert_eq!(
        send(&h, &pubr, end),
        [json!({"type":"streamClosed","streamId":"s1"})]
    );

    let m1 = next(&mut rx).unwrap();
    assert_eq!(
        m1,
        json!({"type":"message","from":"group","group":"g","fromUserId":"u1","dataType":"text","data":"hello ",
        "stream":{"streamId":"s1","streamSequenceId":1},"sequenceId":1})
    );
    let m2 = next(&mut rx).unwrap();
    assert_eq!(m2["data"], json!({"a":1}));
    assert_eq!(m2["stream"]["streamSequenceId"], json!(2));
    let last = next(&mut rx).unwrap();
    assert_eq!(
        last["stream"],
        json!({"streamId":"s1","streamSequenceId":3,"endOfStream":true})
    );
    assert_eq!(
        (last["dataType"].clone(), last["data"].clone()),
        (json!("text"), json!(""))
    );
    assert_eq!(next(&mut rx), None);
    // The id is free again once ended; an unknown stream is reported as not found.
    let again = json!({"type":"sendToGroup","group":"g","stream":{"streamId":"s1"}});
    assert_eq!(send(&h, &pubr, again)[0]["type"], json!("streamAck"));
    let unknown = send(&h, &pubr, json!({"type":"streamEnd","streamId":"nope"}));
    assert_eq!(unknown[0]["error"]["name"], json!("StreamNotFound"));
}

#[tokio::test]
async fn user_error_reaches_subscribers() {
    let h = hub();
    let (pubr, _) = connect(&h, SENDER, &[], Subprotocol::Json);
    let (_sub, mut rx) = connect(&h, &[], &["g"], Subprotocol::Json);
    send(
        &h,
        &pubr,
        json!({"type":"streamStart","streamId":"e","group":"g"}),
    );
    let end = json!({"type":"streamEnd","streamId":"e","error":{"message":"publisher failed","userErrorCode":"APP_42"}});
    send(&h, &pubr, end);
    let last = next(&mut rx).unwrap();
    assert_eq!(
        last["stream"],
        json!({"streamId":"e","streamSequenceId":1,"endOfStream":true,
            "error":{"name":"UserError","message":"publisher failed","userErrorCode":"APP_42"}})
    );
}

#[tokio::test]
async fn refused_starts() {
    let h = hub();
    let (no_role, _) = connect(&h, &[], &[], Subprotocol::Json);
    let r = send(
        &h,
        &no_role,
        json!({"type":"streamStart","streamId":"s","group":"g"}),
    );
    assert_eq!(r[0]["type"], json!("streamClosed"));
    assert_eq!(r[0]["error"]["name"], json!("Forbidden"));
    let (p, _) = connect(&h, SENDER, &[], Subprotocol::Json);
    let r = send(
        &h,
        &p,
        json!({"type":"streamStart","streamId":"s","group":"g","idleTimeoutMs":0}),
    );
    assert_eq!(r[0]["error"]["name"], json!("BadRequest"));
    send(
        &h,
        &p,
        json!({"type":"streamStart","streamId":"s","group":"g"}),
    );
    let r = send(
        &h,
        &p,
        json!({"type":"streamStart","streamId":"s","group":"g"}),
    );
    assert_eq!(r[0]["error"]["name"], json!("BadRequest"), "already open");
}

#[tokio::test]
async fn idle_stream_times_out_for_publisher_and_subscribers() {
    let h = hub();
    let (pubr, mut prx) = connect(&h, SENDER, &[], Subprotocol::JsonReliable);
    let (_sub, mut rx) = connect(&h, &[], &["g"], Subprotocol::Json);
    send(
        &h,
        &pubr,
        json!({"type":"streamStart","streamId":"t","group":"g","idleTimeoutMs":100}),
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    send(&h, &pubr, json!({"type":"streamData","streamId":"t"}));
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        pubr.streams().active.contains_key("t"),
        "a keepalive pushes the deadline back"
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    let closed = next(&mut prx).unwrap();
    assert_eq!(closed["type"], json!("streamClosed"));
    assert_eq!(closed["error"]["name"], json!("IdleTimeout"));
    assert_eq!(
        next(&mut rx).unwrap()["stream"]["error"]["name"],
        json!("IdleTimeout")
    );
    let late = json!({"type":"streamData","streamId":"t","streamSequenceId":1,"dataType":"text","data":"x"});
    assert_eq!(
        send(&h, &pubr, late)[0]["error"]["name"],
        json!("StreamNotFound")
    );
}

#[tokio::test]
async fn publisher_leaving_cancels_its_streams() {
    let h = hub();
    let (pubr, _) = connect(&h, SENDER, &[], Subprotocol::Json);
    let (_sub, mut rx) = connect(&h, &[], &["g"], Subprotocol::Raw);
    let (_json_sub, mut jrx) = connect(&h, &[], &["g"], Subprotocol::Json);
    send(
        &h,
        &pubr,
        json!({"type":"streamStart","streamId":"c","group":"g"}),
    );
    h.remove(pubr.id());
    let last = next(&mut jrx).unwrap();
    assert_eq!(last["stream"]["error"]["name"], json!("Cancelled"));
    assert!(
        rx.try_frame().is_none(),
        "raw clients get no empty terminal frame"
    );
}

#[tokio::test]
async fn a_publisher_handed_over_to_another_node_leaves_its_streams_open() {
    let h = hub();
    let (pubr, _) = connect(&h, SENDER, &[], Subprotocol::JsonReliable);
    let (_json_sub, mut jrx) = connect(&h, &[], &["g"], Subprotocol::Json);
    send(
        &h,
        &pubr,
        json!({"type":"streamStart","streamId":"c","group":"g"}),
    );
    h.hand_over(pubr.id());
    assert!(
        next(&mut jrx).is_none(),
        "no terminal message: the stream goes on where the session went"
    );
    assert!(pubr.streams().active.is_empty(), "forgotten here");
}

#[tokio::test]
async fn a_restored_stream_keeps_the_idle_deadline_it_had_on_its_last_node() {
    use crate::mirror::{unix_ms, MirroredStream};
    let now = tokio::time::Instant::now();
    let stream = |id: &str, deadline_ms| MirroredStream {
        id: id.into(),
        group: "g".into(),
        no_echo: false,
        idle_ms: 60_000,
        expected: 3,
        deadline_ms,
    };
    let copy = [
        stream("due-soon", unix_ms(Some(now + Duration::from_secs(10)))),
        stream("past", unix_ms(Some(now)) - 5_000),
        stream("unknown", 0),
    ];
    let mut streams = super::Streams::default();
    streams.restore(&copy, now);
    let left = |id: &str| streams.active[id].deadline.saturating_duration_since(now);
    assert!(
        (Duration::from_secs(9)..=Duration::from_secs(11)).contains(&left("due-soon")),
        "the deadline it had, not a full timeout again: {:?}",
        left("due-soon")
    );
    assert!(left("past") <= Duration::from_secs(1), "{:?}", left("past"));
    assert_eq!(left("unknown"), Duration::from_secs(60), "none recorded");
}

/// A send delivers under the hub's send order lock; a slow consumer it finds is
/// removed there, and the removal publishes the end of the consumer's open stream,
/// which takes that lock again on the same thread. A takeover waiting for the lock
/// for writing between the two must not make that thread wait for itself.
#[test]
fn a_slow_consumer_with_an_open_stream_removed_while_a_takeover_waits_does_not_deadlock() {
    let h = hub();
    let claims = ClientClaims {
        user_id: Some("p".into()),
        roles: vec![SENDER[0].into()],
        groups: vec!["g".into()],
    };
    let pubr = h.create_session(&claims, Subprotocol::Json);
    let (out, _prx) = outbox(1, 1 << 20);
    pubr.attach(out).unwrap();
    let start = json!({"type":"streamStart","streamId":"s","group":"g"});
    let fx = handle_text(&h, &pubr, &start.to_string());
    assert_eq!(fx.replies.len(), 1, "acked");
    let (_sub, mut rx) = connect(&h, &[], &["g"], Subprotocol::Json);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let hub = Arc::clone(&h);
    let sender = std::thread::spawn(move || {
        let order = hub.sending();
        let takeover = {
            let hub = Arc::clone(&hub);
            std::thread::spawn(move || hub.settled_through(0))
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !hub.order.writer_waits() {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never waited"
            );
            std::thread::yield_now();
        }
        let payload = crate::protocol::Payload::Text("x".into());
        let msg = crate::protocol::json::DataMessageRef {
            from: crate::protocol::json::MessageSource::Group,
            group: Some("g"),
            from_user_id: None,
            payload: &payload,
            stream: None,
        };
        // The first fills the publisher's queue, the second finds it full.
        hub.send_to_group("g", &msg, None);
        hub.send_to_group("g", &msg, None);
        let _ = done_tx.send(());
        drop(order);
        takeover.join().unwrap();
    });
    let done = done_rx.recv_timeout(Duration::from_secs(30));
    assert!(
        done.is_ok(),
        "the send under the lock did not finish ({done:?}): the removal's stream end \
         waited for the writer, which waited for the send"
    );
    sender.join().unwrap();
    assert!(h.session(pubr.id()).is_none(), "removed as a slow consumer");
    // The member gets both sends and the stream's end, in whichever order the group
    // lists the two sessions (by their random ids).
    let got: Vec<Value> = (0..3).map(|_| next(&mut rx).unwrap()).collect();
    let sends = got.iter().filter(|m| m["data"] == json!("x")).count();
    let cancelled = |m: &&Value| m["stream"]["error"]["name"] == json!("Cancelled");
    assert_eq!(
        (sends, got.iter().filter(cancelled).count()),
        (2, 1),
        "{got:?}"
    );
}
