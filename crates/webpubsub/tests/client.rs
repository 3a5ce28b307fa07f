//! The client endpoint on a real socket: handshake, groups, acks, permissions, framing.

mod common;

use common::*;
use futures_util::SinkExt;
use serde_json::json;
use statehub_webpubsub::Limits;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

const ALL: &[&str] = &["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"];

#[tokio::test]
async fn connected_comes_first_with_the_echoed_subprotocol() {
    let addr = start(Limits::default()).await;
    let (_ws, c) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("alice"), &[], &[]),
        Some(RELIABLE),
    )
    .await;
    assert_eq!(c["type"], "system");
    assert_eq!(c["event"], "connected");
    assert_eq!(c["userId"], "alice");
    assert!(c["connectionId"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(
        c["reconnectionToken"]
            .as_str()
            .is_some_and(|s| s.len() >= 43),
        "256-bit token"
    );

    let (_ws, c) = connect(
        addr,
        "chat",
        &token(addr, "chat", None, &[], &[]),
        Some(JSON),
    )
    .await;
    assert_eq!(c["event"], "connected");
    assert!(
        c.get("reconnectionToken").is_none(),
        "only reliable protocols get a reconnection token"
    );
    assert!(c.get("userId").is_none());
}

#[tokio::test]
async fn join_and_send_between_two_clients() {
    let addr = start(Limits::default()).await;
    let (mut a, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("a"), ALL, &[]),
        Some(RELIABLE),
    )
    .await;
    let (mut b, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("b"), ALL, &[]),
        Some(JSON),
    )
    .await;
    send(&mut a, json!({"type":"joinGroup","group":"room","ackId":1})).await;
    assert_eq!(
        recv(&mut a).await,
        json!({"type":"ack","ackId":1,"success":true})
    );

    send(&mut b, json!({"type":"sendToGroup","group":"room","ackId":1,"dataType":"json","data":{"hello":[1,2]}})).await;
    assert_eq!(
        recv(&mut b).await,
        json!({"type":"ack","ackId":1,"success":true})
    );
    assert_eq!(
        recv(&mut a).await,
        json!({"type":"message","from":"group","group":"room","fromUserId":"b","dataType":"json",
               "data":{"hello":[1,2]},"sequenceId":1})
    );
    send(
        &mut b,
        json!({"type":"sendToGroup","group":"room","dataType":"binary","data":"AQID"}),
    )
    .await;
    let m = recv(&mut a).await;
    assert_eq!(
        (
            m["dataType"].clone(),
            m["data"].clone(),
            m["sequenceId"].clone()
        ),
        (json!("binary"), json!("AQID"), json!(2))
    );

    send(
        &mut a,
        json!({"type":"leaveGroup","group":"room","ackId":2}),
    )
    .await;
    assert_eq!(recv(&mut a).await["success"], true);
    send(
        &mut b,
        json!({"type":"sendToGroup","group":"room","dataType":"text","data":"gone"}),
    )
    .await;
    assert_eq!(
        sync(&mut a).await,
        Vec::<serde_json::Value>::new(),
        "nothing after leaving"
    );
}

#[tokio::test]
async fn no_echo_keeps_the_message_from_the_sender() {
    let addr = start(Limits::default()).await;
    let (mut a, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", None, ALL, &["g"]),
        Some(JSON),
    )
    .await;
    send(
        &mut a,
        json!({"type":"sendToGroup","group":"g","noEcho":true,"dataType":"text","data":"quiet"}),
    )
    .await;
    assert!(sync(&mut a).await.is_empty());
    send(
        &mut a,
        json!({"type":"sendToGroup","group":"g","dataType":"text","data":"loud"}),
    )
    .await;
    let got = sync(&mut a).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["data"], "loud");
    assert!(
        got[0].get("sequenceId").is_none(),
        "no sequence ids on the non-reliable protocol"
    );
}

#[tokio::test]
async fn forbidden_without_roles() {
    let addr = start(Limits::default()).await;
    let (mut a, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", None, &["webpubsub.sendToGroup.mine"], &[]),
        Some(JSON),
    )
    .await;
    send(&mut a, json!({"type":"joinGroup","group":"g","ackId":1})).await;
    let ack = recv(&mut a).await;
    assert_eq!(
        (ack["success"].clone(), ack["error"]["name"].clone()),
        (json!(false), json!("Forbidden"))
    );
    send(
        &mut a,
        json!({"type":"sendToGroup","group":"g","ackId":2,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut a).await["error"]["name"], "Forbidden");
    send(
        &mut a,
        json!({"type":"sendToGroup","group":"mine","ackId":3,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut a).await["success"], true);
}

#[tokio::test]
async fn duplicate_ack_id() {
    let addr = start(Limits::default()).await;
    let (mut a, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", None, ALL, &[]),
        Some(RELIABLE),
    )
    .await;
    let msg = json!({"type":"sendToGroup","group":"g","ackId":7,"dataType":"text","data":"x"});
    send(&mut a, msg.clone()).await;
    assert_eq!(
        recv(&mut a).await,
        json!({"type":"ack","ackId":7,"success":true})
    );
    send(&mut a, msg).await;
    assert_eq!(
        recv(&mut a).await,
        json!({"type":"ack","ackId":7,"success":false,
               "error":{"name":"Duplicate","message":"Message with ack-id: 7 has been processed"}})
    );
}

#[tokio::test]
async fn bad_tokens_are_401() {
    let addr = start(Limits::default()).await;
    let wrong_hub = token(addr, "other", None, &[], &[]);
    for url in [
        format!("ws://{addr}/client/hubs/chat"),
        format!("ws://{addr}/client/hubs/chat?access_token=garbage"),
        format!("ws://{addr}/client/hubs/chat?access_token={wrong_hub}"),
    ] {
        match try_connect(&url, Some(JSON)).await {
            Err(WsError::Http(resp)) => assert_eq!(resp.status(), 401, "{url}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn hub_in_query_and_raw_clients_get_bare_data() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", None, ALL, &["g"]);
    let mut raw = try_connect(
        &format!("ws://{addr}/client?hub=chat&access_token={t}"),
        None,
    )
    .await
    .unwrap();
    let (mut pubr, _) = connect(addr, "chat", &t, Some(JSON)).await;
    send(
        &mut pubr,
        json!({"type":"sendToGroup","group":"g","dataType":"text","data":"plain","noEcho":true}),
    )
    .await;
    assert_eq!(next_frame(&mut raw).await, Some(Message::text("plain")));
    send(
        &mut pubr,
        json!({"type":"sendToGroup","group":"g","dataType":"binary","data":"AQID","noEcho":true}),
    )
    .await;
    assert_eq!(
        next_frame(&mut raw).await,
        Some(Message::binary(vec![1u8, 2, 3]))
    );
}

#[tokio::test]
async fn bad_json_is_reported_and_closed_without_harm() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", None, ALL, &[]);
    let (mut a, _) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    send(&mut a, json!({"type":"joinGroup","ackId":4})).await;
    assert_eq!(
        recv(&mut a).await["error"]["name"],
        "BadRequest",
        "a malformed message with an ackId is acked"
    );
    a.send(Message::text("{this is not json")).await.unwrap();
    let d = recv(&mut a).await;
    assert_eq!(
        (d["type"].clone(), d["event"].clone()),
        (json!("system"), json!("disconnected"))
    );
    assert!(d["message"].as_str().unwrap().contains("Invalid message"));
    assert_eq!(close_code(&mut a).await, Some(1008));
    let (mut b, _) = connect(addr, "chat", &t, Some(JSON)).await;
    assert!(sync(&mut b).await.is_empty(), "the server still serves");
}

#[tokio::test]
async fn oversized_frames_are_refused() {
    let addr = start(Limits {
        max_frame_bytes: 64 * 1024,
        ..Limits::default()
    })
    .await;
    let t = token(addr, "chat", None, ALL, &[]);
    let (mut a, _) = connect(addr, "chat", &t, Some(JSON)).await;
    let big = format!(
        r#"{{"type":"sendToGroup","group":"g","dataType":"text","data":"{}"}}"#,
        "x".repeat(100 * 1024)
    );
    let _ = a.send(Message::text(big)).await;
    let code = close_code(&mut a).await;
    // The server sends close 1009, but the payload it did not read makes its TCP stack
    // reset the connection, which may reach the client first.
    assert!(matches!(code, Some(1009) | None), "closed: {code:?}");
    let (mut b, _) = connect(addr, "chat", &t, Some(JSON)).await;
    assert!(sync(&mut b).await.is_empty());
}
