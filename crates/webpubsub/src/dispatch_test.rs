use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::config::Limits;
use crate::protocol::Subprotocol;
use crate::token::ClientClaims;

fn setup(roles: &[&str]) -> (Hub, Arc<Session>) {
    let hub = Hub::new("chat", Limits::default());
    let claims = ClientClaims {
        user_id: Some("u".into()),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        groups: vec![],
    };
    let session = hub.create_session(&claims, Subprotocol::JsonReliable);
    (hub, session)
}

fn replies(hub: &Hub, s: &Session, text: &str) -> Vec<serde_json::Value> {
    let fx = handle_text(hub, s, text);
    assert_eq!(fx.close, None);
    fx.replies
        .iter()
        .map(|r| serde_json::to_value(r).unwrap())
        .collect()
}

#[test]
fn join_with_permission_acks() {
    let (hub, s) = setup(&["webpubsub.joinLeaveGroup"]);
    assert_eq!(
        replies(&hub, &s, r#"{"type":"joinGroup","group":"g","ackId":1}"#),
        [json!({"type":"ack","ackId":1,"success":true})]
    );
    assert_eq!(s.groups(), ["g"]);
    assert!(replies(&hub, &s, r#"{"type":"leaveGroup","group":"g"}"#).is_empty());
    assert!(s.groups().is_empty());
}

#[test]
fn forbidden_without_role_and_not_remembered() {
    let (hub, s) = setup(&["webpubsub.sendToGroup.other"]);
    let r = replies(
        &hub,
        &s,
        r#"{"type":"sendToGroup","group":"g","ackId":5,"data":1}"#,
    );
    assert_eq!(r[0]["success"], json!(false));
    assert_eq!(r[0]["error"]["name"], json!("Forbidden"));
    let r = replies(
        &hub,
        &s,
        r#"{"type":"sendToGroup","group":"g","ackId":5,"data":1}"#,
    );
    assert_eq!(
        r[0]["error"]["name"],
        json!("Forbidden"),
        "a refused ackId is not a duplicate"
    );
    let r = replies(&hub, &s, r#"{"type":"joinGroup","group":"g","ackId":6}"#);
    assert_eq!(r[0]["error"]["name"], json!("Forbidden"));
}

#[test]
fn duplicate_ack_id() {
    let (hub, s) = setup(&["webpubsub.sendToGroup"]);
    let send = r#"{"type":"sendToGroup","group":"g","ackId":1,"dataType":"text","data":"x"}"#;
    assert_eq!(
        replies(&hub, &s, send),
        [json!({"type":"ack","ackId":1,"success":true})]
    );
    assert_eq!(
        replies(&hub, &s, send),
        [json!({"type":"ack","ackId":1,"success":false,
                "error":{"name":"Duplicate","message":"Message with ack-id: 1 has been processed"}})]
    );
}

#[test]
fn bad_requests_are_acked() {
    let (hub, s) = setup(&["webpubsub.sendToGroup", "webpubsub.joinLeaveGroup"]);
    for text in [
        r#"{"type":"sendToGroup","group":"g","ackId":1,"dataType":"binary","data":"***"}"#,
        r#"{"type":"sendToGroup","group":"g","ackId":1,"dataType":"text","data":5}"#,
        r#"{"type":"joinGroup","group":"","ackId":1}"#,
        r#"{"type":"joinGroup","ackId":1}"#,
        r#"{"type":"event","event":"","ackId":1}"#,
    ] {
        let r = replies(&hub, &s, text);
        assert_eq!(r[0]["error"]["name"], json!("BadRequest"), "{text}");
    }
}

#[test]
fn ping_event_sequence_ack_and_unknown() {
    let (hub, s) = setup(&[]);
    assert_eq!(
        replies(&hub, &s, r#"{"type":"ping"}"#),
        [json!({"type":"pong"})]
    );
    assert_eq!(
        replies(
            &hub,
            &s,
            r#"{"type":"event","event":"e","ackId":9,"dataType":"text","data":"x"}"#
        ),
        [json!({"type":"ack","ackId":9,"success":true})]
    );
    assert!(replies(&hub, &s, r#"{"type":"sequenceAck","sequenceId":3}"#).is_empty());
    assert!(replies(&hub, &s, r#"{"type":"fancyNewThing"}"#).is_empty());
}

#[test]
fn malformed_frames_close_with_1008() {
    let (hub, s) = setup(&[]);
    for text in ["not json", "[]", r#"{"type":"joinGroup"}"#] {
        let fx = handle_text(&hub, &s, text);
        assert!(fx.replies.is_empty());
        assert_eq!(fx.close.map(|c| c.code), Some(CLOSE_POLICY), "{text}");
    }
}

/// An invocation the upstream cannot be asked is answered at once, never left waiting.
#[test]
fn invocations_without_an_upstream_are_refused_at_once() {
    let (hub, s) = setup(&[]);
    let r = replies(
        &hub,
        &s,
        r#"{"type":"invoke","invocationId":"7","target":"event","event":"ask","dataType":"text","data":"hi"}"#,
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["type"], json!("invokeResponse"));
    assert_eq!(r[0]["invocationId"], json!("7"));
    assert_eq!(r[0]["success"], json!(false));
    assert_eq!(r[0]["error"]["name"], json!("BadRequest"));
    assert!(r[0].get("data").is_none());
    let other = replies(
        &hub,
        &s,
        r#"{"type":"invoke","invocationId":"8","target":"group","event":"ask"}"#,
    );
    assert!(other[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("target"));
    let bad = replies(
        &hub,
        &s,
        r#"{"type":"invoke","invocationId":"9","target":"event","event":"ask","dataType":"binary","data":"!!"}"#,
    );
    assert_eq!(bad[0]["success"], json!(false));
    assert!(
        replies(
            &hub,
            &s,
            r#"{"type":"cancelInvocation","invocationId":"7"}"#
        )
        .is_empty(),
        "cancel is ignored"
    );
}
