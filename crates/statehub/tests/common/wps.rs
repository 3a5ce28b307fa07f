//! A Web PubSub client for the binary's tests: a raw WebSocket with a token of its own.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use statehub_webpubsub::{issue_client_token, ClientClaims};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long a test waits for one frame.
const PATIENCE: Duration = Duration::from_secs(30);

/// Connects to `hub` on `http` as user `u`, allowed to join groups and send to them,
/// with a token signed by `key`, asking for `protocol` (none: the default subprotocol).
pub async fn client(http: SocketAddr, key: &str, hub: &str, protocol: Option<&str>) -> Ws {
    let claims = ClientClaims {
        user_id: Some("u".into()),
        roles: vec![
            "webpubsub.sendToGroup".into(),
            "webpubsub.joinLeaveGroup".into(),
        ],
        groups: vec![],
    };
    let token = issue_client_token(key, &format!("http://{http}"), hub, &claims, PATIENCE * 20);
    let url = format!("ws://{http}/client/hubs/{hub}?access_token={token}");
    let mut req = url.into_client_request().unwrap();
    if let Some(p) = protocol {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_str(p).unwrap());
    }
    let (ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    ws
}

/// Connects to `hub` on `http` with `claims` in a token signed by `key` (valid for
/// 10 minutes), on the subprotocol `json.webpubsub.azure.v1`.
pub async fn json_client(http: SocketAddr, key: &str, hub: &str, claims: &ClientClaims) -> Ws {
    let endpoint = format!("http://{http}");
    let token = issue_client_token(key, &endpoint, hub, claims, Duration::from_secs(600));
    let url = format!("ws://{http}/client/hubs/{hub}?access_token={token}");
    websocket(&url, "json.webpubsub.azure.v1").await
}

/// Joins group `g` (ack 1) and sends `hi` to it (ack 2) on a JSON subprotocol.
pub async fn join_and_send(ws: &mut Ws) {
    let frames = [
        r#"{"type":"joinGroup","group":"g","ackId":1}"#,
        r#"{"type":"sendToGroup","group":"g","ackId":2,"dataType":"text","data":"hi"}"#,
    ];
    for f in frames {
        ws.send(Message::text(f)).await.unwrap();
    }
}

/// A WebSocket to `url` (a client endpoint with its token) asking for `protocol`.
pub async fn websocket(url: &str, protocol: &str) -> Ws {
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_str(protocol).unwrap(),
    );
    tokio_tungstenite::connect_async(req).await.unwrap().0
}

/// The next text frame as JSON (other frames skipped), within the tests' patience.
pub async fn next_json(ws: &mut Ws) -> serde_json::Value {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => return serde_json::from_str(&t).unwrap(),
            Ok(Some(Ok(_))) => {}
            other => panic!("expected a frame, got {other:?}"),
        }
    }
}

/// The next text frame, within the tests' patience.
pub async fn next_text(ws: &mut Ws) -> String {
    loop {
        let frame = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a frame in time")
            .expect("socket open")
            .unwrap();
        if let Message::Text(text) = frame {
            return text.to_string();
        }
    }
}

/// The value of `field` in the Redis copy of session `id` of `hub` under namespace
/// `ns` (empty if none).
pub fn session_field(
    redis: &statehub_redis_common::test_server::RedisServer,
    (ns, hub): (&str, &str),
    id: &str,
    field: &str,
) -> String {
    let key = format!("{{{ns}}}:wps:s:{hub}:{id}");
    let value = redis.command(&["HGET", &key, field]);
    if value.starts_with("$-1") {
        String::new()
    } else {
        value
    }
}

/// Sends `request`, a whole HTTP/1.1 request that asks to close the connection, to
/// `addr` and reads the response to its end within `within`: its status and its text.
pub async fn http_exchange(addr: SocketAddr, request: &str, within: Duration) -> (u16, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        String::from_utf8_lossy(&response).into_owned()
    };
    let text = tokio::time::timeout(within, exchange)
        .await
        .expect("an HTTP answer in time");
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, text)
}
