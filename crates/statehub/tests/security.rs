//! TLS and authentication of the real binary with real clients: mosquitto_pub/sub
//! (`--cafile`, `--cert/--key`, `-u/-P`), rumqttc over TLS, passwords written by
//! `statehub passwd`, client certificates, tokens as passwords; the refusals each
//! get their documented code; certificates are reloaded on SIGHUP or when their
//! files change without dropping open connections (`security/reload.rs`); TLS older
//! than 1.2 is refused (`security/versions.rs`); start-up errors name the file at
//! fault. Every certificate and
//! key is made by the test (rcgen).

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{Server, BIN};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use statehub_auth::testing::{sat_claims, TestCa, TokenKey};

/// Files the tests point the server and the clients at.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    token_key: TokenKey,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("statehub test CA");
        let server = ca.server();
        let pki = Pki {
            dir,
            ca,
            token_key: TokenKey::es256(),
        };
        pki.write("ca.pem", &pki.ca.cert);
        pki.write("server.crt", &server.cert);
        pki.write("server.key", &server.key);
        pki.write("sa.pub", &pki.token_key.public_pem);
        let device = pki.ca.client("device-7", &[]);
        pki.write("device.crt", &device.cert);
        pki.write("device.key", &device.key);
        let stranger = TestCa::new("unknown CA").client("device-7", &[]);
        pki.write("stranger.crt", &stranger.cert);
        pki.write("stranger.key", &stranger.key);
        passwd(&pki.path("passwd"), "alice", "wonderland", true);
        pki
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn p(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A config with a plain loopback listener (no method: local anonymous only)
    /// and a TLS one taking passwords, tokens and client certificates.
    fn config(&self, extra: &str) -> PathBuf {
        let text = format!(
            r#"
[mqtt]
auth_failure_delay_ms = 100

[[mqtt.listeners]]
address = "127.0.0.1:0"
authentication = []

[[mqtt.listeners]]
address = "127.0.0.1:0"
tls = {{ cert = "{cert}", key = "{key}", client_ca = "{ca}" }}

[authentication]
password_file = "{passwd}"
reload_poll_secs = 1

[authentication.tokens]
keys = ["{sa}"]
audiences = ["statehub"]

[[authentication.x509.attributes]]
subject = "CN = statehub test CA, O = statehub tests"
attributes = {{ site = "lab" }}
{extra}
"#,
            cert = self.p("server.crt"),
            key = self.p("server.key"),
            ca = self.p("ca.pem"),
            passwd = self.p("passwd"),
            sa = self.p("sa.pub"),
        );
        self.write("statehub.toml", &text)
    }
}

/// Runs `statehub passwd` with the password on standard input.
fn passwd(file: &Path, user: &str, password: &str, create: bool) {
    let mut cmd = Command::new(BIN);
    cmd.arg("passwd").args(["-I", "1000"]);
    if create {
        cmd.arg("-c");
    }
    let mut child = cmd
        .arg(file)
        .arg(user)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "statehub passwd: {out:?}");
    let text = std::fs::read_to_string(file).unwrap();
    assert!(!text.contains(password), "the password is not stored");
}

/// The server and its listeners: (plain, TLS).
fn start(config: &Path) -> (Server, SocketAddr, SocketAddr) {
    let server = common::start(
        &[
            "--config",
            config.to_str().unwrap(),
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let tls = listener(&server, true).expect("a TLS listener in the log");
    let plain = listener(&server, false).expect("a plain listener in the log");
    (server, plain, tls)
}

fn listener(server: &Server, tls: bool) -> Option<SocketAddr> {
    server.startup.iter().find_map(|line| {
        let rest = &line[line.find("mqtt listening on ")? + "mqtt listening on ".len()..];
        let mut words = rest.split_whitespace();
        let addr = words.next()?.parse().ok()?;
        ((words.next() == Some("with")) == tls).then_some(addr)
    })
}

fn mosquitto(tool: &str, addr: SocketAddr, args: &[&str]) -> Output {
    Command::new(tool)
        .args(["-h", "localhost", "-p", &addr.port().to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{tool} (Debian package mosquitto-clients): {e}"))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_lowercase()
}

#[test]
fn mosquitto_clients_with_a_password_over_tls() {
    let pki = Pki::new();
    let (_server, _plain, tls) = start(&pki.config(""));
    let ca = pki.p("ca.pem");
    let creds = ["--cafile", ca.as_str(), "-u", "alice", "-P", "wonderland"];
    let publish = mosquitto(
        "mosquitto_pub",
        tls,
        &[
            &creds[..],
            &["-t", "tls/pw", "-m", "hello", "-r", "-q", "1"],
        ]
        .concat(),
    );
    assert!(publish.status.success(), "{}", stderr(&publish));
    let sub = mosquitto(
        "mosquitto_sub",
        tls,
        &[&creds[..], &["-t", "tls/pw", "-C", "1", "-W", "10"]].concat(),
    );
    assert!(sub.status.success(), "{}", stderr(&sub));
    assert_eq!(String::from_utf8_lossy(&sub.stdout).trim(), "hello");

    // Wrong password: CONNACK 0x86 (MQTT 5), return code 4 (3.1.1).
    for version in ["mqttv5", "mqttv311"] {
        let wrong = mosquitto(
            "mosquitto_pub",
            tls,
            &[
                "--cafile", &ca, "-u", "alice", "-P", "guess", "-V", version, "-t", "x", "-m", "y",
            ],
        );
        assert!(!wrong.status.success());
        assert!(
            stderr(&wrong).contains("bad user name or password"),
            "{version}: {}",
            stderr(&wrong)
        );
    }
    // No credentials on the TLS listener: 0x87 / return code 5.
    for version in ["mqttv5", "mqttv311"] {
        let anonymous = mosquitto(
            "mosquitto_pub",
            tls,
            &["--cafile", &ca, "-V", version, "-t", "x", "-m", "y"],
        );
        assert!(!anonymous.status.success());
        assert!(
            stderr(&anonymous).contains("not authori"),
            "{version}: {}",
            stderr(&anonymous)
        );
    }
}

#[test]
fn mutual_tls_clients_and_a_certificate_from_an_unknown_ca() {
    let pki = Pki::new();
    let (_server, _plain, tls) = start(&pki.config(""));
    let (ca, cert, key) = (pki.p("ca.pem"), pki.p("device.crt"), pki.p("device.key"));
    let ok = mosquitto(
        "mosquitto_pub",
        tls,
        &[
            "--cafile", &ca, "--cert", &cert, "--key", &key, "-t", "m/tls", "-m", "x",
        ],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let (cert, key) = (pki.p("stranger.crt"), pki.p("stranger.key"));
    let refused = mosquitto(
        "mosquitto_pub",
        tls,
        &[
            "--cafile", &ca, "--cert", &cert, "--key", &key, "-t", "m/tls", "-m", "x",
        ],
    );
    assert!(
        !refused.status.success(),
        "a certificate from an unknown CA is refused"
    );
}

#[test]
fn a_token_is_accepted_as_a_password_and_a_forged_one_is_not() {
    let pki = Pki::new();
    let (_server, _plain, tls) = start(&pki.config(""));
    let ca = pki.p("ca.pem");
    let token = pki
        .token_key
        .mint(&sat_claims("statehub", "ns", "robot", 600));
    let ok = mosquitto(
        "mosquitto_pub",
        tls,
        &[
            "--cafile", &ca, "-u", "robot", "-P", &token, "-t", "t/token", "-m", "x",
        ],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let cases = [
        (
            "forged",
            TokenKey::es256().mint(&sat_claims("statehub", "ns", "robot", 600)),
        ),
        (
            "expired",
            pki.token_key
                .mint(&sat_claims("statehub", "ns", "robot", -120)),
        ),
        (
            "wrong audience",
            pki.token_key
                .mint(&sat_claims("someone-else", "ns", "robot", 600)),
        ),
    ];
    for (what, token) in cases {
        let out = mosquitto(
            "mosquitto_pub",
            tls,
            &[
                "--cafile", &ca, "-u", "robot", "-P", &token, "-t", "t/token", "-m", "x",
            ],
        );
        assert!(!out.status.success(), "{what}");
        assert!(
            stderr(&out).contains("bad user name or password"),
            "{what}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn the_plain_loopback_listener_keeps_anonymous_local_clients() {
    let pki = Pki::new();
    let (server, plain, _tls) = start(&pki.config(""));
    let out = mosquitto("mosquitto_pub", plain, &["-t", "local/anon", "-m", "x"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("loopback addresses only") && l.contains("--allow-anonymous")),
        "the start-up log says how to open it"
    );
}

fn rumqttc_tls(addr: SocketAddr, id: &str, ca: &str) -> (AsyncClient, rumqttc::EventLoop) {
    let mut opts = MqttOptions::new(id, "localhost", addr.port());
    opts.set_credentials("alice", "wonderland");
    opts.set_transport(Transport::tls_with_config(TlsConfiguration::Simple {
        ca: ca.as_bytes().to_vec(),
        alpn: None,
        client_auth: None,
    }));
    AsyncClient::new(opts, 10)
}

/// Polls the event loop until `pick` accepts an incoming packet, the loop fails or
/// nothing arrives for 30 s (generous: a full parallel run slows TLS handshakes).
async fn until<T>(
    events: &mut rumqttc::EventLoop,
    pick: impl Fn(Packet) -> Option<T>,
) -> Result<T, String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.poll()).await {
            Ok(Ok(Event::Incoming(p))) => {
                if let Some(t) = pick(p) {
                    return Ok(t);
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        }
    }
}

async fn next_publish(events: &mut rumqttc::EventLoop) -> Result<rumqttc::Publish, String> {
    until(events, |p| match p {
        Packet::Publish(p) => Some(p),
        _ => None,
    })
    .await
}

async fn connected(events: &mut rumqttc::EventLoop) -> Result<(), String> {
    until(events, |p| matches!(p, Packet::ConnAck(_)).then_some(())).await
}

/// rumqttc only sends a queued SUBSCRIBE while its event loop is polled, so a test
/// that publishes next must first see the SUBACK.
async fn subscribed(events: &mut rumqttc::EventLoop) -> Result<(), String> {
    until(events, |p| matches!(p, Packet::SubAck(_)).then_some(())).await
}

#[test]
fn start_up_errors_name_the_file_at_fault() {
    let pki = Pki::new();
    let other = pki.ca.server();
    pki.write("other.key", &other.key);
    let cases = [
        ("missing.crt", "server.key", "missing.crt"),
        ("server.crt", "other.key", "does not match"),
        ("server.crt", "server.crt", "no PRIVATE KEY"),
    ];
    for (cert, key, expect) in cases {
        let (status, log) = common::run_to_exit(&[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--mqtts-listen",
            "127.0.0.1:0",
            "--tls-cert",
            &pki.p(cert),
            "--tls-key",
            &pki.p(key),
        ]);
        assert!(!status.success(), "{cert} {key}");
        assert!(log.contains(expect), "{cert} {key}: {log}");
        assert!(
            log.contains(&pki.p(if expect == "missing.crt" { cert } else { key })),
            "{log}"
        );
    }
}

/// Runs the paho script; returns its output lines.
fn paho(tls: SocketAddr, ca: &str, mode: &str, secret: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "run scripts/install-test-deps.sh (paho-mqtt in .venv)"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/paho_tls.py");
    let out = Command::new(python)
        .arg(script)
        .args([&tls.port().to_string(), ca, mode, secret])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", stderr(&out));
    text
}

#[test]
fn paho_over_tls_with_a_k8s_sat_token_and_a_token_password() {
    let pki = Pki::new();
    let (_server, _plain, tls) = start(&pki.config(""));
    let ca = pki.p("ca.pem");
    let token = pki
        .token_key
        .mint(&sat_claims("statehub", "ns", "robot", 600));
    let ok = paho(tls, &ca, "sat", &token);
    assert!(
        ok.contains("CONNACK 0") && ok.contains("ECHO over tls"),
        "{ok}"
    );
    let ok = paho(tls, &ca, "password", &token);
    assert!(
        ok.contains("CONNACK 0") && ok.contains("ECHO over tls"),
        "{ok}"
    );
    // Refused: 0x87 for a bad K8S-SAT token, 0x86 (return code 4) as a password.
    let expired = pki
        .token_key
        .mint(&sat_claims("statehub", "ns", "robot", -120));
    assert!(paho(tls, &ca, "sat", &expired).contains("CONNACK 135"));
    let forged = TokenKey::es256().mint(&sat_claims("statehub", "ns", "robot", 600));
    assert!(paho(tls, &ca, "sat", &forged).contains("CONNACK 135"));
    let wrong_audience = pki
        .token_key
        .mint(&sat_claims("elsewhere", "ns", "robot", 600));
    assert!(paho(tls, &ca, "sat", &wrong_audience).contains("CONNACK 135"));
    assert!(paho(tls, &ca, "password", &forged).contains("CONNACK 134"));
}

#[test]
fn a_password_file_written_by_mosquitto_passwd_is_read_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("passwd");
    let made = Command::new("mosquitto_passwd")
        .args(["-c", "-b", file.to_str().unwrap(), "bob", "builder"])
        .output()
        .expect("mosquitto_passwd (Debian package mosquitto)");
    assert!(made.status.success(), "{}", stderr(&made));
    let server = common::start(
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
    let ok = mosquitto(
        "mosquitto_pub",
        server.mqtt,
        &["-u", "bob", "-P", "builder", "-t", "t", "-m", "m"],
    );
    assert!(ok.status.success(), "{}", stderr(&ok));
    let bad = mosquitto(
        "mosquitto_pub",
        server.mqtt,
        &["-u", "bob", "-P", "build", "-t", "t", "-m", "m"],
    );
    assert!(
        stderr(&bad).contains("bad user name or password"),
        "{}",
        stderr(&bad)
    );
    // With a password file, the plain listener takes no anonymous client, local or not.
    let anonymous = mosquitto("mosquitto_pub", server.mqtt, &["-t", "t", "-m", "m"]);
    assert!(
        stderr(&anonymous).contains("not authori"),
        "{}",
        stderr(&anonymous)
    );
}

#[path = "security/http.rs"]
mod http;
#[path = "security/reauth.rs"]
mod reauth;
#[path = "security/reload.rs"]
mod reload;
#[path = "security/versions.rs"]
mod versions;
