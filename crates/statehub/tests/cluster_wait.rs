//! `--redis-wait-replicas`: a state store write, a QoS 1 PUBLISH, a persistent
//! session's change, a Web PubSub send and a reliable session's claim are acknowledged
//! only once Redis replicas have them, and a reliable subscriber gets a frame only once
//! they have its session's copy. Two real redis-servers, one a replica of the
//! other: writes are acknowledged while the replica is up, refused (503,
//! PUBACK/CONNACK/DISCONNECT 0x80, ack `InternalServerError`, close 1013) and logged
//! while it is down, and acknowledged again once it is back.

mod common;
mod store_client;

use std::time::{Duration, Instant};

use common::Server;
use statehub_broker::codec::{Packet, QoS, ReasonCode, Subscribe};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, RawClient, V5};
use store_client::{StoreClient, LOCAL};

fn node(primary: &RedisServer, wait_replicas: &str, tag: &str) -> Server {
    let config = store_client::config_file(
        &format!("cluster-wait-{tag}-{wait_replicas}.toml"),
        "[cluster]\nredis_wait_timeout_ms = 200\n",
    );
    let url = primary.url();
    let config = config.display().to_string();
    let mut args = LOCAL.to_vec();
    args.extend(["--redis", &url, "--config", &config]);
    args.extend(["--redis-wait-replicas", wait_replicas]);
    common::start(&args, &[])
}

/// SETs `k` to `value` until it is acknowledged (at most 30 s): the replica may still be
/// catching up.
async fn set_until_acknowledged(client: &mut StoreClient, value: &[u8]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.call_status(&[b"SET", b"k", value]).await {
            (Some(stat), payload) if stat == "200" => {
                assert_eq!(payload, b"+OK\r\n");
                return;
            }
            (stat, _) => assert!(Instant::now() < deadline, "still {stat:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `server` logs a line containing `text` within 30 s.
fn logged(server: &Server, text: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Ok(line) = server
        .log
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        if line.contains(text) {
            return true;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_wait_for_a_replica_and_are_refused_while_it_is_down() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let a = node(&primary, "1", "store");
    let mut client = StoreClient::connect(a.mqtt, "wait").await;
    set_until_acknowledged(&mut client, b"first").await;

    replica.kill();
    let (stat, _) = client.call_status(&[b"SET", b"k", b"unreplicated"]).await;
    assert_eq!(stat.as_deref(), Some("503"), "a write no replica has");
    assert!(
        logged(&a, "0 of 1 replicas acknowledged"),
        "the refusal is logged with its cause"
    );
    // Without the option the same write is acknowledged: the primary has it.
    let b = node(&primary, "0", "store");
    let mut plain = StoreClient::connect(b.mqtt, "plain").await;
    let (stat, _) = plain.call_status(&[b"SET", b"k", b"primary-only"]).await;
    assert_eq!(stat.as_deref(), Some("200"));
    // Reads are answered: they wait for nothing.
    let (stat, _) = client.call_status(&[b"GET", b"k"]).await;
    assert_eq!(stat.as_deref(), Some("200"));

    replica.restart();
    set_until_acknowledged(&mut client, b"again").await;
    assert_eq!(
        client.call(&[b"GET", b"k"]).await.payload,
        b"$5\r\nagain\r\n"
    );
}

/// Publishes at QoS 1 until the PUBACK is a success (at most 30 s).
async fn publish_until_acknowledged(c: &mut RawClient) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let code = c.publish_simple("t", QoS::AtLeastOnce, b"m").await;
        if code.0 < 0x80 {
            return;
        }
        assert!(Instant::now() < deadline, "still {code:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_1_publishes_wait_for_a_replica_and_are_refused_with_0x80_while_it_is_down() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let a = node(&primary, "1", "mqtt");
    let mut publisher = RawClient::connect(a.mqtt, V5, "wait-publisher").await;
    publish_until_acknowledged(&mut publisher).await;

    replica.kill();
    let code = publisher
        .publish_simple("t", QoS::AtLeastOnce, b"unreplicated")
        .await;
    assert_eq!(
        code,
        ReasonCode::UNSPECIFIED_ERROR,
        "a message no replica has"
    );
    assert!(
        logged(&a, "0 of 1 replicas acknowledged"),
        "the refusal is logged with its cause"
    );
    // QoS 0 waits for nobody.
    let code = publisher.publish_simple("t", QoS::AtMostOnce, b"q0").await;
    assert_eq!(code, ReasonCode::SUCCESS);

    replica.restart();
    publish_until_acknowledged(&mut publisher).await;
}

/// Connects `client_id` with a persistent session until the CONNACK is a success (at
/// most 30 s: the replica may still be catching up).
async fn resume_until_accepted(addr: std::net::SocketAddr, client_id: &str) -> RawClient {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (c, ack) = RawClient::connect_with(addr, persistent_connect(client_id, 300)).await;
        if ack.reason_code == ReasonCode::SUCCESS {
            return c;
        }
        assert!(Instant::now() < deadline, "still {ack:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_session_changes_wait_for_a_replica_and_are_refused_with_0x80_while_it_is_down()
{
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let a = node(&primary, "1", "sessions");
    let mut kept = resume_until_accepted(a.mqtt, "wait-session").await;
    let ack = kept.subscribe("s/1", opts(QoS::AtLeastOnce)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_1]);

    replica.kill();
    // A new subscription is a change of the stored session: no replica has it, so no
    // SUBACK; the connection is closed with 0x80 and the client resends.
    let subscribe = Subscribe {
        packet_id: kept.next_packet_id(),
        filters: vec![("s/2".into(), opts(QoS::AtLeastOnce))],
        ..Default::default()
    };
    kept.send(&Packet::Subscribe(subscribe)).await;
    kept.expect_disconnect(ReasonCode::UNSPECIFIED_ERROR).await;
    // A new persistent session cannot be promised: CONNACK 0x80.
    let (_, ack) = RawClient::connect_with(a.mqtt, persistent_connect("wait-new", 300)).await;
    assert_eq!(ack.reason_code, ReasonCode::UNSPECIFIED_ERROR, "{ack:?}");
    assert!(
        logged(
            &a,
            "mqtt sessions: redis WAIT: 0 of 1 replicas acknowledged"
        ),
        "the refusal is logged with its cause"
    );

    replica.restart();
    let mut back = resume_until_accepted(a.mqtt, "wait-session").await;
    let ack = back.subscribe("s/2", opts(QoS::AtLeastOnce)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::GRANTED_QOS_1]);
}

const WPS_KEY: &str = "cluster-wait-access-key";
const WPS_HUB: &str = "wait";

/// A node with Web PubSub whose acknowledgements wait for one replica.
fn wps_node(primary: &RedisServer) -> Server {
    let toml = format!(
        "[webpubsub]\naccess_keys = [\"{WPS_KEY}\"]\n\
         [cluster]\nredis_url = \"{}\"\nnamespace = \"wpswait\"\nredis_wait_timeout_ms = 200\n",
        primary.url()
    );
    common::start_configured(&toml, &["--redis-wait-replicas", "1"])
}

/// A REST send to every connection of the hub through `addr`: the HTTP status.
async fn rest_send(addr: std::net::SocketAddr) -> u16 {
    rest_send_text(addr, "m").await
}

/// A REST send of `body` to every connection of the hub through `addr`: the status.
async fn rest_send_text(addr: std::net::SocketAddr, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let path = format!("/api/hubs/{WPS_HUB}/:send?api-version=2024-12-01");
    let claims = statehub_webpubsub::ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec![],
    };
    let audience = format!("http://{addr}{path}");
    let token =
        statehub_webpubsub::issue_token(WPS_KEY, &audience, &claims, Duration::from_secs(60));
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let read = stream.read_to_end(&mut response);
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("a REST answer in time")
        .unwrap();
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Sends through REST until it is acknowledged (202; at most 30 s).
async fn rest_send_until_accepted(addr: std::net::SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = rest_send(addr).await;
        if status == 202 {
            return;
        }
        assert!(Instant::now() < deadline, "still {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_pubsub_sends_wait_for_a_replica_and_are_refused_while_it_is_down() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let a = wps_node(&primary);
    rest_send_until_accepted(a.http).await;
    let protocol = Some("json.webpubsub.azure.v1");
    let mut ws = common::wps::client(a.http, WPS_KEY, WPS_HUB, protocol).await;
    assert!(common::wps::next_text(&mut ws).await.contains("connected"));

    replica.kill();
    assert_eq!(rest_send(a.http).await, 503, "a send no replica has");
    let send = r#"{"type":"sendToGroup","group":"g","ackId":7,"dataType":"text","data":"x"}"#;
    ws.send(Message::text(send)).await.unwrap();
    let ack = loop {
        let frame = common::wps::next_text(&mut ws).await;
        if frame.contains(r#""ack""#) {
            break frame;
        }
    };
    assert!(
        ack.contains(r#""success":false"#) && ack.contains("InternalServerError"),
        "a client's send no replica has: {ack}"
    );
    assert!(
        logged(
            &a,
            "web pubsub cluster: writes not acknowledged by enough redis replicas"
        ),
        "the refusal is logged with its cause"
    );

    replica.restart();
    rest_send_until_accepted(a.http).await;
}

/// The close code of `ws` (skipping text frames), if it closes within 30 s.
async fn close_code(ws: &mut common::wps::Ws) -> Option<u16> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, ws.next()).await.ok()?? {
            Ok(Message::Close(frame)) => return frame.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_pubsub_claim_waits_for_a_replica_and_is_closed_with_1013_while_it_is_down() {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";

    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let (a, b) = (wps_node(&primary), wps_node(&primary));
    rest_send_until_accepted(a.http).await;
    let mut ws = common::wps::client(a.http, WPS_KEY, WPS_HUB, Some(RELIABLE)).await;
    let connected: serde_json::Value =
        serde_json::from_str(&common::wps::next_text(&mut ws).await).unwrap();
    let id = connected["connectionId"].as_str().unwrap().to_owned();
    let token = connected["reconnectionToken"].as_str().unwrap().to_owned();
    drop(ws);
    let recover = || async {
        let url = format!(
            "ws://{}/client/hubs/{WPS_HUB}?awps_connection_id={id}&awps_reconnection_token={token}",
            b.http
        );
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", HeaderValue::from_static(RELIABLE));
        tokio_tungstenite::connect_async(req).await.unwrap().0
    };

    replica.kill();
    let mut refused = recover().await;
    assert_eq!(
        close_code(&mut refused).await,
        Some(1013),
        "a claim no replica has: try again"
    );

    replica.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut ws = recover().await;
        let first: serde_json::Value =
            serde_json::from_str(&common::wps::next_text(&mut ws).await).unwrap();
        if first["event"] == "connected" {
            assert_eq!(first["connectionId"], id.as_str(), "the same session, on B");
            return;
        }
        assert_eq!(first["event"], "disconnected", "{first}");
        assert!(
            Instant::now() < deadline,
            "the recovery on B is served again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The data of the next `message` frame on `ws` and its sequence id.
async fn next_message(ws: &mut common::wps::Ws) -> (String, u64) {
    loop {
        let frame: serde_json::Value =
            serde_json::from_str(&common::wps::next_text(ws).await).unwrap();
        if frame["type"] == "message" {
            let data = frame["data"].as_str().unwrap().to_owned();
            return (data, frame["sequenceId"].as_u64().unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_subscriber_gets_a_frame_only_once_a_replica_has_its_copy() {
    const RELIABLE: &str = "json.reliable.webpubsub.azure.v1";

    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(&primary);
    replica.wait_in_sync();
    let a = wps_node(&primary);
    rest_send_until_accepted(a.http).await;
    let mut ws = common::wps::client(a.http, WPS_KEY, WPS_HUB, Some(RELIABLE)).await;
    assert!(common::wps::next_text(&mut ws).await.contains("connected"));
    assert_eq!(rest_send_text(a.http, "up").await, 202);
    let (data, mut last) = next_message(&mut ws).await;
    assert_eq!(data, "up", "a frame the replica has");

    replica.kill();
    let mut sent = vec!["down-1".to_owned(), "down-2".to_owned()];
    for body in &sent {
        assert_eq!(rest_send_text(a.http, body).await, 503, "no replica has it");
    }
    // The second refusal came from a later pipeline than the first frame's copy.
    let early = tokio::time::timeout(Duration::from_secs(1), next_message(&mut ws)).await;
    assert!(
        early.is_err(),
        "a frame only the primary has reached its subscriber: {early:?}"
    );

    replica.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = format!("back-{}", sent.len());
        let status = rest_send_text(a.http, &body).await;
        sent.push(body);
        if status == 202 {
            break;
        }
        assert!(Instant::now() < deadline, "still {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut got = Vec::new();
    while got.len() < sent.len() {
        let (data, sequence) = next_message(&mut ws).await;
        assert!(sequence > last, "in order: {sequence} after {last}");
        last = sequence;
        got.push(data);
    }
    assert_eq!(got, sent, "every frame held, once, in order");
}
