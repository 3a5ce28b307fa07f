//! User events and the fire-and-forget system events on a real socket: round trips with
//! the answer sent back, acks and error acks, connections closed by a failed event
//! without `ackId`, raw clients' frames, and `connected`/`disconnected` with the
//! connection state the `connect` answer set.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::IntoResponse;
use common::api::client;
use common::upstream::*;
use common::*;
use futures_util::SinkExt;
use serde_json::json;
use statehub_webpubsub::{HubSettings, SystemEvent};
use tokio_tungstenite::tungstenite::Message;

/// Answers by the event name: `echo` echoes text back, `json` answers JSON, `bin` bytes,
/// `quiet` 204, `fail` 500, `deny` 403.
fn by_event(r: &Recorded) -> axum::response::Response {
    match r.header("ce-eventname").unwrap_or_default() {
        "echo" | "message" => {
            let mut text = b"echo:".to_vec();
            text.extend_from_slice(&r.body);
            (
                StatusCode::OK,
                [("content-type", "text/plain; charset=utf-8")],
                text,
            )
                .into_response()
        }
        "json" => body_of(200, "application/json", br#"{"ok":true}"#),
        "bin" => body_of(200, "application/octet-stream", &[1, 2, 3]),
        "quiet" | "connected" | "disconnected" => empty(),
        "connect" => (StatusCode::OK, [("ce-connectionState", "c3RhdGU=")], "").into_response(),
        "deny" => StatusCode::FORBIDDEN.into_response(),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
    }
}

async fn hub_with_all_events() -> (
    std::net::SocketAddr,
    statehub_webpubsub::WebPubSub,
    Upstream,
) {
    let up = fake_upstream(posts(by_event)).await;
    let (addr, wps) = start_hub(HubSettings {
        event_handlers: vec![
            handler(up.url(), "quiet", &[]),
            handler(
                up.url(),
                "*",
                &[
                    SystemEvent::Connect,
                    SystemEvent::Connected,
                    SystemEvent::Disconnected,
                ],
            ),
        ],
        allow_anonymous: false,
    })
    .await;
    (addr, wps, up)
}

#[tokio::test]
async fn user_event_round_trips() {
    let (addr, _, mut up) = hub_with_all_events().await;
    let t = token(addr, "chat", Some("u1"), &[], &[]);
    let (mut ws, _) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    assert_eq!(up.next_post().await.header("ce-eventname"), Some("connect"));
    assert_eq!(
        up.next_post().await.header("ce-eventname"),
        Some("connected")
    );

    send(
        &mut ws,
        json!({"type":"event","event":"echo","ackId":1,"dataType":"text","data":"hi"}),
    )
    .await;
    let post = up.next_post().await;
    assert_eq!(post.header("ce-type"), Some("azure.webpubsub.user.echo"));
    assert_eq!(post.header("ce-userid"), Some("u1"));
    assert_eq!(post.header("ce-subprotocol"), Some(RELIABLE));
    assert_eq!(
        post.header("ce-connectionstate"),
        Some("c3RhdGU="),
        "set by connect"
    );
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(post.body, b"hi");
    assert_eq!(post.path, "/upstream/chat/echo");
    assert_eq!(
        recv(&mut ws).await,
        json!({"type":"message","from":"server","dataType":"text","data":"echo:hi","sequenceId":1})
    );
    assert_eq!(
        recv(&mut ws).await,
        json!({"type":"ack","ackId":1,"success":true})
    );

    send(
        &mut ws,
        json!({"type":"event","event":"echo","ackId":1,"dataType":"text","data":"again"}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await["error"]["name"],
        "Duplicate",
        "not posted twice"
    );

    send(
        &mut ws,
        json!({"type":"event","event":"json","ackId":2,"dataType":"json","data":{"a":1}}),
    )
    .await;
    let post = up.next_post().await;
    assert_eq!(post.header("content-type"), Some("application/json"));
    assert_eq!(post.json(), json!({"a":1}));
    assert_eq!(recv(&mut ws).await["data"], json!({"ok":true}));
    assert_eq!(recv(&mut ws).await["success"], true);

    send(
        &mut ws,
        json!({"type":"event","event":"bin","ackId":3,"dataType":"binary","data":"AQI="}),
    )
    .await;
    let post = up.next_post().await;
    assert_eq!(
        post.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(post.body, [1, 2]);
    let m = recv(&mut ws).await;
    assert_eq!(
        (m["dataType"].clone(), m["data"].clone()),
        (json!("binary"), json!("AQID"))
    );
    recv(&mut ws).await;

    send(
        &mut ws,
        json!({"type":"event","event":"quiet","ackId":4,"data":1}),
    )
    .await;
    assert_eq!(up.next_post().await.header("ce-eventname"), Some("quiet"));
    assert_eq!(
        recv(&mut ws).await,
        json!({"type":"ack","ackId":4,"success":true}),
        "204: ack only"
    );

    send(
        &mut ws,
        json!({"type":"event","event":"fail","ackId":5,"data":1}),
    )
    .await;
    let ack = recv(&mut ws).await;
    assert_eq!(
        (ack["success"].clone(), ack["error"]["name"].clone()),
        (json!(false), json!("InternalServerError"))
    );
    send(
        &mut ws,
        json!({"type":"event","event":"deny","ackId":6,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["error"]["name"], "Forbidden");
    send(
        &mut ws,
        json!({"type":"event","event":"fail","ackId":5,"data":1}),
    )
    .await;
    assert_eq!(
        recv(&mut ws).await["error"]["name"],
        "InternalServerError",
        "failures are not remembered"
    );
}

#[tokio::test]
async fn a_failed_event_without_ack_id_closes_the_connection() {
    let (addr, _, mut up) = hub_with_all_events().await;
    let t = token(addr, "chat", Some("u1"), &[], &[]);
    let (mut ws, _) = connect(addr, "chat", &t, Some(JSON)).await;
    send(
        &mut ws,
        json!({"type":"event","event":"fail","dataType":"text","data":"x"}),
    )
    .await;
    let d = recv(&mut ws).await;
    assert_eq!(d["event"], "disconnected");
    assert!(d["message"].as_str().unwrap().contains("500"), "{d}");
    assert_eq!(close_code(&mut ws).await, Some(1011));
    let mut names = Vec::new();
    for _ in 0..4 {
        names.push(
            up.next_post()
                .await
                .header("ce-eventname")
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(names, ["connect", "connected", "fail", "disconnected"]);
}

#[tokio::test]
async fn raw_frames_are_message_events() {
    let (addr, _, mut up) = hub_with_all_events().await;
    let t = token(addr, "chat", Some("raw"), &[], &[]);
    let (mut ws, _) = connect(addr, "chat", &t, None).await;
    up.next_post().await;
    up.next_post().await;
    ws.send(Message::text("hello")).await.unwrap();
    let post = up.next_post().await;
    assert_eq!(post.header("ce-type"), Some("azure.webpubsub.user.message"));
    assert!(post.header("ce-subprotocol").is_none());
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert_eq!(next_frame(&mut ws).await, Some(Message::text("echo:hello")));
    ws.send(Message::binary(vec![9u8])).await.unwrap();
    let post = up.next_post().await;
    assert_eq!(
        post.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(post.body, [9]);
    assert_eq!(next_frame(&mut ws).await, Some(Message::text("echo:\u{9}")));
}

#[tokio::test]
async fn events_without_a_handler_are_acked_and_not_posted() {
    let up = fake_upstream(posts(by_event)).await;
    let (addr, _) = start_hub(HubSettings {
        event_handlers: vec![handler(up.url(), "only-this", &[])],
        allow_anonymous: false,
    })
    .await;
    let mut up = up;
    let t = token(addr, "chat", None, &[], &[]);
    let (mut ws, _) = connect(addr, "chat", &t, Some(JSON)).await;
    send(
        &mut ws,
        json!({"type":"event","event":"other","ackId":1,"data":1}),
    )
    .await;
    assert_eq!(recv(&mut ws).await["success"], true);
    up.nothing_for(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn connected_and_disconnected_carry_state_and_reason() {
    let (addr, _, mut up) = hub_with_all_events().await;
    let t = token(addr, "chat", Some("u1"), &[], &[]);
    let (ws, c) = connect(addr, "chat", &t, Some(JSON)).await;
    let cid = c["connectionId"].as_str().unwrap().to_owned();
    up.next_post().await;
    let connected = up.next_post().await;
    assert_eq!(
        connected.header("ce-type"),
        Some("azure.webpubsub.sys.connected")
    );
    assert_eq!(connected.json(), json!({}));
    assert_eq!(connected.header("ce-connectionstate"), Some("c3RhdGU="));
    assert_eq!(connected.header("ce-connectionid"), Some(cid.as_str()));
    drop(ws);
    let disconnected = up.next_post().await;
    assert_eq!(
        disconnected.header("ce-type"),
        Some("azure.webpubsub.sys.disconnected")
    );
    assert_eq!(
        disconnected.json(),
        json!({"reason": "The client closed the connection"})
    );

    let (_ws, c) = connect(addr, "chat", &t, Some(JSON)).await;
    up.next_post().await;
    up.next_post().await;
    let api = common::api::Api::new(addr);
    let cid = c["connectionId"].as_str().unwrap();
    api.call(
        "DELETE",
        &format!(
            "/api/hubs/chat/connections/{cid}?{}&reason=kicked",
            common::api::V
        ),
    )
    .await;
    assert_eq!(up.next_post().await.json(), json!({"reason": "kicked"}));

    let (ws, _) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    up.next_post().await;
    up.next_post().await;
    drop(ws);
    up.nothing_for(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_stuck_upstream_never_holds_up_connections() {
    // An upstream that takes 30 s to answer anything but the abuse-protection check.
    let app = axum::Router::new().fallback(|req: axum::extract::Request| async move {
        if req.method() != "OPTIONS" {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        allow_all()
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut config = statehub_webpubsub::Config::new([KEY]);
    config.limits.upstream_queue = 4;
    config.hubs.insert(
        "chat".into(),
        HubSettings {
            event_handlers: vec![handler(
                format!("http://{up}/{{event}}"),
                "",
                &[SystemEvent::Connected, SystemEvent::Disconnected],
            )],
            allow_anonymous: false,
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let wps = statehub_webpubsub::WebPubSub::new(config);
    tokio::spawn(async move { axum::serve(listener, statehub_webpubsub::router(wps)).await });

    let started = tokio::time::Instant::now();
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(client(addr, Some("u"), &[], Some(JSON)).await.0);
    }
    let api = common::api::Api::new(addr);
    let r = api
        .call(
            "POST",
            &format!(
                "/api/hubs/chat/users/u/:closeConnections?{}",
                common::api::V
            ),
        )
        .await;
    assert_eq!(r.status, 204);
    for ws in &mut clients {
        assert_eq!(recv(ws).await["event"], "disconnected");
        assert_eq!(close_code(ws).await, Some(1000));
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "connected/disconnected events are queued (and dropped past the bound), never awaited: {:?}",
        started.elapsed()
    );
}
