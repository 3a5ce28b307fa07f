//! A real server on 127.0.0.1:0 and a tokio-tungstenite client speaking the JSON
//! subprotocols, for the integration tests.
//! Each test binary uses a different part of it.
#![allow(dead_code)]

pub mod api;
pub mod upstream;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use statehub_webpubsub::{issue_client_token, ClientClaims};
use statehub_webpubsub::{router, Config, Limits, WebPubSub};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const KEY: &str = "test-access-key";
pub const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";
pub const JSON: &str = "json.webpubsub.azure.v1";

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

pub async fn start(limits: Limits) -> SocketAddr {
    let mut config = Config::new(["secondary-key", KEY]);
    config.limits = limits;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(WebPubSub::new(config))).await });
    addr
}

pub fn token(
    addr: SocketAddr,
    hub: &str,
    user: Option<&str>,
    roles: &[&str],
    groups: &[&str],
) -> String {
    let claims = ClientClaims {
        user_id: user.map(str::to_owned),
        roles: roles.iter().map(|r| r.to_string()).collect(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    issue_client_token(
        KEY,
        &format!("http://{addr}"),
        hub,
        &claims,
        Duration::from_secs(3600),
    )
}

pub async fn try_connect(
    url: &str,
    protocol: Option<&str>,
) -> Result<Ws, tokio_tungstenite::tungstenite::Error> {
    let mut req = url.into_client_request().unwrap();
    if let Some(p) = protocol {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(p).unwrap());
    }
    let (ws, resp) = tokio_tungstenite::connect_async(req).await?;
    let echoed = resp
        .headers()
        .get("Sec-WebSocket-Protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(
        echoed.as_deref(),
        protocol,
        "the offered subprotocol is echoed"
    );
    Ok(ws)
}

/// Connects and reads the `connected` message.
pub async fn connect(
    addr: SocketAddr,
    hub: &str,
    token: &str,
    protocol: Option<&str>,
) -> (Ws, Value) {
    let url = format!("ws://{addr}/client/hubs/{hub}?access_token={token}");
    let mut ws = try_connect(&url, protocol).await.unwrap();
    let connected = if protocol.is_some() {
        recv(&mut ws).await
    } else {
        Value::Null
    };
    (ws, connected)
}

/// The next data frame (text as JSON), skipping pings; panics after 5 s.
pub async fn recv(ws: &mut Ws) -> Value {
    match next_frame(ws).await {
        Some(Message::Text(t)) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

pub async fn next_frame(ws: &mut Ws) -> Option<Message> {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .expect("timed out waiting for a frame");
        match frame {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(m)) => return Some(m),
            Some(Err(_)) | None => return None,
        }
    }
}

/// The close code the server ends with (after any other frames), or None if the
/// connection just ended.
/// The next protobuf frame's message, skipping pings; panics after 5 s.
pub async fn recv_pb(ws: &mut Ws) -> statehub_webpubsub::proto::Downstream {
    use prost::Message as _;
    match next_frame(ws).await {
        Some(Message::Binary(b)) => {
            statehub_webpubsub::proto::DownstreamMessage::decode(b.as_ref())
                .unwrap()
                .message
                .unwrap()
        }
        other => panic!("expected a binary frame, got {other:?}"),
    }
}

pub async fn close_code(ws: &mut Ws) -> Option<u16> {
    loop {
        match next_frame(ws).await? {
            Message::Close(frame) => return frame.map(|f| u16::from(f.code)),
            _ => continue,
        }
    }
}

pub async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// Sends a ping message and waits for its pong: everything sent before it is processed
/// and everything the server queued before it has been read.
pub async fn sync(ws: &mut Ws) -> Vec<Value> {
    send(ws, serde_json::json!({"type":"ping"})).await;
    let mut before = Vec::new();
    loop {
        let v = recv(ws).await;
        if v["type"] == "pong" {
            return before;
        }
        before.push(v);
    }
}
