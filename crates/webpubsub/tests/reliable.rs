//! The reliable subprotocol on a real socket: sequence ids, sequenceAck, recovery after
//! a dropped TCP connection, refused recoveries and the replay buffer's bounds.

mod common;

use common::*;
use serde_json::{json, Value};
use statehub_webpubsub::Limits;

const ALL: &[&str] = &["webpubsub.joinLeaveGroup", "webpubsub.sendToGroup"];

async fn publish(ws: &mut Ws, text: &str) {
    send(
        ws,
        json!({"type":"sendToGroup","group":"g","dataType":"text","data":text}),
    )
    .await;
}

fn seq_and_data(v: &Value) -> (u64, String) {
    (
        v["sequenceId"].as_u64().unwrap(),
        v["data"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn recovery_replays_unacked_messages_in_order() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", Some("sub"), ALL, &["g"]);
    let (mut sub, connected) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    let (mut publ, _) = connect(
        addr,
        "chat",
        &token(addr, "chat", Some("pub"), ALL, &[]),
        Some(JSON),
    )
    .await;

    for m in ["m1", "m2", "m3"] {
        publish(&mut publ, m).await;
    }
    sync(&mut publ).await;
    let got: Vec<_> = sync(&mut sub).await.iter().map(seq_and_data).collect();
    assert_eq!(got, [(1, "m1".into()), (2, "m2".into()), (3, "m3".into())]);
    send(&mut sub, json!({"type":"sequenceAck","sequenceId":1})).await;
    sync(&mut sub).await;

    drop(sub); // the TCP connection goes without a close handshake
    publish(&mut publ, "m4").await;
    sync(&mut publ).await;

    let id = connected["connectionId"].as_str().unwrap();
    let rt = connected["reconnectionToken"].as_str().unwrap();
    let url = format!("ws://{addr}/client/hubs/chat?access_token={t}&awps_connection_id={id}&awps_reconnection_token={rt}");
    let mut sub = try_connect(&url, Some(RELIABLE)).await.unwrap();
    let again = recv(&mut sub).await;
    assert_eq!(
        (again["event"].clone(), again["connectionId"].clone()),
        (json!("connected"), json!(id))
    );
    let replay: Vec<_> = sync(&mut sub).await.iter().map(seq_and_data).collect();
    assert_eq!(
        replay,
        [(2, "m2".into()), (3, "m3".into()), (4, "m4".into())],
        "everything above the ack, in order"
    );

    publish(&mut publ, "m5").await;
    assert_eq!(
        seq_and_data(&recv(&mut sub).await),
        (5, "m5".into()),
        "groups survive recovery"
    );
    let dup = json!({"type":"sendToGroup","group":"other","ackId":11,"data":1});
    send(&mut sub, dup.clone()).await;
    assert_eq!(recv(&mut sub).await["success"], true);
    drop(sub);
    let mut sub = try_connect(&url, Some(RELIABLE)).await.unwrap();
    recv(&mut sub).await;
    sync(&mut sub).await;
    send(&mut sub, dup).await;
    assert_eq!(
        recv(&mut sub).await["error"]["name"],
        "Duplicate",
        "processed ackIds survive recovery"
    );
}

#[tokio::test]
async fn recovery_replaces_a_socket_still_attached() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", None, ALL, &["g"]);
    let (mut old, connected) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    let id = connected["connectionId"].as_str().unwrap();
    let rt = connected["reconnectionToken"].as_str().unwrap();
    let url = format!(
        "ws://{addr}/client/hubs/chat?awps_connection_id={id}&awps_reconnection_token={rt}"
    );
    let mut new = try_connect(&url, Some(RELIABLE)).await.unwrap();
    assert_eq!(recv(&mut new).await["event"], "connected");
    assert_eq!(close_code(&mut old).await, Some(1000));
    publish(&mut new, "x").await;
    assert_eq!(sync(&mut new).await[0]["data"], "x");
}

#[tokio::test]
async fn failed_recovery_is_accepted_then_closed_with_1008() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", None, ALL, &[]);
    let (_live, connected) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    let id = connected["connectionId"].as_str().unwrap();
    for (cid, rt) in [
        (id, "forged-token"),
        (
            "no-such-connection",
            connected["reconnectionToken"].as_str().unwrap(),
        ),
    ] {
        let url = format!(
            "ws://{addr}/client/hubs/chat?awps_connection_id={cid}&awps_reconnection_token={rt}"
        );
        let mut ws = try_connect(&url, Some(RELIABLE))
            .await
            .expect("the upgrade is accepted");
        assert_eq!(close_code(&mut ws).await, Some(1008));
    }
}

#[tokio::test]
async fn non_reliable_sessions_cannot_be_recovered() {
    let addr = start(Limits::default()).await;
    let t = token(addr, "chat", None, ALL, &[]);
    let (ws, connected) = connect(addr, "chat", &t, Some(JSON)).await;
    drop(ws);
    let id = connected["connectionId"].as_str().unwrap();
    let url =
        format!("ws://{addr}/client/hubs/chat?awps_connection_id={id}&awps_reconnection_token=x");
    let mut ws = try_connect(&url, Some(RELIABLE)).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1008));
}

/// Reads frames until the server's close frame: the frames before it and its code.
async fn until_close(ws: &mut Ws) -> (Vec<Value>, Option<u16>) {
    let mut seen = Vec::new();
    loop {
        match next_frame(ws).await {
            Some(tokio_tungstenite::tungstenite::Message::Text(t)) => {
                seen.push(serde_json::from_str::<Value>(t.as_str()).unwrap())
            }
            Some(tokio_tungstenite::tungstenite::Message::Close(f)) => {
                return (seen, f.map(|f| u16::from(f.code)))
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Publishes the numbers `from..from + n` to group `g` and waits until they were handled.
async fn flood(publ: &mut Ws, from: u64, n: u64) {
    for i in from..from + n {
        send(
            publ,
            json!({"type":"sendToGroup","group":"g","noEcho":true,"data":i}),
        )
        .await;
    }
    sync(publ).await;
}

fn recovery_url(addr: std::net::SocketAddr, connected: &Value) -> String {
    let id = connected["connectionId"].as_str().unwrap();
    let rt = connected["reconnectionToken"].as_str().unwrap();
    format!("ws://{addr}/client/hubs/chat?awps_connection_id={id}&awps_reconnection_token={rt}")
}

/// A replay buffer far smaller than what flows: the subscriber that reads is never
/// closed; a recovery that needs an evicted message is accepted, told `disconnected`
/// and closed with 1008 (the session is gone); one whose ack covers every eviction
/// is served.
#[tokio::test]
async fn the_replay_bound_evicts_instead_of_closing_and_fails_only_recoveries_it_must() {
    let addr = start(Limits {
        replay_buffer_bytes: 2048,
        ..Limits::default()
    })
    .await;
    let t = token(addr, "chat", None, ALL, &["g"]);
    let (mut publ, _) = connect(addr, "chat", &t, Some(JSON)).await;
    let (mut sub, connected) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    flood(&mut publ, 1, 100).await;
    let got: Vec<u64> = sync(&mut sub)
        .await
        .iter()
        .map(|v| v["sequenceId"].as_u64().unwrap())
        .collect();
    assert_eq!(
        got,
        (1..=100).collect::<Vec<_>>(),
        "all delivered, none closed"
    );
    drop(sub);
    let mut ws = try_connect(&recovery_url(addr, &connected), Some(RELIABLE))
        .await
        .expect("the recovery is accepted");
    let (seen, code) = until_close(&mut ws).await;
    assert_eq!(code, Some(1008));
    assert_eq!(seen.last().unwrap()["event"], "disconnected");
    let why = seen.last().unwrap()["message"].as_str().unwrap().to_owned();
    assert!(why.contains("cannot be recovered"), "{why}");

    let (mut sub, connected) = connect(addr, "chat", &t, Some(RELIABLE)).await;
    flood(&mut publ, 101, 100).await;
    assert_eq!(sync(&mut sub).await.len(), 100);
    send(&mut sub, json!({"type":"sequenceAck","sequenceId":100})).await;
    sync(&mut sub).await;
    drop(sub);
    flood(&mut publ, 201, 2).await;
    let mut sub = try_connect(&recovery_url(addr, &connected), Some(RELIABLE))
        .await
        .unwrap();
    assert_eq!(recv(&mut sub).await["event"], "connected");
    let replay: Vec<(u64, u64)> = sync(&mut sub)
        .await
        .iter()
        .map(|v| {
            (
                v["sequenceId"].as_u64().unwrap(),
                v["data"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(replay, [(101, 201), (102, 202)], "recovered in full");
}
