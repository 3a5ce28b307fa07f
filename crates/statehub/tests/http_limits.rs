//! The HTTP listener against a hostile client: partial requests (nothing sent, or one
//! byte at a time) are closed after the header timeout, connections past the cap are
//! refused with 503, and the file-descriptor limit is raised and sizes the caps, so
//! that neither exhausts the process's descriptors: `/healthz` and MQTT CONNECTs are
//! served meanwhile.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{attach, run_to_exit, start, Server, BIN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

const LOCAL: [&str; 4] = [
    "--mqtt-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

fn config_file(name: &str, text: &str) -> std::path::PathBuf {
    let path =
        std::env::temp_dir().join(format!("statehub-test-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

fn start_with(name: &str, config: &str) -> Server {
    let path = config_file(name, config);
    let server = start(
        &[&LOCAL[..], &["--config", path.to_str().unwrap()]].concat(),
        &[],
    );
    let _ = std::fs::remove_file(&path);
    server
}

/// The binary under `ulimit` (e.g. `-n 300`, or `-Sn 200` for the soft limit only).
fn start_under_ulimit(ulimit: &str, config: &str) -> Server {
    let path = config_file(&format!("ulimit{}", ulimit.replace(' ', "")), config);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" serve \"$@\""))
        .arg(BIN)
        .args(LOCAL)
        .args(["--config", path.to_str().unwrap()]);
    for (k, _) in std::env::vars() {
        if k.starts_with("STATEHUB_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let server = attach(cmd.spawn().expect("spawn sh"));
    let _ = std::fs::remove_file(&path);
    server
}

/// `GET /healthz`: the status line, or `None` if the connection failed or closed first.
async fn healthz(addr: SocketAddr) -> Option<String> {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.ok()?;
        let text = String::from_utf8_lossy(&resp).into_owned();
        text.lines().next().map(str::to_owned)
    };
    timeout(Duration::from_secs(10), attempt)
        .await
        .ok()
        .flatten()
}

/// Polls `/healthz` until it answers 200 (max 30 s).
async fn healthz_eventually_ok(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = healthz(addr).await;
        if status.as_deref() == Some("HTTP/1.1 200 OK") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz still answers {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An MQTT 3.1.1 CONNECT answered with CONNACK 0 (max 10 s).
async fn mqtt_connects(addr: SocketAddr) {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01a")
            .await
            .unwrap();
        let mut connack = [0u8; 4];
        s.read_exact(&mut connack).await.unwrap();
        connack
    };
    let connack = timeout(Duration::from_secs(10), attempt)
        .await
        .expect("CONNACK within 10 s");
    assert_eq!(connack, [0x20, 2, 0, 0]);
}

/// Waits until the server closes `s` (EOF or reset), writing one byte of a request
/// head every 100 ms when `trickle`. Returns how long it stayed open.
async fn held_until_closed(mut s: TcpStream, trickle: bool) -> Duration {
    let opened = Instant::now();
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let mut sent = 0;
    let mut buf = [0u8; 256];
    loop {
        tokio::select! {
            read = s.read(&mut buf) => match read {
                Ok(0) | Err(_) => return opened.elapsed(),
                Ok(_) => {}
            },
            () = tokio::time::sleep(Duration::from_millis(100)), if trickle => {
                let byte = head.get(sent).copied().unwrap_or(b'a');
                if s.write_all(&[byte]).await.is_err() {
                    return opened.elapsed();
                }
                sent += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_requests_are_closed_after_the_header_timeout_while_others_are_served() {
    let server = start_with("slowloris", "[http]\nheader_timeout_secs = 2\n");
    let mut held = Vec::new();
    for i in 0..200 {
        let s = TcpStream::connect(server.http).await.unwrap();
        held.push(tokio::spawn(held_until_closed(s, i % 2 == 0)));
    }
    // Meanwhile the server serves everyone else.
    assert_eq!(
        healthz(server.http).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    mqtt_connects(server.mqtt).await;
    for task in held {
        let open = timeout(Duration::from_secs(60), task)
            .await
            .expect("every partial request is closed by the server")
            .unwrap();
        assert!(open >= Duration::from_secs(1), "closed after {open:?}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let logged = std::iter::from_fn(|| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        server.log.recv_timeout(left).ok()
    })
    .any(|l| l.contains("http connections closed by the header timeout"));
    assert!(logged, "the closes are counted in the log");
}

#[test]
fn a_request_timeout_within_the_upstream_timeout_is_refused() {
    let path = config_file("reqtimeout", "[http]\nrequest_timeout_secs = 10\n");
    let (status, err) = run_to_exit(&[&LOCAL[..], &["--config", path.to_str().unwrap()]].concat());
    let _ = std::fs::remove_file(&path);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("request_timeout_secs (10) must exceed"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_503() {
    let server = start_with(
        "cap",
        "[http]\nmax_connections = 20\nheader_timeout_secs = 60\n",
    );
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(TcpStream::connect(server.http).await.unwrap());
    }
    // The 21st is refused at once (if its slot check raced the others' accepts, a
    // later one is); MQTT is not affected.
    let mut refused = None;
    for _ in 0..5 {
        refused = healthz(server.http).await;
        if refused.as_deref() != Some("HTTP/1.1 200 OK") {
            break;
        }
    }
    assert_eq!(refused.as_deref(), Some("HTTP/1.1 503 Service Unavailable"));
    mqtt_connects(server.mqtt).await;
    drop(silent);
    healthz_eventually_ok(server.http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_descriptor_limit_is_raised_to_the_hard_limit() {
    let hard: u64 = {
        let out = Command::new("sh")
            .args(["-c", "ulimit -Hn"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(u64::MAX)
    };
    let server = start_under_ulimit("-Sn 200", "");
    let log = server.startup.join("\n");
    if hard > 200 {
        let shown = if hard == u64::MAX {
            "unlimited".to_owned()
        } else {
            hard.to_string()
        };
        assert!(
            log.contains(&format!(
                "soft limit raised from 200 to the hard limit {shown}"
            )),
            "{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_silent_connections_cannot_exhaust_the_descriptors() {
    let server = start_under_ulimit("-n 300", "[http]\nheader_timeout_secs = 3\n");
    let log = server.startup.join("\n");
    assert!(
        log.contains("file descriptors: limit 300")
            && log.contains("mqtt max_connections 86, http max_connections 86"),
        "{log}"
    );
    // More connections than the process has descriptors.
    let mut silent = Vec::new();
    for _ in 0..320 {
        if let Ok(s) = TcpStream::connect(server.http).await {
            silent.push(s);
        }
    }
    mqtt_connects(server.mqtt).await;
    healthz_eventually_ok(server.http).await;
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_one_byte_at_a_time_gets_408() {
    const KEY: &str = "http-limits-test-key-0123";
    let server = start_with(
        "slowbody",
        &format!(
            "[http]\nrequest_timeout_secs = 2\n\n[webpubsub]\naccess_keys = [\"{KEY}\"]\n\n\
             [webpubsub.limits]\nupstream_timeout_secs = 1\n"
        ),
    );
    let path = "/api/hubs/chat/:send?api-version=2024-12-01";
    let claims = statehub_webpubsub::ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec![],
    };
    let url = format!("http://{}{path}", server.http);
    let token = statehub_webpubsub::issue_token(KEY, &url, &claims, Duration::from_secs(600));
    let mut s = TcpStream::connect(server.http).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: text/plain\r\nContent-Length: 1000\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let trickle = tokio::spawn(async move {
        while wr.write_all(b"x").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut resp = Vec::new();
    let read = timeout(Duration::from_secs(30), rd.read_to_end(&mut resp)).await;
    trickle.abort();
    assert!(read.is_ok(), "the server answers and closes");
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_closed_by_the_idle_timeout() {
    let server = start_with("idle", "[http]\nidle_timeout_secs = 2\n");
    let s = TcpStream::connect(server.http).await.unwrap();
    let (_rd, mut wr) = s.into_split();
    // Pipelined requests whose answers are never read: once the socket buffers are
    // full the server can neither write nor read, and only the idle timeout ends it.
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
    let writer = async { while wr.write_all(&request).await.is_ok() {} };
    timeout(Duration::from_secs(60), writer)
        .await
        .expect("the server closes the connection");
    assert_eq!(
        healthz(server.http).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
}
