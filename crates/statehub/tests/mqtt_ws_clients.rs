//! Real MQTT clients over WebSocket against the binary: MQTT.js (Node.js, the `mqtt`
//! package of `tests/mqtt-ws/`) and paho-mqtt's websockets transport (Python, `.venv`),
//! each with QoS 0/1/2, a retained message, a TCP client exchanging messages with a
//! WebSocket one, and a session taken over from TCP to WebSocket; each over `ws://` and
//! over `wss://` (an HTTPS listener with a test CA made here by rcgen; a client that
//! does not trust it is refused). The TCP side is rumqttc here for MQTT.js, paho itself
//! for paho. `scripts/install-test-deps.sh` installs both clients.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{start, Server};
use rumqttc::v5::mqttbytes::v5::{ConnectProperties, Disconnect, DisconnectReasonCode, Packet};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};
use statehub_auth::testing::TestCa;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Generous: a loaded machine runs everything several times slower.
const WAIT: Duration = Duration::from_secs(120);

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/mqtt-ws")
}

fn start_local() -> Server {
    let args = [
        "--mqtt-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ];
    start(&args, &[])
}

/// An HTTPS listener's certificate (for `localhost` and 127.0.0.1) and its CA, in files.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("statehub test CA");
        let server = ca.server();
        std::fs::write(dir.path().join("ca.pem"), &ca.cert).unwrap();
        std::fs::write(dir.path().join("server.crt"), &server.cert).unwrap();
        std::fs::write(dir.path().join("server.key"), &server.key).unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The binary with its HTTP listener over TLS (`wss://`).
    fn start(&self) -> Server {
        let (cert, key) = (self.path("server.crt"), self.path("server.key"));
        let args = [
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--http-tls",
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        start(&args, &[])
    }
}

/// A script's process and its stdout, line by line.
struct Script {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Script {
    fn spawn(program: &Path, args: &[&str]) -> Script {
        Script::spawn_with(program, args, &[])
    }

    fn spawn_with(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Script {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(scripts())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Script {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line starting with `READY ` or `RESULT `.
    fn next(&mut self) -> String {
        loop {
            let line = self.lines.recv_timeout(WAIT).unwrap_or_else(|_| {
                let _ = self.child.kill();
                panic!(
                    "script silent for {WAIT:?}; output:\n{}",
                    self.seen.join("\n")
                )
            });
            self.seen.push(line.clone());
            if line.starts_with("READY ") || line.starts_with("RESULT ") {
                return line;
            }
        }
    }

    fn expect_ready(&mut self, step: &str) {
        let line = self.next();
        assert_eq!(line, format!("READY {step}"), "{}", self.seen.join("\n"));
    }

    fn go(&mut self, step: &str) {
        writeln!(self.stdin, "GO {step}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Checks the script's `RESULT` line and exit status.
    fn finish(mut self) {
        let line = self.next();
        let result = line.strip_prefix("RESULT ").unwrap_or_else(|| {
            panic!("expected RESULT: {}", self.seen.join("\n"));
        });
        let result: serde_json::Value = serde_json::from_str(result).unwrap();
        let status = self.child.wait().unwrap();
        let output = self.seen.join("\n");
        assert_eq!(result["failed"], serde_json::json!([]), "{output}");
        assert!(status.success(), "{status}: {output}");
        assert!(result["passed"].as_u64().unwrap_or(0) > 0, "{output}");
        eprintln!("{result}");
    }
}

/// A rumqttc v5 client over TCP; its event loop runs on a task that forwards the
/// packets it receives (a DISCONNECT from the server too) and stops at the first error.
async fn tcp_client(
    server: &Server,
    id: &str,
    persistent: bool,
) -> (AsyncClient, UnboundedReceiver<Packet>) {
    let mut options = MqttOptions::new(id, "127.0.0.1", server.mqtt.port());
    options.set_keep_alive(Duration::from_secs(60));
    if persistent {
        options.set_clean_start(false);
        options.set_connect_properties(ConnectProperties {
            session_expiry_interval: Some(300),
            ..Default::default()
        });
    }
    let (client, eventloop) = AsyncClient::new(options, 64);
    let (tx, rx) = unbounded_channel();
    tokio::spawn(forward(eventloop, tx));
    (client, rx)
}

async fn forward(mut eventloop: EventLoop, tx: UnboundedSender<Packet>) {
    loop {
        // Never polled after an error: rumqttc would reconnect and take the session back.
        let packet = match eventloop.poll().await {
            Ok(Event::Incoming(packet)) => packet,
            Ok(Event::Outgoing(_)) => continue,
            Err(ConnectionError::MqttState(StateError::ServerDisconnect {
                reason_code, ..
            })) => {
                let _ = tx.send(Packet::Disconnect(Disconnect::new(reason_code)));
                return;
            }
            Err(_) => return,
        };
        if tx.send(packet).is_err() {
            return;
        }
    }
}

/// Waits for the first event `want` accepts.
async fn until<T>(
    events: &mut UnboundedReceiver<Packet>,
    what: &str,
    want: impl Fn(&Packet) -> Option<T>,
) -> T {
    let wait = async {
        loop {
            match events.recv().await {
                Some(p) => {
                    if let Some(found) = want(&p) {
                        return found;
                    }
                }
                None => panic!("the connection ended before {what}"),
            }
        }
    };
    tokio::time::timeout(WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqttjs_over_websocket_with_a_rumqttc_peer_over_tcp() {
    let server = start_local();
    let url = format!("ws://{}/mqtt", server.http);
    let script = Script::spawn(Path::new("node"), &["mqttjs.mjs", &url]);
    mqttjs_with_a_tcp_peer(&server, script).await;
}

/// MQTT.js over `wss://`, trusting the test CA (`NODE_EXTRA_CA_CERTS`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqttjs_over_secure_websocket_with_a_rumqttc_peer_over_tcp() {
    let pki = Pki::new();
    let server = pki.start();
    let url = format!("wss://127.0.0.1:{}/mqtt", server.http.port());
    let ca = pki.path("ca.pem");
    let env = [("NODE_EXTRA_CA_CERTS", ca.as_str())];
    let script = Script::spawn_with(Path::new("node"), &["mqttjs.mjs", &url], &env);
    mqttjs_with_a_tcp_peer(&server, script).await;
}

/// MQTT.js without the test CA: the TLS handshake fails, no CONNECT is sent.
#[test]
fn mqttjs_refuses_a_wss_server_it_does_not_trust() {
    let pki = Pki::new();
    let server = pki.start();
    let url = format!("wss://127.0.0.1:{}/mqtt", server.http.port());
    let script = "import mqtt from 'mqtt';\n\
        const c = mqtt.connect(process.argv[1], { reconnectPeriod: 0, connectTimeout: 30000 });\n\
        c.on('connect', () => { console.log('CONNECTED'); process.exit(0); });\n\
        c.on('error', (e) => { console.log('ERROR ' + e.code); process.exit(0); });";
    let out = Command::new("node")
        .args(["--input-type=module", "-e", script, &url])
        .current_dir(scripts())
        .env_remove("NODE_EXTRA_CA_CERTS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let detail = String::from_utf8_lossy(&out.stderr);
    // UNABLE_TO_VERIFY_LEAF_SIGNATURE, or another verification failure.
    let untrusted = ["CERT", "VERIFY", "SIGNATURE"]
        .iter()
        .any(|code| text.contains(code));
    assert!(text.starts_with("ERROR ") && untrusted, "{text} {detail}");
}

async fn mqttjs_with_a_tcp_peer(server: &Server, mut script: Script) {
    let dir = scripts();
    assert!(
        dir.join("node_modules/mqtt").is_dir(),
        "MQTT.js is not installed in {}: run scripts/install-test-deps.sh",
        dir.display()
    );

    let (tcp, mut tcp_events) = tcp_client(server, "tcp-peer", false).await;
    until(&mut tcp_events, "CONNACK", |p| {
        matches!(p, Packet::ConnAck(_)).then_some(())
    })
    .await;
    tcp.subscribe("cross/fromws", QoS::AtLeastOnce)
        .await
        .unwrap();
    until(&mut tcp_events, "SUBACK", |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;
    script.expect_ready("cross");
    tcp.publish("cross/fromtcp", QoS::AtLeastOnce, false, "hello ws")
        .await
        .unwrap();
    script.go("cross");
    let payload = until(&mut tcp_events, "cross/fromws", |p| match p {
        Packet::Publish(p) if p.topic == "cross/fromws" => Some(p.payload.clone()),
        _ => None,
    })
    .await;
    assert_eq!(&payload[..], b"hello tcp");

    let (moved, mut moved_events) = tcp_client(server, "moved", true).await;
    until(&mut moved_events, "CONNACK", |p| {
        matches!(p, Packet::ConnAck(_)).then_some(())
    })
    .await;
    moved.subscribe("moved/#", QoS::AtLeastOnce).await.unwrap();
    until(&mut moved_events, "SUBACK", |p| {
        matches!(p, Packet::SubAck(_)).then_some(())
    })
    .await;
    script.expect_ready("takeover");
    script.go("takeover");
    let reason = until(&mut moved_events, "DISCONNECT", |p| match p {
        Packet::Disconnect(d) => Some(d.reason_code),
        _ => None,
    })
    .await;
    assert_eq!(reason, DisconnectReasonCode::SessionTakenOver);
    tokio::task::spawn_blocking(move || script.finish())
        .await
        .unwrap();
}

fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        python.display()
    );
    python
}

#[test]
fn paho_over_websocket_with_paho_over_tcp() {
    let server = start_local();
    let http = server.http.to_string();
    let mqtt = server.mqtt.to_string();
    let script = Script::spawn(&python(), &["paho_ws.py", &http, &mqtt]);
    script.finish();
}

/// paho's websockets transport over TLS (`tls_set` with the test CA).
#[test]
fn paho_over_secure_websocket_with_paho_over_tcp() {
    let pki = Pki::new();
    let server = pki.start();
    let http = server.http.to_string();
    let mqtt = server.mqtt.to_string();
    let ca = pki.path("ca.pem");
    let script = Script::spawn(&python(), &["paho_ws.py", &http, &mqtt, &ca]);
    script.finish();
}
