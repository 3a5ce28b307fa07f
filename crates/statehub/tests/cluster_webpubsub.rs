//! Web PubSub across two nodes on one redis-server:
//! - the REST checks: whatever node is asked answers for the whole cluster, at once
//!   after the change it asks about was acknowledged (a client's join acked by its
//!   node, a REST grant, join or close answered by another), and a node that is alive
//!   but silent makes the answer a 503, never a "no";
//! - grants and revokes made after connect move with a reliable session that recovers
//!   on the other node;
//! - a client's stream to a group reaches its members on the other node.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::SinkExt;
use statehub_redis_common::test_server::RedisServer;
use statehub_webpubsub::{issue_client_token, issue_token, ClientClaims};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::wps::{http_exchange, next_json, websocket};
use common::Server;

const KEY: &str = "cluster-webpubsub-access-key";
const HUB: &str = "checks";
const NAMESPACE: &str = "wpschecks";
const PATIENCE: Duration = Duration::from_secs(20);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn node(redis: &RedisServer, id: &str) -> Server {
    let toml = format!(
        "[webpubsub]\naccess_keys = [\"{KEY}\"]\n\
         [cluster]\nredis_url = \"{}\"\nnode_id = \"{id}\"\nnamespace = \"{NAMESPACE}\"\n\
         timeout_ms = 1000\n",
        redis.url()
    );
    common::start_configured(&toml, &[])
}

/// `method path?api-version…` on `addr`: the status and the body.
async fn rest(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let sep = if path.contains('?') { '&' } else { '?' };
    let path = format!("/api/hubs/{HUB}{path}{sep}api-version=2024-12-01");
    let claims = ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec![],
    };
    let token = issue_token(KEY, &format!("http://{addr}{path}"), &claims, PATIENCE);
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    let (status, text) = http_exchange(addr, &request, PATIENCE).await;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

async fn head(addr: SocketAddr, path: &str) -> u16 {
    rest(addr, "HEAD", path).await.0
}

/// A client of `addr` with `user` and `roles`: its socket and connection id.
async fn client(addr: SocketAddr, user: &str, roles: &[&str]) -> (Ws, String) {
    let (ws, connected) = open(addr, user, roles, "json.webpubsub.azure.v1").await;
    let id = connected["connectionId"].as_str().unwrap().to_owned();
    (ws, id)
}

/// A client of `addr` on `protocol`: its socket and its `connected` message.
async fn open(
    addr: SocketAddr,
    user: &str,
    roles: &[&str],
    protocol: &'static str,
) -> (Ws, serde_json::Value) {
    let claims = ClientClaims {
        user_id: Some(user.to_owned()),
        roles: roles.iter().map(|r| (*r).to_owned()).collect(),
        groups: vec![],
    };
    let token = issue_client_token(KEY, &format!("http://{addr}"), HUB, &claims, PATIENCE);
    let mut ws = websocket(
        &format!("ws://{addr}/client/hubs/{HUB}?access_token={token}"),
        protocol,
    )
    .await;
    let connected = next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected", "{connected}");
    (ws, connected)
}

/// Joins `group` and waits for the ack.
async fn join(ws: &mut Ws, group: &str, ack: u64) {
    let frame = serde_json::json!({"type": "joinGroup", "group": group, "ackId": ack});
    ws.send(Message::text(frame.to_string())).await.unwrap();
    let answer = next_json(ws).await;
    assert_eq!(answer["type"], "ack", "{answer}");
    assert_eq!(answer["success"], true, "{answer}");
}

/// Counts the checks that passed, and fails with all those that did not.
#[derive(Default)]
struct Checks {
    passed: usize,
    failed: Vec<String>,
}

impl Checks {
    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, got: T, want: T, what: &str) {
        if got == want {
            self.passed += 1;
        } else {
            self.failed
                .push(format!("{what}: got {got:?}, want {want:?}"));
        }
    }

    fn done(self) {
        eprintln!("{} checks passed", self.passed);
        assert!(self.failed.is_empty(), "{:#?}", self.failed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_through_one_node_answer_for_the_cluster_at_once() {
    let redis = RedisServer::start();
    let (node_a, node_b) = (node(&redis, "a"), node(&redis, "b"));
    let (a, b_http) = (node_a.http, node_b.http);
    let mut c = Checks::default();

    // Joins acked by B, asked through A right after each ack.
    let (mut x, xid) = client(b_http, "ux", &["webpubsub.joinLeaveGroup"]).await;
    c.eq(
        head(a, &format!("/connections/{xid}")).await,
        200,
        "connection on B, through A",
    );
    c.eq(head(a, "/users/ux").await, 200, "user on B, through A");
    for k in 0..10 {
        join(&mut x, &format!("j{k}"), k + 1).await;
        c.eq(
            head(a, &format!("/groups/j{k}")).await,
            200,
            &format!("j{k} joined on B"),
        );
    }
    c.eq(head(a, "/groups/nobody").await, 404, "a group nobody is in");
    c.eq(
        head(a, "/connections/nope").await,
        404,
        "a connection nobody holds",
    );

    // Permissions of a connection on B, checked, granted and revoked through A.
    let perm = |p: &str, g: &str| format!("/permissions/{p}/connections/{xid}?targetName={g}");
    c.eq(
        head(a, &perm("joinLeaveGroup", "j0")).await,
        200,
        "B's connection's role, through A",
    );
    c.eq(
        head(a, &perm("sendToGroup", "s")).await,
        404,
        "a permission it lacks",
    );
    for k in 0..5 {
        let g = format!("s{k}");
        c.eq(
            rest(a, "PUT", &perm("sendToGroup", &g)).await.0,
            200,
            "grant through A",
        );
        c.eq(
            head(a, &perm("sendToGroup", &g)).await,
            200,
            &format!("granted {g}, at once"),
        );
        c.eq(
            rest(a, "DELETE", &perm("sendToGroup", &g)).await.0,
            204,
            "revoke",
        );
        c.eq(
            head(a, &perm("sendToGroup", &g)).await,
            404,
            &format!("revoked {g}, at once"),
        );
    }

    // Membership changed through A, asked through A right after.
    for k in 0..10 {
        let g = format!("r{k}");
        let put = rest(a, "PUT", &format!("/groups/{g}/connections/{xid}"))
            .await
            .0;
        c.eq(put, 200, "add B's connection through A");
        c.eq(
            head(a, &format!("/groups/{g}")).await,
            200,
            &format!("{g} at once"),
        );
        let del = rest(a, "DELETE", &format!("/groups/{g}/connections/{xid}"))
            .await
            .0;
        c.eq(del, 204, "remove it");
        c.eq(
            head(a, &format!("/groups/{g}")).await,
            404,
            &format!("{g} gone at once"),
        );
    }

    // A group's members listed through A: its own and B's, in one ordered listing.
    let (mut y, yid) = client(a, "uy", &["webpubsub.joinLeaveGroup"]).await;
    join(&mut y, "j0", 1).await;
    let (status, body) = rest(a, "GET", "/groups/j0/connections").await;
    c.eq(status, 200, "list j0 through A");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut ids: Vec<&str> = (listed["value"].as_array().into_iter().flatten())
        .filter_map(|m| m["connectionId"].as_str())
        .collect();
    let mut want = vec![xid.as_str(), yid.as_str()];
    want.sort_unstable();
    c.eq(ids.clone(), want.clone(), "members on both nodes, ordered");
    let (_, first) = rest(a, "GET", "/groups/j0/connections?maxpagesize=1").await;
    let first: serde_json::Value = serde_json::from_str(&first).unwrap_or_default();
    ids.truncate(1);
    let page: Vec<&str> = (first["value"].as_array().into_iter().flatten())
        .filter_map(|m| m["connectionId"].as_str())
        .collect();
    c.eq(page, ids, "a page of one: the first id");
    c.eq(
        first["nextLink"].is_string(),
        true,
        "and a link to the next page",
    );

    // Closed through A: gone at once, with its user and its only groups.
    c.eq(
        rest(a, "DELETE", &format!("/connections/{xid}")).await.0,
        204,
        "close through A",
    );
    c.eq(
        head(a, &format!("/connections/{xid}")).await,
        404,
        "closed: gone at once",
    );
    c.eq(head(a, "/users/ux").await, 404, "its user too");
    c.eq(head(a, "/groups/j1").await, 404, "its groups too");
    c.eq(
        head(a, "/groups/j0").await,
        200,
        "a group with a member on A stays",
    );
    drop((x, y));
    c.done();
}

/// `kill -SIG pid`.
fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    let status = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_that_is_alive_is_not_taken_for_a_no() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (_x, xid) = client(b.http, "ux", &[]).await;
    let mut c = Checks::default();
    // B stops answering (stopped), yet stays alive as far as Redis can tell.
    signal(&b, "-STOP");
    let alive = format!("{{{NAMESPACE}}}:wps:alive:b");
    c.eq(
        redis.command(&["SET", &alive, "1", "PX", "60000"]),
        "+OK\r\n".into(),
        "B kept alive",
    );
    c.eq(
        head(a.http, &format!("/connections/{xid}")).await,
        503,
        "connection on a silent B",
    );
    c.eq(
        head(a.http, "/groups/g").await,
        503,
        "a group, with B silent",
    );
    signal(&b, "-CONT");
    c.eq(
        head(a.http, &format!("/connections/{xid}")).await,
        200,
        "B answers again",
    );
    // B dead as far as Redis can tell (its liveness lapsed): it holds nothing.
    signal(&b, "-STOP");
    c.eq(
        redis.command(&["DEL", &alive]),
        ":1\r\n".into(),
        "B's liveness gone",
    );
    c.eq(
        head(a.http, &format!("/connections/{xid}")).await,
        404,
        "a dead node holds nothing",
    );
    signal(&b, "-CONT");
    c.done();
}

const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";

/// Sends to `group` with `ack_id`; the ack's error name (`None`: success).
async fn send_to_group(ws: &mut Ws, group: &str, ack_id: u64) -> Option<String> {
    let frame = serde_json::json!({
        "type": "sendToGroup", "group": group, "ackId": ack_id, "dataType": "text", "data": "x"
    });
    ws.send(Message::text(frame.to_string())).await.unwrap();
    loop {
        let m = next_json(ws).await;
        if m["type"] == "ack" && m["ackId"] == ack_id {
            return m["error"]["name"].as_str().map(str::to_owned);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_revokes_move_with_a_session_recovered_on_another_node() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (ws, connected) = open(a.http, "ur", &["webpubsub.sendToGroup.kept"], RELIABLE).await;
    let id = connected["connectionId"].as_str().unwrap().to_owned();
    let token = connected["reconnectionToken"].as_str().unwrap().to_owned();
    let mut c = Checks::default();
    let perm = |g: &str| format!("/permissions/sendToGroup/connections/{id}?targetName={g}");
    // Granted through its own node, revoked through the other; both seen through B.
    c.eq(
        rest(a.http, "PUT", &perm("granted")).await.0,
        200,
        "grant through A",
    );
    c.eq(
        rest(b.http, "DELETE", &perm("kept")).await.0,
        204,
        "revoke through B",
    );
    c.eq(
        head(b.http, &perm("granted")).await,
        200,
        "granted, through B",
    );
    c.eq(head(b.http, &perm("kept")).await, 404, "revoked, through B");
    // Its socket cut; it recovers on B.
    drop(ws);
    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={token}",
        b.http
    );
    let mut ws = websocket(&url, RELIABLE).await;
    c.eq(
        send_to_group(&mut ws, "granted", 1).await,
        None,
        "the grant works on B",
    );
    c.eq(
        send_to_group(&mut ws, "kept", 2).await,
        Some("Forbidden".to_owned()),
        "the revoke holds on B",
    );
    c.eq(
        send_to_group(&mut ws, "other", 3).await,
        Some("Forbidden".to_owned()),
        "nothing else",
    );
    c.eq(
        head(a.http, &format!("/connections/{id}")).await,
        200,
        "the same connection, now on B",
    );
    c.done();
}

/// The next `message` frame's `stream` and data.
async fn next_message(ws: &mut Ws) -> (serde_json::Value, serde_json::Value) {
    loop {
        let m = next_json(ws).await;
        if m["type"] == "message" {
            return (m["stream"].clone(), m["data"].clone());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_reaches_group_members_on_another_node() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (mut member, _) = client(b.http, "m", &["webpubsub.joinLeaveGroup"]).await;
    join(&mut member, "g", 1).await;
    let (mut publisher, _) = client(a.http, "p", &["webpubsub.sendToGroup"]).await;
    let frames = [
        serde_json::json!({"type": "streamStart", "streamId": "s1", "target": "group", "group": "g"}),
        serde_json::json!({"type": "streamData", "streamId": "s1", "streamSequenceId": 1, "dataType": "text", "data": "hello "}),
        serde_json::json!({"type": "streamData", "streamId": "s1", "streamSequenceId": 2, "dataType": "text", "data": "world"}),
        serde_json::json!({"type": "streamEnd", "streamId": "s1"}),
    ];
    for frame in frames {
        publisher
            .send(Message::text(frame.to_string()))
            .await
            .unwrap();
    }
    let mut c = Checks::default();
    for (seq, data, end) in [(1, "hello ", false), (2, "world", false), (3, "", true)] {
        let (stream, got) = next_message(&mut member).await;
        c.eq(
            stream["streamId"].clone(),
            serde_json::json!("s1"),
            "its stream id",
        );
        c.eq(
            stream["streamSequenceId"].clone(),
            serde_json::json!(seq),
            "in order",
        );
        c.eq(got, serde_json::json!(data), "its data");
        c.eq(
            stream["endOfStream"].as_bool().unwrap_or(false),
            end,
            "the end marked",
        );
    }
    c.done();
}

/// A node killed for good leaves `{ns}:wps:nodes` once its liveness key lapsed (6 s)
/// and a live node prunes the list (every 10 s); a live node is never taken off it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_leaves_the_node_list_and_a_live_one_stays() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let nodes = format!("{{{NAMESPACE}}}:wps:nodes");
    let listed = |n: &str| redis.command(&["SISMEMBER", &nodes, n]) == ":1\r\n";
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !(listed("a") && listed("b")) {
        assert!(std::time::Instant::now() < deadline, "both nodes listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    b.kill();
    while listed("b") {
        assert!(listed("a"), "a live node stays listed");
        assert!(
            std::time::Instant::now() < deadline,
            "the dead node still listed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(listed("a"), "a live node stays listed");
    // And it still answers checks for the cluster without waiting for the dead one.
    assert_eq!(head(a.http, "/groups/nobody").await, 404);
}
