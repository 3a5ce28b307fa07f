//! The upstream's `ce-connectionState` moves with a reliable session: set on node A
//! (by the `connect` event, then replaced by a user event's answer), the session
//! recovered on node B after A's SIGKILL, B's next upstream event carries the state.
//! A user event with an `ackId` that A takes after B claimed the session is posted
//! once, by B.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use statehub_redis_common::test_server::RedisServer;
use statehub_webpubsub::{issue_client_token, ClientClaims};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::wps::next_json;

const KEY: &str = "cluster-wps-state-access-key";
const HUB: &str = "stateful";
const NAMESPACE: &str = "wpsstate";
const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";
const PATIENCE: Duration = Duration::from_secs(30);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// One event the upstream received: its `ce-type` and `ce-connectionState`.
#[derive(Debug)]
struct Event {
    kind: String,
    state: Option<String>,
}

/// An application server on port 0: answers `connect` with `ce-connectionState:
/// from-connect`, a user event `e1` with `ce-connectionState: from-e1`, and anything
/// else with nothing; reports every POST's event.
async fn upstream() -> (SocketAddr, mpsc::UnboundedReceiver<Event>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(answer(stream, tx.clone()));
        }
    });
    (addr, rx)
}

async fn answer(stream: TcpStream, events: mpsc::UnboundedSender<Event>) {
    let mut reader = BufReader::new(stream);
    let mut head = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        head.push(line.trim_end().to_owned());
    }
    let header = |name: &str| {
        head.iter().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length").map_or(0, |l| l.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.unwrap();
    let mut extra = String::new();
    if head[0].starts_with("OPTIONS") {
        extra.push_str("WebHook-Allowed-Origin: *\r\n");
    } else {
        let kind = header("ce-type").unwrap_or_default();
        if kind == "azure.webpubsub.sys.connect" {
            extra.push_str("ce-connectionState: from-connect\r\n");
        } else if kind == "azure.webpubsub.user.e1" {
            extra.push_str("ce-connectionState: from-e1\r\n");
        }
        let state = header("ce-connectionstate");
        let _ = events.send(Event { kind, state });
    }
    let response =
        format!("HTTP/1.1 200 OK\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = reader.get_mut().write_all(response.as_bytes()).await;
}

fn node(redis: &RedisServer, id: &str, upstream: SocketAddr) -> common::Server {
    let toml = format!(
        "[webpubsub]\naccess_keys = [\"{KEY}\"]\n\
         [[webpubsub.hubs.{HUB}.event_handlers]]\n\
         url_template = \"http://{upstream}/{{event}}\"\n\
         user_event_pattern = \"*\"\nsystem_events = [\"connect\"]\n\
         [cluster]\nredis_url = \"{}\"\nnode_id = \"{id}\"\nnamespace = \"{NAMESPACE}\"\n",
        redis.url()
    );
    common::start_configured(&toml, &[])
}

async fn websocket(url: &str) -> Ws {
    common::wps::websocket(url, RELIABLE).await
}

async fn next_event(events: &mut mpsc::UnboundedReceiver<Event>) -> Event {
    timeout(PATIENCE, events.recv())
        .await
        .expect("an upstream event in time")
        .unwrap()
}

/// Sends user event `name` and waits for its ack.
async fn event(ws: &mut Ws, name: &str, ack_id: u64) {
    let frame = serde_json::json!({"type": "event", "event": name, "ackId": ack_id,
        "dataType": "text", "data": "x"});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    loop {
        let m = next_json(ws).await;
        if m["type"] == "ack" {
            assert_eq!(m["success"], true, "{m}");
            return;
        }
    }
}

/// A reliable client of user `u` on `node`; its socket and `connected` message.
async fn connect(node: &common::Server) -> (Ws, serde_json::Value) {
    let claims = ClientClaims {
        user_id: Some("u".into()),
        roles: vec![],
        groups: vec![],
    };
    let url = format!("http://{}", node.http);
    let token = issue_client_token(KEY, &url, HUB, &claims, PATIENCE);
    let mut ws = websocket(&format!(
        "ws://{}/client/hubs/{HUB}?access_token={token}",
        node.http
    ))
    .await;
    let connected = next_json(&mut ws).await;
    (ws, connected)
}

/// The value of `field` in the session's hash in Redis (empty if none).
fn stored(redis: &RedisServer, id: &str, field: &str) -> String {
    common::wps::session_field(redis, (NAMESPACE, HUB), id, field)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_connection_state_moves_with_a_session_recovered_on_another_node() {
    let redis = RedisServer::start();
    let (up, mut events) = upstream().await;
    let (a, b) = (node(&redis, "a", up), node(&redis, "b", up));
    let (mut ws, connected) = connect(&a).await;
    assert_eq!(connected["event"], "connected", "{connected}");
    let (id, reconnection) = (&connected["connectionId"], &connected["reconnectionToken"]);
    let (id, reconnection) = (id.as_str().unwrap(), reconnection.as_str().unwrap());
    assert_eq!(next_event(&mut events).await.state, None, "connect");

    // A user event on A carries the connect's state; its answer replaces it.
    event(&mut ws, "e1", 1).await;
    let e1 = next_event(&mut events).await;
    assert_eq!(e1.state.as_deref(), Some("from-connect"), "{e1:?}");
    // The copy in Redis has it before A dies (the mirror is written behind).
    let deadline = Instant::now() + PATIENCE;
    while stored(&redis, id, "cst") != "from-e1" {
        assert!(
            Instant::now() < deadline,
            "the state reaches the session's copy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    a.kill();
    drop(ws);
    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={reconnection}",
        b.http
    );
    let mut ws = websocket(&url).await;
    event(&mut ws, "e2", 2).await;
    let e2 = next_event(&mut events).await;
    assert_eq!(e2.kind, "azure.webpubsub.user.e2");
    assert_eq!(
        e2.state.as_deref(),
        Some("from-e1"),
        "B's event carries the state A's handler set"
    );
}

/// Reads the old socket until it closes; every text frame it got.
async fn until_closed(ws: &mut Ws) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => {
                let frame: serde_json::Value = serde_json::from_str(&t).unwrap();
                assert_ne!(frame["type"], "ack", "no ack from the old node: {frame}");
                texts.push(frame);
            }
            Ok(Some(Ok(Message::Close(_)) | Err(_)) | None) => return texts,
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!("the old socket is closed in time; got {texts:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_old_node_takes_after_a_claim_is_posted_once() {
    let redis = RedisServer::start();
    let (up, mut events) = upstream().await;
    let (a, b) = (node(&redis, "a", up), node(&redis, "b", up));
    let (mut ws, connected) = connect(&a).await;
    let (id, reconnection) = (&connected["connectionId"], &connected["reconnectionToken"]);
    let (id, reconnection) = (id.as_str().unwrap(), reconnection.as_str().unwrap());
    assert_eq!(
        next_event(&mut events).await.kind,
        "azure.webpubsub.sys.connect"
    );
    let deadline = Instant::now() + PATIENCE;
    while stored(&redis, id, "ep") != "1" {
        assert!(Instant::now() < deadline, "the session's copy is written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A claim's fence, which A's reader never hears of: only the store tells A.
    let key = format!("{{{NAMESPACE}}}:wps:s:{HUB}:{id}");
    assert_eq!(redis.command(&["HINCRBY", &key, "ep", "1"]).trim(), ":2");
    let e3 = serde_json::json!({"type": "event", "event": "e3", "ackId": 3,
        "dataType": "text", "data": "x"});
    ws.send(Message::text(e3.to_string())).await.unwrap();
    // Neither posted nor acked by A, whose socket closes.
    until_closed(&mut ws).await;

    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={reconnection}",
        b.http
    );
    let mut ws = websocket(&url).await;
    event(&mut ws, "e3", 3).await;
    event(&mut ws, "e4", 4).await;
    assert_eq!(
        next_event(&mut events).await.kind,
        "azure.webpubsub.user.e3"
    );
    let next = next_event(&mut events).await;
    assert_eq!(next.kind, "azure.webpubsub.user.e4", "e3 once, not twice");
}
