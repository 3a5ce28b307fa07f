//! A reliable session's frames reach its socket only once Redis has them: a node
//! killed while its writer could not write leaves the client with no sequence id the
//! node that takes the session over will give again.
//!
//! Redis takes no writes (`CLIENT PAUSE WRITE`), so node A's writer blocks on a
//! pipeline; a client of A then sends to a group without an `ackId` (A delivers it to
//! its own members at once, and Redis never gets it). A is killed (SIGKILL), Redis
//! takes writes again, the reliable
//! subscriber recovers on B, and B's REST sends (202) must all reach it, once, in
//! order, through a client that drops the sequence ids it has seen, as the official
//! clients do.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use statehub_redis_common::test_server::RedisServer;
use statehub_webpubsub::{issue_client_token, issue_token, ClientClaims};
use tokio::net::TcpStream;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::wps::{http_exchange, next_json};
use common::Server;

const KEY: &str = "cluster-window-access-key";
const HUB: &str = "window";
const PATIENCE: Duration = Duration::from_secs(30);
const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A node whose Redis calls wait long enough for the writer to stay blocked on a
/// stopped Redis for the whole test (its sends are accepted meanwhile).
fn node(redis: &RedisServer, id: &str) -> Server {
    let toml = format!(
        "[webpubsub]\naccess_keys = [\"{KEY}\"]\n\
         [cluster]\nredis_url = \"{}\"\nnode_id = \"{id}\"\nnamespace = \"wpswindow\"\n\
         timeout_ms = 120000\n",
        redis.url()
    );
    common::start_configured(&toml, &[])
}

async fn websocket(url: &str) -> Ws {
    common::wps::websocket(url, RELIABLE).await
}

/// A reliable client of `addr`: its socket, connection id and reconnection token.
async fn open(addr: SocketAddr, user: &str, roles: &[&str]) -> (Ws, String, String) {
    let claims = ClientClaims {
        user_id: Some(user.to_owned()),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        groups: vec![],
    };
    let token = issue_client_token(KEY, &format!("http://{addr}"), HUB, &claims, PATIENCE);
    let mut ws = websocket(&format!(
        "ws://{addr}/client/hubs/{HUB}?access_token={token}"
    ))
    .await;
    let connected = next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected", "{connected}");
    let field = |f: &str| connected[f].as_str().unwrap().to_owned();
    (ws, field("connectionId"), field("reconnectionToken"))
}

/// Sends `frame` and waits for the ack of `ack_id`; whether it succeeded.
async fn acked(ws: &mut Ws, frame: serde_json::Value, ack_id: u64) -> bool {
    ws.send(Message::text(frame.to_string())).await.unwrap();
    loop {
        let m = next_json(ws).await;
        if m["type"] == "ack" && m["ackId"] == ack_id {
            return m["success"] == true;
        }
    }
}

/// What a client that drops the sequence ids it has seen (as the official ones do)
/// received: the data of each message it kept, and how many it dropped.
#[derive(Debug, Default)]
struct Seen {
    last: u64,
    kept: Vec<String>,
    dropped: usize,
}

impl Seen {
    /// Takes `m` if it is a message: kept unless its sequence id was seen.
    fn take(&mut self, m: &serde_json::Value) {
        if m["type"] != "message" {
            return;
        }
        let seq = m["sequenceId"].as_u64().expect("a sequenced message");
        if seq <= self.last {
            self.dropped += 1;
            return;
        }
        self.last = seq;
        self.kept
            .push(m["data"].as_str().unwrap_or_default().to_owned());
    }
}

/// The frames `ws` gets within `wait` (or until its socket ends).
async fn drain(ws: &mut Ws, seen: &mut Seen, wait: Duration) {
    while let Ok(Some(Ok(frame))) = timeout(wait, ws.next()).await {
        if let Message::Text(t) = frame {
            seen.take(&serde_json::from_str(&t).unwrap());
        }
    }
}

/// A REST send of `text` to `group` through `addr`: the status.
async fn rest_send(addr: SocketAddr, group: &str, text: &str) -> u16 {
    let path = format!("/api/hubs/{HUB}/groups/{group}/:send?api-version=2024-12-01");
    let claims = ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec![],
    };
    let token = issue_token(KEY, &format!("http://{addr}{path}"), &claims, PATIENCE);
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    http_exchange(addr, &request, PATIENCE).await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_a_killed_node_never_mirrored_are_not_numbered_twice() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (mut s, sid, token) = open(a.http, "s", &["webpubsub.joinLeaveGroup"]).await;
    let roles = ["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"];
    let (mut p, _, _) = open(a.http, "p", &roles).await;
    let mut seen = Seen::default();
    let join = serde_json::json!({"type": "joinGroup", "group": "g", "ackId": 1});
    assert!(acked(&mut s, join, 1).await, "S joined g");
    // An acknowledged send: everything queued before it (S's join, its copy) is in Redis.
    let send = |data: &str, ack: Option<u64>| {
        let mut frame = serde_json::json!({
            "type": "sendToGroup", "group": "g", "dataType": "text", "data": data
        });
        if let Some(ack) = ack {
            frame["ackId"] = ack.into();
        }
        frame
    };
    assert!(acked(&mut p, send("before", Some(1)), 1).await);
    seen.take(&next_json(&mut s).await);
    assert_eq!(seen.kept, ["before"]);

    // Redis stops taking writes (reads go on: a stalled writer, not a stalled node);
    // once A's writer has sent its next pipeline (a heartbeat, at most 2 s later) it
    // waits for an answer, and what A queues after stays in A.
    assert_eq!(
        redis.command(&["CLIENT", "PAUSE", "100000", "WRITE"]),
        "+OK\r\n"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    for i in 0..5 {
        p.send(Message::text(send(&format!("lost{i}"), None).to_string()))
            .await
            .unwrap();
    }
    // P's own join is answered by A alone, after A handled the sends before it.
    let own = serde_json::json!({"type": "joinGroup", "group": "p", "ackId": 2});
    assert!(acked(&mut p, own, 2).await, "P joined p on A");
    drain(&mut s, &mut seen, Duration::from_secs(1)).await;
    eprintln!("before the kill, S kept {:?}", seen.kept);
    common::Server::kill(a);
    drain(&mut s, &mut seen, Duration::from_secs(1)).await;
    assert_eq!(redis.command(&["CLIENT", "UNPAUSE"]), "+OK\r\n");

    // S recovers on B; B's acknowledged sends must all reach it.
    let mut s = websocket(&format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={sid}&awps_reconnection_token={token}",
        b.http
    ))
    .await;
    let sent: Vec<String> = (0..5).map(|i| format!("acked{i}")).collect();
    for text in &sent {
        assert_eq!(
            rest_send(b.http, "g", text).await,
            202,
            "REST send through B"
        );
    }
    let before = seen.kept.len();
    while seen
        .kept
        .iter()
        .skip(before)
        .filter(|d| d.starts_with("acked"))
        .count()
        < sent.len()
    {
        match timeout(Duration::from_secs(5), next_json_or_end(&mut s)).await {
            Ok(Some(m)) => seen.take(&m),
            _ => break,
        }
    }
    let acked: Vec<&String> = seen
        .kept
        .iter()
        .filter(|d| d.starts_with("acked"))
        .collect();
    assert_eq!(
        acked,
        sent.iter().collect::<Vec<_>>(),
        "every acknowledged send once, in order (the client dropped {} as seen; it kept {:?})",
        seen.dropped,
        seen.kept
    );
}

async fn next_json_or_end(ws: &mut Ws) -> Option<serde_json::Value> {
    loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(&t).ok(),
            Some(Ok(_)) => {}
            _ => return None,
        }
    }
}
