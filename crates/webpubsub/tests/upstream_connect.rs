//! The blocking `connect` event on a real socket: the request the application server
//! gets, its answer changing the connection, refusals with the handler's status, the
//! abuse-protection handshake, anonymous hubs and upstream-chosen subprotocols.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use common::upstream::*;
use common::*;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use statehub_webpubsub::{HubSettings, SystemEvent};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

fn hmac_hex(key: &str, data: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(data.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn settings(up: &Upstream, system: &[SystemEvent]) -> HubSettings {
    HubSettings {
        event_handlers: vec![handler(up.url(), "", system)],
        allow_anonymous: false,
    }
}

async fn refused_status(url: &str, protocol: Option<&str>) -> u16 {
    match try_connect(url, protocol).await {
        Err(WsError::Http(resp)) => resp.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn connect_answer_sets_user_groups_and_roles() {
    let mut up = fake_upstream(posts(|_| {
        (
            StatusCode::OK,
            [("ce-connectionState", "eyJrIjoidiJ9")],
            r#"{"userId":"override","groups":["g1"],"roles":["webpubsub.sendToGroup"]}"#,
        )
            .into_response()
    }))
    .await;
    let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connect])).await;
    let t = token(addr, "chat", Some("orig"), &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}&extra=1&extra=2");
    let mut ws = try_connect(&url, Some(JSON)).await.unwrap();
    let connected = recv(&mut ws).await;
    assert_eq!(connected["userId"], "override");
    let cid = connected["connectionId"].as_str().unwrap().to_owned();

    let options = up.next().await;
    assert_eq!(options.method, "OPTIONS", "abuse protection comes first");
    assert_eq!(
        options.header("webhook-request-origin"),
        Some("statehub.test")
    );
    let post = up.next().await;
    assert_eq!(post.path, "/upstream/chat/connect");
    assert_eq!(post.header("ce-type"), Some("azure.webpubsub.sys.connect"));
    assert_eq!(post.header("ce-specversion"), Some("1.0"));
    assert_eq!(post.header("ce-awpsversion"), Some("1.0"));
    assert_eq!(post.header("ce-hub"), Some("chat"));
    assert_eq!(post.header("ce-eventname"), Some("connect"));
    assert_eq!(post.header("ce-userid"), Some("orig"));
    assert_eq!(post.header("ce-connectionid"), Some(cid.as_str()));
    let source = format!("/hubs/chat/client/{cid}");
    assert_eq!(post.header("ce-source"), Some(source.as_str()));
    assert!(post.header("ce-id").is_some_and(|v| !v.is_empty()));
    assert!(post.header("ce-time").is_some_and(|v| v.ends_with('Z')));
    assert_eq!(post.header("webhook-request-origin"), Some("statehub.test"));
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    let expected = format!(
        "sha256={},sha256={}",
        hmac_hex("secondary-key", &cid),
        hmac_hex(KEY, &cid)
    );
    assert_eq!(post.header("ce-signature"), Some(expected.as_str()));
    let body = post.json();
    assert_eq!(body["claims"]["sub"], json!(["orig"]));
    assert_eq!(
        body["query"],
        json!({"extra": ["1", "2"]}),
        "no access_token"
    );
    assert_eq!(body["subprotocols"], json!([JSON]));
    assert_eq!(body["clientCertificates"], json!([]));
    assert!(body["headers"]["host"].is_array());
    assert!(body["headers"].get("authorization").is_none());

    send(
        &mut ws,
        json!({"type":"sendToGroup","group":"any","ackId":1,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["success"], true, "the answer's role");
    let api = common::api::Api::new(addr);
    let r = api
        .call(
            "HEAD",
            &format!("/api/hubs/chat/groups/g1?{}", common::api::V),
        )
        .await;
    assert_eq!(r.status, 200, "the answer's group");
}

#[tokio::test]
async fn connect_refusals_keep_the_handlers_status() {
    for (status, expected) in [(401, 401), (403, 403), (400, 400), (503, 503)] {
        let up = fake_upstream(posts(move |_| {
            StatusCode::from_u16(status).unwrap().into_response()
        }))
        .await;
        let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connect])).await;
        let t = token(addr, "chat", None, &[], &[]);
        let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
        assert_eq!(refused_status(&url, Some(JSON)).await, expected);
    }
}

#[tokio::test]
async fn broken_upstreams_refuse_with_500() {
    // Nothing listens on the handler's port.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = format!("http://{}/x", closed.local_addr().unwrap());
    drop(closed);
    let (addr, _) = start_hub(HubSettings {
        event_handlers: vec![handler(dead, "", &[SystemEvent::Connect])],
        allow_anonymous: false,
    })
    .await;
    let t = token(addr, "chat", None, &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    assert_eq!(refused_status(&url, Some(JSON)).await, 500);

    // Abuse protection not passed: no POST follows the OPTIONS.
    let mut up = fake_upstream(std::sync::Arc::new(|_: &Recorded| {
        StatusCode::OK.into_response()
    }))
    .await;
    let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connect])).await;
    let t = token(addr, "chat", None, &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    assert_eq!(refused_status(&url, Some(JSON)).await, 500);
    assert_eq!(up.next().await.method, "OPTIONS");
    up.nothing_for(Duration::from_millis(300)).await;

    // A bad answer body.
    let up = fake_upstream(posts(|_| (StatusCode::OK, "{not json").into_response())).await;
    let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connect])).await;
    let t = token(addr, "chat", None, &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    assert_eq!(refused_status(&url, Some(JSON)).await, 500);
}

#[tokio::test]
async fn allowed_origin_may_name_us() {
    let mut up = fake_upstream(std::sync::Arc::new(|r: &Recorded| {
        if r.method == "OPTIONS" {
            (
                StatusCode::OK,
                [("WebHook-Allowed-Origin", "other.example, statehub.test")],
            )
                .into_response()
        } else {
            empty()
        }
    }))
    .await;
    let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connect])).await;
    let t = token(addr, "chat", Some("u"), &[], &[]);
    let (_ws, c) = connect(addr, "chat", &t, Some(JSON)).await;
    assert_eq!(c["userId"], "u", "204 changes nothing");
    assert_eq!(up.next().await.method, "OPTIONS");
    assert_eq!(up.next().await.method, "POST");
    let (_ws2, _) = connect(addr, "chat", &t, Some(JSON)).await;
    assert_eq!(up.next().await.method, "POST", "the check is remembered");
}

#[tokio::test]
async fn anonymous_hubs_and_chosen_subprotocols() {
    let mut up = fake_upstream(posts(|r| {
        let body = r.json();
        let custom = body["subprotocols"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "chat.custom.v1");
        let answer = if custom {
            json!({"userId":"anon-1","subprotocol":"chat.custom.v1"})
        } else {
            json!({"userId":"anon-2"})
        };
        (
            StatusCode::OK,
            [("content-type", "application/json")],
            answer.to_string(),
        )
            .into_response()
    }))
    .await;
    let (addr, _) = start_hub(HubSettings {
        event_handlers: vec![handler(up.url(), "", &[SystemEvent::Connect])],
        allow_anonymous: true,
    })
    .await;
    let url = format!("ws://{addr}/client/hubs/chat");
    let mut ws = try_connect(&url, Some(JSON)).await.unwrap();
    let c = recv(&mut ws).await;
    assert_eq!(c["userId"], "anon-2");
    let post = up.next_post().await;
    assert!(post.header("ce-userid").is_none());
    assert_eq!(post.json()["claims"], json!({}));

    let mut raw = try_connect(&url, Some("chat.custom.v1")).await.unwrap();
    up.next_post().await;
    raw.send_text("hi").await;
    let api = common::api::Api::new(addr);
    let r = api
        .post(
            &format!("/api/hubs/chat/users/anon-1/:send?{}", common::api::V),
            "text/plain",
            b"to custom",
        )
        .await;
    assert_eq!(r.status, 202);
    assert_eq!(
        next_frame(&mut raw).await,
        Some(Message::text("to custom")),
        "served as raw"
    );

    let t = token(addr, "chat", None, &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    assert_eq!(
        refused_status(&url, Some("not.picked.by.upstream")).await,
        400,
        "a client offering only subprotocols nobody picked is refused, not left unanswered"
    );
}

trait SendText {
    async fn send_text(&mut self, text: &str);
}

impl SendText for Ws {
    async fn send_text(&mut self, text: &str) {
        use futures_util::SinkExt;
        self.send(Message::text(text)).await.unwrap();
    }
}

#[tokio::test]
async fn without_a_connect_handler_unknown_subprotocols_are_refused() {
    let up = fake_upstream(posts(|_| empty())).await;
    let (addr, _) = start_hub(settings(&up, &[SystemEvent::Connected])).await;
    let t = token(addr, "chat", None, &[], &[]);
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}");
    assert_eq!(refused_status(&url, Some("chat.custom.v1")).await, 400);
    let url = format!("ws://{addr}/client/hubs/chat");
    assert_eq!(refused_status(&url, Some(JSON)).await, 401, "not anonymous");
}
