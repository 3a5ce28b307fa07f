//! The `statehub` binary end to end: listeners on port 0 (addresses parsed from
//! the log), /healthz, graceful SIGTERM (clients get DISCONNECT 0x8B, exit 0),
//! configuration from environment variables and from a TOML file, and a bad
//! config file refused with exit code 2.
//!
//! Plain std (threads, blocking sockets with timeouts): every wait is bounded.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{connect_tcp, http_get, run_to_exit, start, wait_exit, LOCAL};

/// Opens an MQTT 5 connection (keep alive 60) and returns it with the CONNACK bytes.
fn mqtt5_connect(addr: SocketAddr, client_id: &str) -> (TcpStream, Vec<u8>) {
    let mut s = connect_tcp(addr);
    let id = client_id.as_bytes();
    let mut body = vec![0, 4, b'M', b'Q', b'T', b'T', 5, 0x02, 0, 60, 0];
    body.extend_from_slice(&(id.len() as u16).to_be_bytes());
    body.extend_from_slice(id);
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend_from_slice(&body);
    s.write_all(&packet).unwrap();
    let mut head = [0u8; 2];
    s.read_exact(&mut head).expect("CONNACK header");
    assert_eq!(head[0], 0x20, "expected CONNACK");
    assert!(head[1] < 128, "CONNACK unexpectedly long");
    let mut rest = vec![0u8; usize::from(head[1])];
    s.read_exact(&mut rest).expect("CONNACK body");
    assert_eq!(rest[1], 0x00, "CONNACK reason code");
    (s, rest)
}

fn temp_file(name: &str, contents: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("statehub-test-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

#[test]
fn healthz_answers_200_ok() {
    let server = start(&LOCAL, &[]);
    assert_ne!(server.mqtt.port(), 0);
    assert_ne!(server.http.port(), 0);
    let resp = http_get(server.http, "/healthz");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.trim_end().ends_with("ok"), "{resp}");
    let resp = http_get(server.http, "/nope");
    assert!(resp.starts_with("HTTP/1.1 404"), "{resp}");
}

#[test]
fn sigterm_disconnects_clients_with_0x8b_and_exits_0() {
    let mut server = start(&[&LOCAL[..], &["--shutdown-grace-secs", "3"]].concat(), &[]);
    let (mut client, _) = mqtt5_connect(server.mqtt, "bye");
    let pid = server.child.id().to_string();
    let start = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    // Everything the server sends until it closes: must be DISCONNECT 0x8B.
    let mut got = Vec::new();
    let _ = client.read_to_end(&mut got);
    assert!(got.len() >= 3, "expected a DISCONNECT, got {got:02X?}");
    assert_eq!(got[0], 0xE0, "expected DISCONNECT, got {got:02X?}");
    assert_eq!(
        got[2], 0x8B,
        "DISCONNECT reason should be 0x8B (server shutting down): {got:02X?}"
    );
    drop(client);
    let status = wait_exit(&mut server.child, Duration::from_secs(5));
    assert!(status.success(), "exit status {status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "took {:?}, grace is 3 s",
        start.elapsed()
    );
    let log: Vec<String> = server.log.try_iter().collect();
    assert!(
        log.iter().any(|l| l.contains("shutdown requested")),
        "log: {log:?}"
    );
}

#[test]
fn sigterm_with_no_clients_exits_0_promptly() {
    let mut server = start(&LOCAL, &[]);
    let start = Instant::now();
    Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    let status = wait_exit(&mut server.child, Duration::from_secs(5));
    assert!(status.success(), "exit status {status:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn listen_addresses_from_environment_variables() {
    let server = start(
        &[],
        &[
            ("STATEHUB_MQTT_LISTEN", "127.0.0.1:0"),
            ("STATEHUB_HTTP_LISTEN", "127.0.0.1:0"),
        ],
    );
    assert_eq!(server.mqtt.ip().to_string(), "127.0.0.1");
    assert_ne!(server.mqtt.port(), 0);
    assert_ne!(server.mqtt.port(), 1883, "STATEHUB_MQTT_LISTEN ignored");
    assert_eq!(server.http.ip().to_string(), "127.0.0.1");
    mqtt5_connect(server.mqtt, "env");
    assert!(http_get(server.http, "/healthz").starts_with("HTTP/1.1 200"));
}

#[test]
fn settings_from_a_toml_file() {
    let path = temp_file(
        "good.toml",
        "mqtt_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\n\n[mqtt]\nmax_keep_alive = 7\n\n\
         [state_store]\nresponse_cache_entries = 50\nresponse_cache_in_flight = 500\n",
    );
    let server = start(&["--config", path.to_str().unwrap()], &[]);
    assert_eq!(server.mqtt.ip().to_string(), "127.0.0.1");
    assert_ne!(
        server.mqtt.port(),
        1883,
        "mqtt_listen from the file ignored"
    );
    let (_c, connack) = mqtt5_connect(server.mqtt, "toml");
    // Server Keep Alive (0x13) = 7: the client asked for 60 and [mqtt] caps it.
    assert!(
        connack.windows(3).any(|w| w == [0x13, 0x00, 0x07]),
        "CONNACK lacks Server Keep Alive 7 from the config file: {connack:02X?}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn environment_overrides_the_file() {
    let path = temp_file(
        "override.toml",
        "mqtt_listen = \"127.0.0.1:1\"\nhttp_listen = \"127.0.0.1:0\"\n",
    );
    let server = start(
        &["--config", path.to_str().unwrap()],
        &[("STATEHUB_MQTT_LISTEN", "127.0.0.1:0")],
    );
    assert_ne!(
        server.mqtt.port(),
        1,
        "STATEHUB_MQTT_LISTEN should win over the file"
    );
    mqtt5_connect(server.mqtt, "override");
    let _ = std::fs::remove_file(path);
}

#[test]
fn bad_config_file_exits_2_with_a_clear_error() {
    let path = temp_file(
        "bad.toml",
        "mqtt_listen = \"127.0.0.1:0\"\nno_such_setting = 1\n",
    );
    let (status, err) = run_to_exit(&["--config", path.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("invalid config file"), "stderr: {err}");
    assert!(
        err.contains(path.to_str().unwrap()),
        "error should name the file: {err}"
    );
    assert!(
        err.contains("no_such_setting"),
        "error should name the bad key: {err}"
    );
    let _ = std::fs::remove_file(&path);

    let path = temp_file("badtype.toml", "[mqtt]\nmax_keep_alive = \"soon\"\n");
    let (status, err) = run_to_exit(&["--config", path.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("max_keep_alive"), "stderr: {err}");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn missing_config_file_exits_2() {
    let (status, err) = run_to_exit(&["--config", "/nonexistent/statehub.toml"]);
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(
        err.contains("cannot read config file") && err.contains("/nonexistent/statehub.toml"),
        "stderr: {err}"
    );
}

/// Reads one server WebSocket frame (unmasked): opcode and payload.
fn ws_frame(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut head = [0u8; 2];
    s.read_exact(&mut head).expect("frame header");
    let len = match head[1] & 0x7F {
        126 => {
            let mut b = [0u8; 2];
            s.read_exact(&mut b).unwrap();
            usize::from(u16::from_be_bytes(b))
        }
        127 => panic!("frame too long for this test"),
        n => usize::from(n),
    };
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).unwrap();
    (head[0] & 0x0F, payload)
}

#[test]
fn webpubsub_from_the_config_file_and_sigterm_closes_websockets() {
    let path = temp_file(
        "wps.toml",
        "[webpubsub]\naccess_keys = [\"file-key-0123456789\"]\n\n[webpubsub.limits]\nping_interval_secs = 20\n\n\
         [[webpubsub.hubs.chat.event_handlers]]\nurl_template = \"http://127.0.0.1:9/{event}\"\nsystem_events = [\"disconnected\"]\n",
    );
    let mut server = start(
        &[&LOCAL[..], &["--config", path.to_str().unwrap()]].concat(),
        &[],
    );
    let resp = http_get(server.http, "/api/health?api-version=2024-12-01");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let resp = http_get(
        server.http,
        "/api/hubs/chat/groups/g/connections?api-version=2024-12-01",
    );
    assert!(
        resp.starts_with("HTTP/1.1 401"),
        "the REST API is mounted and wants a token: {resp}"
    );

    let claims = statehub_webpubsub::ClientClaims {
        user_id: Some("u".into()),
        roles: vec![],
        groups: vec![],
    };
    let token = statehub_webpubsub::issue_token(
        "file-key-0123456789",
        "http://x/client/hubs/chat",
        &claims,
        Duration::from_secs(60),
    );
    let mut ws = connect_tcp(server.http);
    write!(
        ws,
        "GET /client/hubs/chat?access_token={token} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: json.webpubsub.azure.v1\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    while !response.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        ws.read_exact(&mut b).expect("upgrade response");
        response.push(b[0]);
    }
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 101"), "{response}");
    let (op, connected) = ws_frame(&mut ws);
    assert_eq!(op, 1);
    assert!(String::from_utf8_lossy(&connected).contains("\"connected\""));

    Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    let (op, disconnected) = ws_frame(&mut ws);
    assert_eq!(op, 1, "a text frame first");
    let text = String::from_utf8_lossy(&disconnected);
    assert!(
        text.contains("\"disconnected\"") && text.contains("shutting down"),
        "{text}"
    );
    let (op, close) = ws_frame(&mut ws);
    assert_eq!(op, 8, "then a close frame");
    assert_eq!(u16::from_be_bytes([close[0], close[1]]), 1001);
    let status = wait_exit(&mut server.child, Duration::from_secs(8));
    assert!(status.success(), "exit status {status:?}");
    let log: Vec<String> = server.log.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("upstream event not delivered")),
        "the dead upstream is logged: {log:?}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn bad_webpubsub_settings_exit_2() {
    let path = temp_file(
        "badwps.toml",
        "[[webpubsub.hubs.chat.event_handlers]]\nurl_template = \"ftp://nope\"\n",
    );
    let (status, err) = run_to_exit(&["--config", path.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    assert!(
        err.contains("url_template") && err.contains("chat"),
        "stderr: {err}"
    );
    let _ = std::fs::remove_file(&path);
}
