//! Client streams on real sockets, in the frames `@azure/web-pubsub-client`'s streaming
//! preview sends (`streamStart`) and the documented `sendToGroup` with a `stream`.
//! These are the exchanges the azure-sdk-for-js streaming integration tests make; before
//! streams were served, the requests were ignored and those tests timed out.

mod common;

use common::*;
use serde_json::json;
use statehub_webpubsub::Limits;

const SENDER: &[&str] = &["webpubsub.sendToGroup", "webpubsub.joinLeaveGroup"];
const RECEIVER: &[&str] = &["webpubsub.joinLeaveGroup"];

async fn pair(addr: std::net::SocketAddr) -> (Ws, Ws) {
    let (sender, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("s"), SENDER, &[]),
        Some(RELIABLE),
    )
    .await;
    let (mut receiver, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("r"), RECEIVER, &[]),
        Some(RELIABLE),
    )
    .await;
    send(
        &mut receiver,
        json!({"type":"joinGroup","group":"g","ackId":1}),
    )
    .await;
    assert_eq!(recv(&mut receiver).await["success"], true);
    (sender, receiver)
}

#[tokio::test]
async fn a_text_stream_reaches_the_group_and_completes() {
    let addr = start(Limits::default()).await;
    let (mut s, mut r) = pair(addr).await;
    send(
        &mut s,
        json!({"type":"streamStart","streamId":"st","target":"group","group":"g"}),
    )
    .await;
    assert_eq!(
        recv(&mut s).await,
        json!({"type":"streamAck","streamId":"st","expectedSequenceId":1})
    );
    for (seq, chunk) in [(1, "hello "), (2, "world")] {
        send(&mut s, json!({"type":"streamData","streamId":"st","streamSequenceId":seq,"dataType":"text","data":chunk})).await;
        assert_eq!(recv(&mut s).await["expectedSequenceId"], json!(seq + 1));
    }
    send(&mut s, json!({"type":"streamEnd","streamId":"st"})).await;
    assert_eq!(
        recv(&mut s).await,
        json!({"type":"streamClosed","streamId":"st"})
    );

    let m1 = recv(&mut r).await;
    assert_eq!(
        m1,
        json!({"type":"message","from":"group","group":"g","fromUserId":"s","dataType":"text",
               "data":"hello ","stream":{"streamId":"st","streamSequenceId":1},"sequenceId":1})
    );
    assert_eq!(recv(&mut r).await["data"], "world");
    let end = recv(&mut r).await;
    assert_eq!(
        end["stream"],
        json!({"streamId":"st","streamSequenceId":3,"endOfStream":true})
    );
    assert_eq!(
        (end["dataType"].clone(), end["data"].clone()),
        (json!("text"), json!(""))
    );
}

#[tokio::test]
async fn a_user_error_and_the_documented_start_form() {
    let addr = start(Limits::default()).await;
    let (mut s, mut r) = pair(addr).await;
    send(
        &mut s,
        json!({"type":"sendToGroup","group":"g","stream":{"streamId":"e"}}),
    )
    .await;
    assert_eq!(recv(&mut s).await["type"], "streamAck");
    send(&mut s, json!({"type":"streamEnd","streamId":"e","error":{"message":"publisher failed","userErrorCode":"APP_42"}})).await;
    assert_eq!(recv(&mut s).await["type"], "streamClosed");
    assert_eq!(
        recv(&mut r).await["stream"]["error"],
        json!({"name":"UserError","message":"publisher failed","userErrorCode":"APP_42"})
    );
}

#[tokio::test]
async fn an_idle_stream_is_closed_for_both_sides() {
    let addr = start(Limits::default()).await;
    let (mut s, mut r) = pair(addr).await;
    send(
        &mut s,
        json!({"type":"streamStart","streamId":"i","group":"g","idleTimeoutMs":200}),
    )
    .await;
    assert_eq!(recv(&mut s).await["type"], "streamAck");
    send(&mut s, json!({"type":"streamData","streamId":"i","streamSequenceId":1,"dataType":"text","data":"x"})).await;
    assert_eq!(recv(&mut s).await["expectedSequenceId"], 2);
    let closed = recv(&mut s).await;
    assert_eq!(closed["type"], "streamClosed");
    assert_eq!(closed["error"]["name"], "IdleTimeout");
    assert_eq!(recv(&mut r).await["data"], "x");
    assert_eq!(recv(&mut r).await["stream"]["error"]["name"], "IdleTimeout");
    send(&mut s, json!({"type":"streamData","streamId":"i","streamSequenceId":2,"dataType":"text","data":"late"})).await;
    assert_eq!(recv(&mut s).await["error"]["name"], "StreamNotFound");
}

#[tokio::test]
async fn a_stream_without_send_permission_is_refused() {
    let addr = start(Limits::default()).await;
    let (mut r, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("r"), RECEIVER, &[]),
        Some(JSON),
    )
    .await;
    send(
        &mut r,
        json!({"type":"streamStart","streamId":"f","target":"group","group":"g"}),
    )
    .await;
    let closed = recv(&mut r).await;
    assert_eq!(closed["type"], "streamClosed");
    assert_eq!(closed["error"]["name"], "Forbidden");
}
