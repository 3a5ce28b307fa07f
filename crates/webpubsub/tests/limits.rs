//! The abuse limits on a real socket: connections per hub (429 at the handshake) and
//! groups per connection (a `joinGroup` ack error, a REST 400, a refused handshake for
//! a token listing too many groups), each counted.

mod common;

use std::net::SocketAddr;

use common::api::{Api, V};
use common::*;
use serde_json::{json, Value};
use statehub_webpubsub::{router, Config, Limits, WebPubSub};
use tokio_tungstenite::tungstenite::Error as WsError;

const JOIN: &str = "webpubsub.joinLeaveGroup";

async fn start_with(limits: Limits) -> (SocketAddr, WebPubSub) {
    let mut config = Config::new(["secondary-key", KEY]);
    config.limits = limits;
    let service = WebPubSub::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(service.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, service)
}

/// The status and JSON body of a refused handshake.
async fn refused(addr: SocketAddr, hub: &str, token: &str) -> (u16, Value) {
    let url = format!("ws://{addr}/client/hubs/{hub}?access_token={token}");
    match try_connect(&url, Some(JSON)).await {
        Err(WsError::Http(resp)) => {
            let body = resp.body().clone().unwrap_or_default();
            let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
            (resp.status().as_u16(), json)
        }
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_full_hub_refuses_new_connections_with_429() {
    let limits = Limits {
        max_connections_per_hub: 2,
        ..Limits::default()
    };
    let (addr, service) = start_with(limits).await;
    let t = token(addr, "chat", Some("u"), &[], &[]);
    let (mut first, _) = connect(addr, "chat", &t, Some(JSON)).await;
    let (_second, _) = connect(addr, "chat", &t, Some(JSON)).await;

    let (status, body) = refused(addr, "chat", &t).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "TooManyConnections", "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert_eq!(service.counters().hub_full_refusals, 1);

    // Other hubs have their own count.
    let other = token(addr, "other", Some("u"), &[], &[]);
    connect(addr, "other", &other, Some(JSON)).await;

    // A closed connection frees its place once the server sees the close (the session
    // ends with a non-reliable socket): retried, with a bound generous for a loaded box.
    first.close(None).await.unwrap();
    let mut attempts = 0;
    loop {
        let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
        match try_connect(&url, Some(JSON)).await {
            Ok(_) => break,
            Err(WsError::Http(resp)) if resp.status() == 429 && attempts < 1000 => {
                attempts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            other => panic!("the freed place was not given back: {other:?}"),
        }
    }
}

async fn ack(ws: &mut Ws, v: Value) -> Value {
    send(ws, v).await;
    let reply = recv(ws).await;
    assert_eq!(reply["type"], "ack", "{reply}");
    reply
}

async fn status(api: &Api, method: &str, path: &str) -> u16 {
    let sep = if path.contains('?') { '&' } else { '?' };
    api.call(method, &format!("{path}{sep}{V}"))
        .await
        .status
        .as_u16()
}

#[tokio::test]
async fn a_join_past_the_group_limit_is_refused_and_joins_nothing() {
    let limits = Limits {
        max_groups_per_connection: 2,
        ..Limits::default()
    };
    let (addr, service) = start_with(limits).await;
    let api = Api::new(addr);
    let t = token(addr, "chat", Some("u"), &[JOIN], &[]);
    let (mut ws, _) = connect(addr, "chat", &t, Some(JSON)).await;
    for (i, g) in ["g1", "g2"].into_iter().enumerate() {
        let a = ack(&mut ws, json!({"type":"joinGroup","group":g,"ackId":i + 1})).await;
        assert_eq!(a["success"], true, "{a}");
    }
    let a = ack(&mut ws, json!({"type":"joinGroup","group":"g3","ackId":3})).await;
    assert_eq!(a["success"], false, "{a}");
    assert_eq!(a["error"]["name"], "BadRequest", "{a}");
    assert!(a["error"]["message"].is_string(), "{a}");
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g3").await, 404);
    assert_eq!(service.counters().group_limit_refusals, 1);

    // Joining a group it is in is no new group; leaving one makes room.
    let a = ack(&mut ws, json!({"type":"joinGroup","group":"g1","ackId":4})).await;
    assert_eq!(a["success"], true, "{a}");
    ack(&mut ws, json!({"type":"leaveGroup","group":"g1","ackId":5})).await;
    let a = ack(&mut ws, json!({"type":"joinGroup","group":"g3","ackId":6})).await;
    assert_eq!(a["success"], true, "{a}");
}

#[tokio::test]
async fn rest_joins_past_the_group_limit_answer_400() {
    let limits = Limits {
        max_groups_per_connection: 1,
        ..Limits::default()
    };
    let (addr, service) = start_with(limits).await;
    let api = Api::new(addr);
    let full = token(addr, "chat", Some("u"), &[], &["g1"]);
    let (_a, connected) = connect(addr, "chat", &full, Some(JSON)).await;
    let cid = connected["connectionId"].as_str().unwrap().to_owned();
    let empty = token(addr, "chat", Some("u"), &[], &[]);
    let (_b, _) = connect(addr, "chat", &empty, Some(JSON)).await;

    let reply = api
        .call(
            "PUT",
            &format!("/api/hubs/chat/groups/g2/connections/{cid}?{V}"),
        )
        .await;
    reply.error(400);
    // The user's other connection has room, but one of them is full: nobody joins.
    let reply = api
        .call("PUT", &format!("/api/hubs/chat/users/u/groups/g2?{V}"))
        .await;
    reply.error(400);
    assert_eq!(status(&api, "HEAD", "/api/hubs/chat/groups/g2").await, 404);
    assert_eq!(service.counters().group_limit_refusals, 2);
    let member = format!("/api/hubs/chat/groups/g1/connections/{cid}");
    assert_eq!(status(&api, "PUT", &member).await, 200, "already in g1");
}

#[tokio::test]
async fn a_token_listing_too_many_groups_is_refused() {
    let limits = Limits {
        max_groups_per_connection: 2,
        ..Limits::default()
    };
    let (addr, service) = start_with(limits).await;
    let many = token(addr, "chat", Some("u"), &[], &["a", "b", "c"]);
    let (status, body) = refused(addr, "chat", &many).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "BadRequest", "{body}");
    assert_eq!(service.counters().group_limit_refusals, 1);
    // A group listed twice counts once.
    let twice = token(addr, "chat", Some("u"), &[], &["a", "b", "a"]);
    connect(addr, "chat", &twice, Some(JSON)).await;
}
