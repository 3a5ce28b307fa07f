//! The web dashboard in a real headless Chromium (Debian's `chromium`, driven by
//! `playwright-core` from `tests/dashboard/dashboard.mjs`), against the binary with
//! real clients: a rumqttc device that is listed and disconnected (0x98), the state
//! store used over MQTT (a key set before the browser scans it, changes the browser's
//! watch must each see, quick ones and a delete too, the browser's SET and DEL checked
//! by GET), a Web PubSub client
//! that must receive the browser's group message, and a rumqttc publish the topic
//! tail must show. The script asks for each of those with a `STEP` line; this side
//! answers `OK` once done or checked.
//!
//! `STATEHUB_DASHBOARD_SCREENSHOTS=DIR` makes the script save one PNG per page there
//! (`scripts/dashboard-screenshots.sh` refreshes `docs/dashboard/`).
//!
//! Also, without the browser: the dashboard is off without a key, a wrong key is
//! refused with a JSON 401, and a short key is refused at start-up.

mod common;
mod store_client;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use futures_util::StreamExt;
use rumqttc::v5::mqttbytes::v5::{ConnectProperties, DisconnectReasonCode, Packet};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions, StateError};
use statehub_webpubsub::ClientClaims;
use store_client::{StoreClient, PATIENCE};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

const ADMIN_KEY: &str = "dashboard-admin-key-0123456789";
const WPS_KEY: &str = "dashboard-access-key-0123456789";
const INSTALL: &str = "run `bash scripts/install-test-deps.sh` (it installs Debian's chromium and \
                       playwright-core in tests/dashboard)";

fn script_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/dashboard")
}

fn chromium() -> PathBuf {
    let path =
        std::env::var_os("CHROMIUM").map_or_else(|| "/usr/bin/chromium".into(), PathBuf::from);
    assert!(path.exists(), "{} is missing: {INSTALL}", path.display());
    assert!(
        script_dir().join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing from tests/dashboard/node_modules: {INSTALL}"
    );
    path
}

/// An MQTT 5 device with a 300 s session, subscribed to `devices/+/cmd`; the
/// receiver gets its DISCONNECT reason once the server sends one (the event loop then
/// stops, so it does not reconnect).
async fn device(addr: SocketAddr) -> mpsc::UnboundedReceiver<DisconnectReasonCode> {
    let mut opts = MqttOptions::new("dash-device", addr.ip().to_string(), addr.port());
    opts.set_connect_properties(ConnectProperties {
        session_expiry_interval: Some(300),
        ..Default::default()
    });
    let (client, mut eventloop) = AsyncClient::new(opts, 10);
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, mut ready) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _client = client.clone();
        client
            .subscribe("devices/+/cmd", QoS::AtLeastOnce)
            .await
            .unwrap();
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    let _ = ready_tx.send(());
                }
                // rumqttc reports the server's DISCONNECT as an error.
                Err(ConnectionError::MqttState(StateError::ServerDisconnect {
                    reason_code,
                    ..
                })) => {
                    let _ = tx.send(reason_code);
                    return;
                }
                Ok(_) => {}
                // The server went away (the end of the test): nothing to report.
                Err(_) => return,
            }
        }
    });
    timeout(PATIENCE, ready.recv())
        .await
        .expect("device SUBACK");
    rx
}

/// A Web PubSub client of hub `dash` in group `room`; the receiver gets the data of
/// every group message.
async fn wps_client(addr: SocketAddr) -> mpsc::UnboundedReceiver<String> {
    let claims = ClientClaims {
        user_id: Some("wps-user".into()),
        roles: vec![],
        groups: vec!["room".into()],
    };
    let mut ws = common::wps::json_client(addr, WPS_KEY, "dash", &claims).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let first = timeout(PATIENCE, ws.next())
        .await
        .expect("connected message");
    assert!(
        matches!(&first, Some(Ok(Message::Text(t))) if t.contains("\"connected\"")),
        "{first:?}"
    );
    tokio::spawn(async move {
        while let Some(Ok(frame)) = ws.next().await {
            if let Message::Text(text) = frame {
                let v: serde_json::Value = serde_json::from_str(&text).unwrap();
                if v["type"] == "message" && v["group"] == "room" {
                    let _ = tx.send(v["data"].as_str().unwrap_or_default().to_owned());
                }
            }
        }
    });
    rx
}

/// What the test's clients do for the script's steps.
struct Clients {
    store: StoreClient,
    publisher: AsyncClient,
    device: mpsc::UnboundedReceiver<DisconnectReasonCode>,
    wps: mpsc::UnboundedReceiver<String>,
}

impl Clients {
    async fn get(&mut self, key: &str) -> Vec<u8> {
        self.store.call(&[b"GET", key.as_bytes()]).await.payload
    }

    /// Does (or checks) one step; `Err` says why it failed.
    async fn step(&mut self, name: &str, data: &serde_json::Value) -> Result<(), String> {
        let s = |k: &str| data[k].as_str().unwrap_or_default().to_owned();
        match name {
            "disconnected" => match timeout(PATIENCE, self.device.recv()).await {
                Ok(Some(DisconnectReasonCode::AdministrativeAction)) => Ok(()),
                other => Err(format!("device got {other:?}, not DISCONNECT 0x98")),
            },
            "absent" => match self.get(&s("key")).await {
                v if v == b"$-1\r\n" => Ok(()),
                v => Err(format!("{} is {:?}", s("key"), String::from_utf8_lossy(&v))),
            },
            "value" => {
                let want = format!("${}\r\n{}\r\n", s("value").len(), s("value"));
                match self.get(&s("key")).await {
                    v if v == want.as_bytes() => Ok(()),
                    v => Err(format!("{} is {:?}", s("key"), String::from_utf8_lossy(&v))),
                }
            }
            "set" => {
                let answer = self
                    .store
                    .call(&[b"SET", s("key").as_bytes(), s("value").as_bytes()])
                    .await;
                (answer.payload == b"+OK\r\n")
                    .then_some(())
                    .ok_or_else(|| format!("SET answered {:?}", answer.payload))
            }
            "burst" => {
                let key = s("key");
                for value in data["values"].as_array().into_iter().flatten() {
                    let value = value.as_str().unwrap_or_default();
                    let answer = self
                        .store
                        .call(&[b"SET", key.as_bytes(), value.as_bytes()])
                        .await;
                    if answer.payload != b"+OK\r\n" {
                        return Err(format!("SET answered {:?}", answer.payload));
                    }
                }
                let answer = self.store.call(&[b"DEL", key.as_bytes()]).await;
                (answer.payload == b":1\r\n")
                    .then_some(())
                    .ok_or_else(|| format!("DEL answered {:?}", answer.payload))
            }
            "wps-received" => match timeout(PATIENCE, self.wps.recv()).await {
                Ok(Some(text)) if text == s("text") => Ok(()),
                other => Err(format!("web pubsub client got {other:?}")),
            },
            "publish" => self
                .publisher
                .publish(s("topic"), QoS::AtLeastOnce, false, s("payload"))
                .await
                .map_err(|e| e.to_string()),
            other => Err(format!("unknown step {other}")),
        }
    }
}

/// A publisher whose event loop runs in the background.
fn publisher(addr: SocketAddr) -> AsyncClient {
    let opts = MqttOptions::new("dash-publisher", addr.ip().to_string(), addr.port());
    let (client, mut eventloop) = AsyncClient::new(opts, 10);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium() {
    let chromium = chromium();
    let server = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--admin-key",
            ADMIN_KEY,
            "--access-key",
            WPS_KEY,
        ],
        &[],
    );
    let mut store = StoreClient::connect(server.mqtt, "dash-store").await;
    let seeded = store.call(&[b"SET", b"dash/seeded", b"from-mqtt"]).await;
    assert_eq!(seeded.payload, b"+OK\r\n");
    let mut clients = Clients {
        store,
        publisher: publisher(server.mqtt),
        device: device(server.mqtt).await,
        wps: wps_client(server.http).await,
    };

    let mut node = tokio::process::Command::new("node");
    node.arg("dashboard.mjs")
        .current_dir(script_dir())
        .env("STATEHUB_URL", format!("http://{}", server.http))
        .env("STATEHUB_ADMIN_KEY", ADMIN_KEY)
        .env("CHROMIUM", &chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = std::env::var_os("STATEHUB_DASHBOARD_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        node.env("SCREENSHOT_DIR", std::fs::canonicalize(dir).unwrap());
    }
    let mut child = node
        .spawn()
        .expect("node (scripts/install-test-deps.sh installs it)");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut s).await;
        s
    });
    let mut transcript = Vec::new();
    let mut result = None;
    let run = async {
        while let Some(line) = stdout.next_line().await.unwrap() {
            transcript.push(line.clone());
            if let Some(rest) = line.strip_prefix("STEP ") {
                let (name, data) = rest.split_once(' ').unwrap_or((rest, "{}"));
                let data: serde_json::Value = serde_json::from_str(data).unwrap();
                let answer = match clients.step(name, &data).await {
                    Ok(()) => "OK".to_owned(),
                    Err(why) => why.replace('\n', " "),
                };
                transcript.push(format!("> {answer}"));
                stdin
                    .write_all(format!("{answer}\n").as_bytes())
                    .await
                    .unwrap();
            } else if let Some(r) = line.strip_prefix("RESULT ") {
                result = Some(serde_json::from_str::<serde_json::Value>(r).unwrap());
            }
        }
        child.wait().await.unwrap()
    };
    let status = timeout(Duration::from_secs(240), run).await;
    let report = format!(
        "--- transcript\n{}\n--- stderr\n{}",
        transcript.join("\n"),
        timeout(Duration::from_secs(5), stderr)
            .await
            .map_or(String::new(), |s| s.unwrap_or_default())
    );
    let status = status.unwrap_or_else(|_| panic!("the browser run took over 240 s\n{report}"));
    let result = result.unwrap_or_else(|| panic!("no RESULT line\n{report}"));
    assert_eq!(result["failed"], serde_json::json!([]), "{report}");
    assert!(status.success(), "{report}");
    assert!(result["passed"].as_u64().unwrap() >= 12, "{report}");
    eprintln!("{result}");
}

/// `GET`/`POST` `path` with an optional bearer key: (status, body).
fn http(addr: SocketAddr, method: &str, path: &str, key: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}

#[test]
fn dashboard_is_off_without_a_key_and_refuses_a_wrong_one() {
    let off = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    for (method, path) in [
        ("GET", "/"),
        ("GET", "/admin/api/overview"),
        ("POST", "/admin/api/clients/disconnect"),
    ] {
        let (status, body) = http(off.http, method, path, Some(ADMIN_KEY));
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert!(
            body.contains("no admin key is configured") && body.contains("--admin-key"),
            "{body}"
        );
    }
    let on = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[("STATEHUB_ADMIN_KEY", ADMIN_KEY)],
    );
    let (status, body) = http(
        on.http,
        "GET",
        "/admin/api/overview",
        Some("dashboard-admin-key-012345678X"),
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    assert_eq!(http(on.http, "GET", "/admin/api/overview", None).0, 401);
    let (status, body) = http(on.http, "GET", "/admin/api/overview", Some(ADMIN_KEY));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"uptime_secs\""), "{body}");
    let (status, page) = http(on.http, "GET", "/", None);
    assert_eq!(status, 200);
    assert!(page.contains("/dashboard/app.js"), "{page}");

    let (exit, log) = common::run_to_exit(&["--admin-key", "short"]);
    assert!(!exit.success());
    assert!(log.contains("at least 16 are required"), "{log}");
}

/// Opens `GET path` with the admin key: the socket once the response head is in, with
/// the head.
async fn open_stream(addr: SocketAddr, path: &str) -> (tokio::net::TcpStream, String) {
    common::admin::open_stream(addr, path, ADMIN_KEY, PATIENCE).await
}

/// A topic-tail viewer that stops reading is dropped once it is `tail_buffer_messages`
/// behind: it finds an `overflow` event at the end of what it was sent, its stream
/// ends, and its place among `max_streams` is free again; while it held the only place,
/// another stream was refused with 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_tail_viewer_is_dropped_with_a_notice_and_streams_are_capped() {
    use tokio::io::AsyncReadExt;
    let config = store_client::config_file(
        "dashboard-limits.toml",
        &format!(
            "[admin]\nkey = \"{ADMIN_KEY}\"\nmax_streams = 1\ntail_buffer_messages = 8\n\
             tail_payload_bytes = 65536\n"
        ),
    );
    let server = common::start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let (mut slow, head) = open_stream(server.http, "/admin/api/tail?filter=flood/%23").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (_, refused) = open_stream(server.http, "/admin/api/store/watch?key=k").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");

    let mut opts = MqttOptions::new("flood", "127.0.0.1", server.mqtt.port());
    opts.set_max_packet_size(Some(1 << 20));
    let (client, mut eventloop) = AsyncClient::new(opts, 64);
    tokio::spawn(async move { while eventloop.poll().await.is_ok() {} });
    // 64 KiB messages until the server says it dropped the viewer: what the viewer's
    // socket buffers hold, plus 8, at most.
    let payload = vec![b'x'; 64 * 1024];
    let mut dropped = false;
    for _ in 0..2000 {
        client
            .publish("flood/1", QoS::AtMostOnce, false, payload.clone())
            .await
            .unwrap();
        while let Ok(line) = server.log.try_recv() {
            dropped |= line.contains("tap dropped: its reader fell behind");
        }
        if dropped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(dropped, "the slow viewer was never dropped");

    // Everything queued before the drop arrives, then the notice and the end.
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    while !seen.ends_with(b"0\r\n\r\n") {
        let n = timeout(PATIENCE, slow.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "closed without the final chunk");
        seen.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("event: overflow"), "no overflow event");
    assert!(text.contains("fell behind and was dropped"));
    let (_, head) = open_stream(server.http, "/admin/api/tail?filter=x").await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "the place was not freed: {head}"
    );
}
