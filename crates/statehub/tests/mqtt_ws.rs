//! MQTT over WebSocket on the binary's HTTP listener, byte for byte: the handshake and
//! its subprotocols, packets split over frames and packed into one, and what is
//! refused (text frames, oversize frames, a socket that never sends CONNECT).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::mqtt_ws::*;
use common::{start, start_configured, Server};
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The binary on port 0 with `config` as its TOML file.
fn start_with(config: &str) -> Server {
    start_configured(config, &[])
}

/// Opens `ws://addr/mqtt` offering `protocols`; the subprotocol answered too.
async fn open(addr: SocketAddr, protocols: &str) -> Result<(Ws, Option<String>), WsError> {
    let mut req = format!("ws://{addr}/mqtt").into_client_request().unwrap();
    if !protocols.is_empty() {
        let value = HeaderValue::from_str(protocols).unwrap();
        req.headers_mut().insert("Sec-WebSocket-Protocol", value);
    }
    let (ws, response) = tokio_tungstenite::connect_async(req).await?;
    let answered = response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    Ok((ws, answered))
}

async fn connected(addr: SocketAddr) -> Ws {
    let (mut ws, _) = open(addr, "mqtt").await.unwrap();
    mqtt_connect(&mut ws).await;
    ws
}

#[tokio::test]
async fn the_subprotocol_is_answered_and_others_are_refused() {
    let server = start_with("");
    let (_ws, answered) = open(server.http, "mqtt").await.unwrap();
    assert_eq!(answered.as_deref(), Some("mqtt"));
    let (_ws, answered) = open(server.http, "mqttv3.1").await.unwrap();
    assert_eq!(answered.as_deref(), Some("mqttv3.1"));
    // The client's first acceptable one.
    let (_ws, answered) = open(server.http, "foo, mqttv3.1, mqtt").await.unwrap();
    assert_eq!(answered.as_deref(), Some("mqttv3.1"));
    match open(server.http, "json.webpubsub.azure.v1").await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 400),
        other => panic!("expected 400, got {:?}", other.map(|(_, p)| p)),
    }
}

#[tokio::test]
async fn a_packet_split_over_three_frames_and_three_packets_in_one_frame() {
    let server = start_with("");
    let (mut ws, _) = open(server.http, "mqtt").await.unwrap();
    split_and_packed(&mut ws).await;
    // A packet split across one WebSocket message's fragments (continuation frames).
    let (head, tail) = PINGREQ.split_at(1);
    let first = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        head.to_vec(),
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Binary,
        ),
        false,
    );
    let rest = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        tail.to_vec(),
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Continue,
        ),
        true,
    );
    ws.send(Message::Frame(first)).await.unwrap();
    ws.send(Message::Frame(rest)).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP).await;
}

#[tokio::test]
async fn a_text_frame_is_refused_with_1003() {
    let server = start_with("");
    let mut ws = connected(server.http).await;
    ws.send(Message::text("hello")).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1003));
    // Before CONNECT too.
    let (mut ws, _) = open(server.http, "mqtt").await.unwrap();
    ws.send(Message::text("\u{10}")).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1003));
}

#[tokio::test]
async fn an_oversize_frame_is_refused_with_1009() {
    // Messages may hold max_packet_size + 16 KiB.
    let server = start_with("[mqtt]\nmax_packet_size = 1024\n");
    let mut ws = connected(server.http).await;
    // Just within the bound: a whole PUBLISH of 1024 bytes and 15 KiB of PINGREQs.
    let mut fits = vec![0x30, 0xFD, 0x07, 0, 1, b't'];
    fits.resize(1024, b'x');
    for _ in 0..(15 * 1024 / 2) {
        fits.extend_from_slice(&PINGREQ);
    }
    ws.send(Message::binary(fits)).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP.repeat(15 * 1024 / 2)).await;
    // Refused on its header: the rest is drained, not read, so the client can send it
    // all and still read the close frame (no reset).
    let too_big = vec![0u8; 4 << 20];
    ws.send(Message::binary(too_big)).await.unwrap();
    assert_eq!(close_code(&mut ws).await, Some(1009));
    // The connection is gone, and another client is served.
    let mut ws = connected(server.http).await;
    ws.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut ws, &PINGRESP).await;
}

#[tokio::test]
async fn a_websocket_that_never_sends_connect_is_closed_after_the_connect_timeout() {
    let server = start_with("[mqtt]\nconnect_timeout_secs = 1\n");
    let opened = Instant::now();
    let (mut ws, _) = open(server.http, "mqtt").await.unwrap();
    // Another client is served meanwhile.
    let mut other = connected(server.http).await;
    other.send(Message::binary(PINGREQ.to_vec())).await.unwrap();
    expect_bytes(&mut other, &PINGRESP).await;
    let code = close_code(&mut ws).await;
    assert!(opened.elapsed() >= Duration::from_secs(1));
    assert_eq!(code, Some(1000));
}

#[tokio::test]
async fn websockets_without_connect_are_bounded_per_address() {
    let config = "[mqtt]\nmax_pending_per_address = 2\nconnect_timeout_secs = 600\n";
    let server = start_with(config);
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(open(server.http, "mqtt").await.unwrap().0);
    }
    // One of the three is closed (the newest if the others are younger than the
    // pending bound's grace, else the oldest); the other two still connect.
    let (closed, others) = {
        let nexts = silent.iter_mut().map(|ws| Box::pin(ws.next()));
        let first = futures_util::future::select_all(nexts);
        let (frame, index, _) = tokio::time::timeout(WAIT, first)
            .await
            .expect("none of the three was closed");
        assert!(
            matches!(frame, Some(Ok(Message::Close(_)) | Err(_)) | None),
            "{frame:?}"
        );
        (index, silent.len() - 1)
    };
    silent.remove(closed);
    assert_eq!(silent.len(), others);
    for mut ws in silent {
        ws.send(Message::binary(CONNECT.to_vec())).await.unwrap();
        expect_bytes(&mut ws, &CONNACK).await;
    }
}

#[tokio::test]
async fn each_websocket_holds_an_http_connection_until_it_closes() {
    let server = start_with("[http]\nmax_connections = 2\n");
    let mut first = connected(server.http).await;
    let _second = connected(server.http).await;
    match open(server.http, "mqtt").await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 503),
        other => panic!("expected 503, got {:?}", other.map(|(_, p)| p)),
    }
    // DISCONNECT: once the first socket is closed its slot serves a new client.
    first.send(Message::binary(vec![0xE0, 0])).await.unwrap();
    while let Some(Ok(_)) = first.next().await {}
    let deadline = Instant::now() + WAIT;
    loop {
        match open(server.http, "mqtt").await {
            Ok(_) => break,
            Err(WsError::Http(r)) if r.status() == 503 && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_plain_get_is_told_to_upgrade() {
    let server = start_with("");
    let mut tcp = common::connect_tcp(server.http);
    use std::io::{Read, Write};
    tcp.write_all(b"GET /mqtt HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    let _ = tcp.read_to_string(&mut response);
    assert!(response.starts_with("HTTP/1.1 426"), "{response}");
    assert!(response.contains("subprotocol mqtt"), "{response}");
}

#[tokio::test]
async fn off_in_the_config_file() {
    let server = start_with("[http]\nmqtt_websocket = false\n");
    match open(server.http, "mqtt").await {
        Err(WsError::Http(response)) => assert_eq!(response.status(), 404),
        other => panic!("expected 404, got {:?}", other.map(|(_, p)| p)),
    }
}

/// A client over WebSocket is authenticated as on the MQTT listener: with a password
/// file, no credentials get return code 5 (not authorized) and the right ones connect.
#[tokio::test]
async fn websocket_clients_are_authenticated_like_the_mqtt_listener() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let mut child = std::process::Command::new(common::BIN)
        .args(["passwd", "-I", "1000", "-c"])
        .arg(&file)
        .arg("alice")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "wonderland").unwrap();
    assert!(child.wait().unwrap().success());
    let server = start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--password-file",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let (mut anonymous, _) = open(server.http, "mqtt").await.unwrap();
    anonymous
        .send(Message::binary(CONNECT.to_vec()))
        .await
        .unwrap();
    expect_bytes(&mut anonymous, &[0x20, 2, 0, 5]).await;

    // MQTT 3.1.1 CONNECT with user name "alice" and password "wonderland".
    let mut connect = vec![0x10, 33, 0, 4, b'M', b'Q', b'T', b'T', 4, 0xC2, 0, 60];
    connect.extend_from_slice(&[0, 2, b'c', b'2', 0, 5]);
    connect.extend_from_slice(b"alice");
    connect.extend_from_slice(&[0, 10]);
    connect.extend_from_slice(b"wonderland");
    let (mut alice, _) = open(server.http, "mqtt").await.unwrap();
    alice.send(Message::binary(connect)).await.unwrap();
    expect_bytes(&mut alice, &CONNACK).await;
}
