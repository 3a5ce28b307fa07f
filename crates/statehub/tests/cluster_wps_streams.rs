//! A reliable session's open client stream moves with it: a publisher on node A opens
//! a stream to a group, sends fragments, A is killed (SIGKILL), the publisher recovers
//! on node B and sends again from its oldest fragment it saw no `streamAck` for, as
//! `@azure/web-pubsub-client` does; a member on B gets every fragment once, in order,
//! and the stream's end. And a fragment (and an end) that A takes on the session's old
//! socket after B claimed it is neither published nor answered by A: sent again to B,
//! it goes out once.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use statehub_redis_common::test_server::RedisServer;
use statehub_webpubsub::{issue_client_token, ClientClaims};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use common::wps::next_json;

const KEY: &str = "cluster-wps-streams-access-key";
const HUB: &str = "streams";
const NAMESPACE: &str = "wpsstreams";
const GROUP: &str = "live";
const PATIENCE: Duration = Duration::from_secs(30);

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

fn node(redis: &RedisServer, id: &str) -> common::Server {
    let toml = format!(
        "[webpubsub]\naccess_keys = [\"{KEY}\"]\n\
         [cluster]\nredis_url = \"{}\"\nnode_id = \"{id}\"\nnamespace = \"{NAMESPACE}\"\n",
        redis.url()
    );
    common::start_configured(&toml, &[])
}

/// A client of `addr` on `protocol`: its socket and its `connected` message.
async fn open(addr: SocketAddr, claims: &ClientClaims, protocol: &str) -> (Ws, Value) {
    let token = issue_client_token(KEY, &format!("http://{addr}"), HUB, claims, PATIENCE);
    let url = format!("ws://{addr}/client/hubs/{HUB}?access_token={token}");
    let mut ws = common::wps::websocket(&url, protocol).await;
    let connected = next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected", "{connected}");
    (ws, connected)
}

async fn send(ws: &mut Ws, frame: Value) {
    ws.send(Message::text(frame.to_string())).await.unwrap();
}

fn fragment(seq: u64) -> Value {
    json!({"type": "streamData", "streamId": "s1", "streamSequenceId": seq,
           "dataType": "text", "data": format!("f{seq}")})
}

/// Reads the publisher's socket until a stream reply (`streamAck`, `streamNack`,
/// `streamClosed`) comes; other frames (sequenced messages) are skipped.
async fn stream_reply(ws: &mut Ws) -> Value {
    loop {
        let m = next_json(ws).await;
        if m["type"].as_str().is_some_and(|t| t.starts_with("stream")) {
            return m;
        }
    }
}

/// Sends fragment `seq` and waits for its `streamAck`.
async fn acked(ws: &mut Ws, seq: u64) {
    send(ws, fragment(seq)).await;
    let reply = stream_reply(ws).await;
    assert_eq!(reply["type"], "streamAck", "fragment {seq}: {reply}");
    assert_eq!(reply["expectedSequenceId"], seq + 1, "{reply}");
}

/// The member's next stream message: (sequence id, data, end of stream).
async fn member_next(ws: &mut Ws) -> (u64, String, bool) {
    let m = next_json(ws).await;
    assert_eq!(m["type"], "message", "{m}");
    assert_eq!(m["group"], GROUP, "{m}");
    let s = &m["stream"];
    assert_eq!(s["streamId"], "s1", "{m}");
    (
        s["streamSequenceId"].as_u64().unwrap(),
        m["data"].as_str().unwrap_or_default().to_owned(),
        s["endOfStream"] == true,
    )
}

/// The value of `field` in the session's hash in Redis (empty if none).
fn stored(redis: &RedisServer, id: &str, field: &str) -> String {
    common::wps::session_field(redis, (NAMESPACE, HUB), id, field)
}

/// Stream `s1`'s next expected id in the session's copy (empty if none).
fn expected(redis: &RedisServer, id: &str) -> String {
    let value = stored(redis, id, "sq:s1");
    value.split('|').next().unwrap_or_default().to_owned()
}

/// A member of `GROUP` on `b`, and on `a` a reliable publisher that opened stream `s1`
/// to it: (member, publisher, the publisher's connection id, its reconnection token).
async fn member_and_streaming_publisher(
    a: &common::Server,
    b: &common::Server,
) -> (Ws, Ws, String, String) {
    let member = ClientClaims {
        user_id: Some("member".into()),
        roles: vec![],
        groups: vec![GROUP.into()],
    };
    let (m, _) = open(b.http, &member, "json.webpubsub.azure.v1").await;
    let publisher = ClientClaims {
        user_id: Some("publisher".into()),
        roles: vec!["webpubsub.sendToGroup".into()],
        groups: vec![],
    };
    let (mut p, connected) = open(a.http, &publisher, "json.reliable.webpubsub.azure.v1").await;
    let id = connected["connectionId"].as_str().unwrap().to_owned();
    let token = connected["reconnectionToken"].as_str().unwrap().to_owned();
    send(
        &mut p,
        json!({"type": "streamStart", "streamId": "s1", "group": GROUP}),
    )
    .await;
    let start = stream_reply(&mut p).await;
    assert_eq!(start["type"], "streamAck", "{start}");
    (m, p, id, token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_goes_on_from_its_oldest_unacked_fragment_on_another_node() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (mut m, mut p, id, token) = member_and_streaming_publisher(&a, &b).await;
    for seq in 1..=3 {
        acked(&mut p, seq).await;
    }
    // Fragments 4 and 5 reach the member and their state the session's copy, but the
    // publisher reads no ack for them: A dies first, as far as the client knows.
    send(&mut p, fragment(4)).await;
    send(&mut p, fragment(5)).await;
    let mut got = Vec::new();
    while got.len() < 5 {
        got.push(member_next(&mut m).await);
    }
    let deadline = Instant::now() + PATIENCE;
    while expected(&redis, &id) != "6" {
        assert!(Instant::now() < deadline, "fragment 5's state is stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    a.kill();
    drop(p);
    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={token}",
        b.http
    );
    let mut p = common::wps::websocket(&url, "json.reliable.webpubsub.azure.v1").await;
    let connected = next_json(&mut p).await;
    assert_eq!(
        connected["event"], "connected",
        "recovered on B: {connected}"
    );
    // The oldest unacked fragment again: B acks what A accepted, publishes nothing.
    for seq in [4, 5] {
        send(&mut p, fragment(seq)).await;
        let reply = stream_reply(&mut p).await;
        assert_eq!(reply["type"], "streamAck", "fragment {seq} again: {reply}");
        assert_eq!(reply["expectedSequenceId"], 6, "{reply}");
    }
    for seq in 6..=7 {
        acked(&mut p, seq).await;
    }
    // A reply reaches the client only once its state is in Redis.
    assert_eq!(expected(&redis, &id), "8", "acked through 7 on B");
    send(&mut p, json!({"type": "streamEnd", "streamId": "s1"})).await;
    let closed = stream_reply(&mut p).await;
    assert_eq!(closed["type"], "streamClosed", "{closed}");
    assert!(closed["error"].is_null(), "{closed}");
    assert_eq!(expected(&redis, &id), "", "the end removed it");
    assert_eq!(stored(&redis, &id, "sm:s1"), "", "the end removed it");

    while !got.last().is_some_and(|f| f.2) {
        got.push(member_next(&mut m).await);
    }
    let mut expected: Vec<(u64, String, bool)> =
        (1..=7).map(|s| (s, format!("f{s}"), false)).collect();
    expected.push((8, String::new(), true));
    assert_eq!(got, expected, "every fragment once, in order, then the end");
}

/// The length of the operations stream.
fn ops_len(redis: &RedisServer) -> u64 {
    let ops = format!("{{{NAMESPACE}}}:wps:ops");
    let reply = redis.command(&["XLEN", &ops]);
    reply.trim().trim_start_matches(':').parse().unwrap()
}

/// The node that wrote the last entry of the operations stream.
fn last_op_node(redis: &RedisServer) -> String {
    let ops = format!("{{{NAMESPACE}}}:wps:ops");
    let last = "return redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1][2][2]";
    redis.command(&["EVAL", last, "1", &ops]).trim().to_owned()
}

/// `statehub_cluster_webpubsub_lost` on `server`: other nodes' operations it missed.
fn lost(server: &common::Server) -> u64 {
    use std::io::{Read, Write};
    let mut s = common::connect_tcp(server.http);
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let line = (out.lines())
        .find(|l| l.starts_with("statehub_cluster_webpubsub_lost"))
        .unwrap_or_else(|| panic!("no lost counter in {out}"));
    line.rsplit_once(' ').unwrap().1.parse().unwrap()
}

/// Every text frame the socket gets until it closes (within `PATIENCE` in all).
async fn until_closed(ws: &mut Ws) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut texts = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => texts.push(serde_json::from_str(&t).unwrap()),
            Ok(Some(Ok(Message::Close(_)) | Err(_)) | None) => return texts,
            Ok(Some(Ok(_))) => {}
            Err(_) => panic!(
                "the old socket is closed in time; got {} frames, first {:?}",
                texts.len(),
                &texts[..texts.len().min(5)]
            ),
        }
    }
}

/// A member of `GROUP` on `server`.
async fn member(server: &common::Server, name: &str) -> Ws {
    let claims = ClientClaims {
        user_id: Some(name.into()),
        roles: vec![],
        groups: vec![GROUP.into()],
    };
    open(server.http, &claims, "json.webpubsub.azure.v1")
        .await
        .0
}

/// Another node's claim of session `id` as A has not read it yet: the epoch raised,
/// no marker in the stream.
fn claim_unseen(redis: &RedisServer, id: &str) {
    let key = format!("{{{NAMESPACE}}}:wps:s:{HUB}:{id}");
    assert_eq!(redis.command(&["HINCRBY", &key, "ep", "1"]).trim(), ":2");
}

/// The member's stream messages up to the end of stream.
async fn member_until_end(ws: &mut Ws) -> Vec<(u64, String, bool)> {
    let mut got = vec![member_next(ws).await];
    while !got.last().is_some_and(|f| f.2) {
        got.push(member_next(ws).await);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fragment_the_old_node_takes_after_a_claim_is_neither_published_nor_acked() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (mut m, mut p, id, token) = member_and_streaming_publisher(&a, &b).await;
    let mut here = member(&a, "member-a").await;
    acked(&mut p, 1).await;
    assert_eq!(member_next(&mut m).await, (1, "f1".into(), false));
    assert_eq!(member_next(&mut here).await, (1, "f1".into(), false));

    claim_unseen(&redis, &id);
    let before = ops_len(&redis);
    send(&mut p, fragment(2)).await;
    // A closes the old socket as soon as Redis fenced the fragment out, with no claim
    // marker to read, and the ack it held never reaches it.
    let old = until_closed(&mut p).await;
    assert!(
        !(old.iter()).any(|f| f["type"] == "streamAck" || f["type"] == "streamClosed"),
        "no reply from A after the claim: {old:?}"
    );
    assert_eq!(ops_len(&redis), before + 1, "A's entry for fragment 2");
    assert_eq!(last_op_node(&redis), "a");
    assert_eq!(expected(&redis, &id), "2", "its state fenced out");
    assert_ne!(stored(&redis, &id, "sm:s1"), "", "the stream still open");

    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={token}",
        b.http
    );
    let mut p2 = common::wps::websocket(&url, "json.reliable.webpubsub.azure.v1").await;
    let connected = next_json(&mut p2).await;
    assert_eq!(connected["event"], "connected", "recovered: {connected}");
    // A's next operation: B counts no operation of A's missing before it.
    let sender = ClientClaims {
        user_id: Some("sender".into()),
        roles: vec!["webpubsub.sendToGroup".into()],
        groups: vec![],
    };
    let (mut s, _) = open(a.http, &sender, "json.webpubsub.azure.v1").await;
    let text = json!({"type": "sendToGroup", "group": GROUP, "dataType": "text", "data": "after"});
    send(&mut s, text).await;
    for ws in [&mut m, &mut here] {
        let after = next_json(ws).await;
        assert_eq!(after["data"], "after", "A's send, nothing before: {after}");
    }
    assert_eq!(lost(&b), 0, "B counts no gap in A's operations");

    send(&mut p2, fragment(2)).await;
    let reply = stream_reply(&mut p2).await;
    assert_eq!(reply["type"], "streamAck", "fragment 2 on B: {reply}");
    assert_eq!(reply["expectedSequenceId"], 3, "{reply}");
    send(&mut p2, json!({"type": "streamEnd", "streamId": "s1"})).await;
    let closed = stream_reply(&mut p2).await;
    assert_eq!(closed["type"], "streamClosed", "{closed}");

    let expected = vec![(2, "f2".to_owned(), false), (3, String::new(), true)];
    assert_eq!(
        member_until_end(&mut m).await,
        expected,
        "on B: once, from B"
    );
    assert_eq!(
        member_until_end(&mut here).await,
        expected,
        "on A too: A delivered nothing of what Redis fenced out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ack_held_for_a_fenced_fragment_is_released_however_many_follow() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (_m, mut p, id, _) = member_and_streaming_publisher(&a, &b).await;
    acked(&mut p, 1).await;
    claim_unseen(&redis, &id);
    // Many fenced fragments in flight (more than 1,024), none of whose held acks may
    // ever be released. The socket may close while they are sent.
    for seq in 2..=1_101 {
        if p.feed(Message::text(fragment(seq).to_string()))
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = p.flush().await;
    let old = until_closed(&mut p).await;
    assert!(
        !(old.iter()).any(|f| f["type"] == "streamAck" || f["type"] == "streamClosed"),
        "no ack after the claim: {:?}",
        old.iter().take(5).collect::<Vec<_>>()
    );
    assert_eq!(expected(&redis, &id), "2", "nothing after the claim");
}

/// The publisher's recovery of session `id` on `server`.
async fn recover(server: &common::Server, id: &str, token: &str) -> Ws {
    let url = format!(
        "ws://{}/client/hubs/{HUB}?awps_connection_id={id}&awps_reconnection_token={token}",
        server.http
    );
    let mut ws = common::wps::websocket(&url, "json.reliable.webpubsub.azure.v1").await;
    let connected = next_json(&mut ws).await;
    assert_eq!(connected["event"], "connected", "recovered: {connected}");
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_an_ack_id_the_old_node_takes_after_a_claim_goes_out_once() {
    let redis = RedisServer::start();
    let (a, b) = (node(&redis, "a"), node(&redis, "b"));
    let (mut m, mut p, id, token) = member_and_streaming_publisher(&a, &b).await;
    let mut here = member(&a, "member-a").await;
    claim_unseen(&redis, &id);
    let msg = json!({"type": "sendToGroup", "group": GROUP, "ackId": 7,
                     "dataType": "text", "data": "once"});
    send(&mut p, msg.clone()).await;
    // Fenced out with its ackId's record: A publishes nothing, acks nothing, and
    // closes the old socket.
    let old = until_closed(&mut p).await;
    assert!(
        !old.iter().any(|f| f["type"] == "ack"),
        "no ack from A after the claim: {old:?}"
    );
    // Sent again to B, which knows nothing of ackId 7: published once, everywhere.
    let mut p2 = recover(&b, &id, &token).await;
    send(&mut p2, msg).await;
    let ack = next_json(&mut p2).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    assert_eq!(ack["success"], true, "{ack}");
    let last = json!({"type": "sendToGroup", "group": GROUP, "dataType": "text", "data": "last"});
    send(&mut p2, last).await;
    for ws in [&mut m, &mut here] {
        let first = next_json(ws).await;
        assert_eq!(first["data"], "once", "{first}");
        let then = next_json(ws).await;
        assert_eq!(then["data"], "last", "once, not twice: {then}");
    }
}
