//! What a new user meets first, each error saying what went wrong and where: a port in
//! use (which listener, which address), a data directory that is a file, host names in
//! listen addresses, logs without colour codes off a terminal and as JSON, an invalid
//! environment variable named as such, the Web PubSub routes while it is off, and 401s
//! in JSON.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{connect_tcp, start, wait_exit, BIN};

const LOCAL: [&str; 4] = [
    "--mqtt-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

/// Runs `statehub serve ARGS` with `env` (no colour variable set) to its end.
fn serve_to_exit(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = common::command(args, env);
    cmd.env_remove("NO_COLOR");
    let mut child = cmd.spawn().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    (status.code().unwrap_or(-1), err)
}

fn http(addr: SocketAddr, request: &str) -> String {
    let mut s = connect_tcp(addr);
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn header<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    response.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn body(response: &str) -> serde_json::Value {
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {response}"))
}

#[test]
fn a_port_in_use_names_the_listener_and_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    for (listener, args) in [
        (
            "MQTT",
            ["--mqtt-listen", &addr, "--http-listen", "127.0.0.1:0"],
        ),
        (
            "HTTP",
            ["--mqtt-listen", "127.0.0.1:0", "--http-listen", &addr],
        ),
    ] {
        let (code, err) = serve_to_exit(&args, &[]);
        assert_ne!(code, 0);
        assert!(
            err.contains(&format!("cannot listen for {listener} on {addr}"))
                && err.contains("another process listens there"),
            "{err}"
        );
    }
}

#[test]
fn a_data_dir_that_is_a_file_is_not_a_directory_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data");
    std::fs::write(&file, b"x").unwrap();
    let (code, err) = serve_to_exit(
        &[&LOCAL[..], &["--data-dir", file.to_str().unwrap()]].concat(),
        &[],
    );
    assert_ne!(code, 0);
    assert_eq!(err.matches("is not a directory").count(), 1, "{err}");
    assert!(err.contains(&format!(
        "data directory {} is not a directory",
        file.display()
    )));
}

#[test]
fn listen_addresses_take_host_names() {
    let s = start(
        &[
            "--mqtt-listen",
            "localhost:0",
            "--http-listen",
            "localhost:0",
        ],
        &[],
    );
    assert!(s.mqtt.ip().is_loopback(), "{}", s.mqtt);
    assert!(s.http.ip().is_loopback(), "{}", s.http);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "mqtt_listen = \"localhost:0\"\nhttp_listen = \"localhost:0\"\n",
    )
    .unwrap();
    let s = start(&["--config", config.to_str().unwrap()], &[]);
    assert!(s.mqtt.ip().is_loopback() && s.http.ip().is_loopback());
}

#[test]
fn logs_have_no_colour_codes_off_a_terminal_and_can_be_json() {
    let (_, err) = serve_to_exit(&["--mqtt-listen", "nowhere"], &[]);
    assert!(!err.contains('\u{1b}'), "{err:?}");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (_, err) = serve_to_exit(
        &["--mqtt-listen", &addr, "--http-listen", "127.0.0.1:0"],
        &[],
    );
    assert!(err.contains("ERROR") && !err.contains('\u{1b}'), "{err:?}");

    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "serve"])
        .args(LOCAL)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = 0;
    while seen < 2 {
        let line = lines.next().expect("a log line").unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["fields"]["message"]
            .as_str()
            .unwrap()
            .contains(" listening on ")
        {
            seen += 1;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn an_invalid_environment_variable_is_named() {
    let (code, err) = serve_to_exit(&[], &[("STATEHUB_MQTT_THREADS", "many")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("invalid value 'many' for STATEHUB_MQTT_THREADS (the environment variable of --mqtt-threads)"),
        "{err}"
    );
    let (code, err) = serve_to_exit(&[], &[("STATEHUB_MQTT_LISTEN", "nowhere")]);
    assert_eq!(code, 2);
    assert!(err.contains("STATEHUB_MQTT_LISTEN"), "{err}");
    // The flag, when it is the flag that is wrong, is named as before.
    let (code, err) = serve_to_exit(
        &["--mqtt-threads", "many"],
        &[("STATEHUB_MQTT_THREADS", "2")],
    );
    assert_eq!(code, 2);
    assert!(
        err.contains("'--mqtt-threads <MQTT_THREADS>'") && !err.contains("STATEHUB_"),
        "{err}"
    );
}

#[test]
fn webpubsub_routes_while_it_is_off_say_how_to_turn_it_on() {
    let s = start(&LOCAL, &[]);
    for request in [
        "GET /client/hubs/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "POST /api/hubs/chat/:send?api-version=2024-12-01 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ] {
        let response = http(s.http, request);
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");
        assert_eq!(header(&response, "content-type"), Some("application/json"));
        let message = body(&response)["message"].as_str().unwrap().to_owned();
        assert!(message.contains("--access-key") && message.contains("STATEHUB_ACCESS_KEYS"), "{message}");
    }
}

#[test]
fn unauthorized_answers_are_json() {
    let s = start(
        &[&LOCAL[..], &["--access-key", "change-me-0123456789abcdef"]].concat(),
        &[],
    );
    for request in [
        "GET /client/hubs/chat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        "POST /api/hubs/chat/:send?api-version=2024-12-01 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ] {
        let response = http(s.http, request);
        assert!(response.starts_with("HTTP/1.1 401"), "{response}");
        assert_eq!(header(&response, "content-type"), Some("application/json"), "{response}");
        assert_eq!(body(&response)["code"], "Unauthorized");
    }
}
