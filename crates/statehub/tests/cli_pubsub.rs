//! `statehub pub`, `sub` and `token` against a running statehub, and the connection
//! options: `STATEHUB_URL`, a refused connection (exit 4), a server that never
//! answers (exit 5), usage errors (exit 2).

mod cli_support;
mod common;

use std::net::TcpListener;

use cli_support::{cli, command, run, server, spawn, PATIENCE};
use futures_util::StreamExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

const KEY: &str = "cli-test-access-key-0123456789";

#[test]
fn pub_sub_round_trip_at_qos_1_with_properties() {
    let s = server(&[]);
    let a = s.mqtt;
    let mut sub = spawn(
        a,
        &["sub", "-t", "cli/#", "-q", "1", "-C", "2", "--json", "-d"],
    );
    sub.wait_for("subscribed to cli/#");
    cli(
        a,
        &[
            "pub",
            "-t",
            "cli/a",
            "-m",
            "hello",
            "-q",
            "1",
            "-D",
            "k1=v1",
            "--user-property",
            "k2=v=2",
            "-D",
            "k1=again",
            "--response-topic",
            "cli/reply",
            "--correlation-data",
            "c-1",
            "--message-expiry",
            "600",
            "--content-type",
            "text/plain",
        ],
    )
    .expect(0);
    cli(a, &["pub", "-t", "cli/b", "-m", "second", "-q", "2"]).expect(0);
    let done = sub.finish().expect(0);
    let msgs = done.json_lines();
    assert_eq!(msgs.len(), 2, "{done:?}");
    let first = &msgs[0];
    assert_eq!(first["topic"], "cli/a");
    assert_eq!(first["payload"], "hello");
    assert_eq!(first["qos"], 1);
    assert_eq!(first["retain"], false);
    assert_eq!(
        first["user_properties"],
        json!([["k1", "v1"], ["k2", "v=2"], ["k1", "again"]])
    );
    assert_eq!(first["response_topic"], "cli/reply");
    assert_eq!(first["correlation_data"], "c-1");
    assert_eq!(first["content_type"], "text/plain");
    let expiry = first["message_expiry_interval"].as_u64().unwrap();
    assert!((1..=600).contains(&expiry), "{first}");
    assert_eq!(msgs[1]["topic"], "cli/b");
    assert_eq!(msgs[1]["payload"], "second");
    assert_eq!(msgs[1]["qos"], 1, "granted QoS 1 caps the delivery");
}

#[test]
fn sub_text_output_like_mosquitto_sub() {
    let s = server(&[]);
    let a = s.mqtt;
    let mut sub = spawn(a, &["sub", "-t", "t/+", "-v", "-q", "2", "-d"]);
    sub.wait_for("subscribed");
    let mut publish = command(
        &[
            "pub",
            "-t",
            "t/1",
            "-l",
            "-q",
            "2",
            "-h",
            "127.0.0.1",
            "-p",
            &a.port().to_string(),
        ],
        &[],
    );
    publish.current_dir(std::env::temp_dir());
    run(publish, Some(b"line one\nbin\xff\n")).expect(0);
    assert_eq!(sub.next_line(), "t/1 line one\n");
    assert_eq!(sub.next_line(), "t/1 bin\\xff\n");
    sub.signal("TERM");
    sub.finish().expect(0);
}

#[test]
fn retained_messages_and_no_retained() {
    let s = server(&[]);
    let a = s.mqtt;
    cli(a, &["pub", "-t", "r/t", "-m", "kept", "-r", "-q", "1"]).expect(0);
    let got = cli(a, &["sub", "-t", "r/t", "-C", "1", "--json"])
        .expect(0)
        .json();
    assert_eq!(got["payload"], "kept");
    assert_eq!(got["retain"], true);
    let raw = cli(a, &["sub", "-t", "r/#", "-C", "1", "--raw"]).expect(0);
    assert_eq!(raw.stdout, b"kept");
    // -R skips it: nothing else comes within the wait.
    cli(a, &["sub", "-t", "r/t", "-R", "-C", "1", "-W", "1"]).expect(5);
}

#[test]
fn token_url_is_accepted_by_the_server() {
    let s = server(&["--access-key", KEY]);
    let endpoint = format!("Endpoint=http://{};AccessKey={KEY};Version=1.0;", s.http);
    let mut token = command(
        &[
            "token",
            "--hub",
            "chat",
            "--user",
            "alice",
            "--role",
            "webpubsub.joinLeaveGroup",
            "--role",
            "webpubsub.sendToGroup",
            "--group",
            "g1",
            "--expires-in",
            "10m",
        ],
        &[("STATEHUB_CONNECTION_STRING", &endpoint)],
    );
    token.current_dir(std::env::temp_dir());
    let url = run(token, None).expect(0).text().trim().to_owned();
    assert!(
        url.starts_with(&format!("ws://{}/client/hubs/chat?access_token=", s.http)),
        "{url}"
    );
    let connected = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut req = url.as_str().into_client_request().unwrap();
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("json.webpubsub.azure.v1"),
        );
        let (mut ws, _) = tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
            .await
            .unwrap()
            .expect("the server accepts the minted URL");
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => serde_json::from_str::<serde_json::Value>(&t).unwrap(),
            other => panic!("expected the connected message, got {other:?}"),
        }
    });
    assert_eq!(connected["event"], "connected");
    assert_eq!(connected["userId"], "alice");

    // Signed with another key: refused.
    let wrong = format!(
        "Endpoint=http://{};AccessKey=another-key-0123456789;",
        s.http
    );
    let json = run(
        command(
            &[
                "token",
                "--hub",
                "chat",
                "--connection-string",
                &wrong,
                "--json",
            ],
            &[],
        ),
        None,
    )
    .expect(0)
    .json();
    let refused = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let req = json["url"].as_str().unwrap().into_client_request().unwrap();
        tokio_tungstenite::connect_async(req).await
    });
    assert!(refused.is_err(), "a token of another key is refused");
    run(command(&["token", "--hub", "chat"], &[]), None).expect(2);
    let bad = run(
        command(
            &["token", "--hub", "c", "--connection-string", "AccessKey=k"],
            &[],
        ),
        None,
    );
    assert!(bad.expect(2).stderr.contains("Endpoint"));
}

#[test]
fn statehub_url_environment_variable() {
    let s = server(&[]);
    let url = format!("mqtt://user:pass@{}", s.mqtt);
    let env = [("STATEHUB_URL", url.as_str())];
    run(command(&["kv", "set", "env", "works"], &env), None).expect(0);
    let got = run(command(&["kv", "get", "env"], &env), None).expect(0);
    assert_eq!(got.text(), "works\n");
    // Flags win over the URL: a port nobody listens on.
    let closed = free_port();
    run(
        command(&["kv", "get", "env", "-p", &closed.to_string()], &env),
        None,
    )
    .expect(4);
    let tls = run(
        command(&["kv", "get", "env"], &[("STATEHUB_URL", "mqtts://h")]),
        None,
    );
    assert!(tls.expect(2).stderr.contains("TLS"));
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn connection_refused_is_exit_4() {
    let port = free_port().to_string();
    for args in [
        &["kv", "get", "k"][..],
        &["pub", "-t", "t", "-m", "x"],
        &["sub", "-t", "t"],
    ] {
        let mut all = args.to_vec();
        all.extend(["-h", "127.0.0.1", "-p", &port]);
        let r = run(command(&all, &[]), None).expect(4);
        assert!(r.stderr.contains("cannot connect to 127.0.0.1:"), "{r:?}");
    }
}

#[test]
fn a_server_that_never_answers_is_exit_5() {
    // Accepts the TCP connection and never sends CONNACK.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port().to_string();
    let r = run(
        command(
            &[
                "kv",
                "get",
                "k",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "--timeout",
                "1",
            ],
            &[],
        ),
        None,
    )
    .expect(5);
    assert!(r.stderr.contains("timed out"), "{r:?}");
    drop(silent);
}

#[test]
fn usage_errors_are_exit_2() {
    for args in [
        &["kv", "get"][..],
        &["kv", "frob", "k"],
        &["kv", "set", "k"],
        &["pub", "-t", "t"],
        &["pub", "-t", "t", "-m", "x", "-q", "3"],
        &["pub", "-t", "t", "-m", "x", "-D", "novalue"],
        &["sub"],
        &["kv", "get", "k", "-L", "http://h"],
        &["kv", "set", "k", "-f", "/nonexistent/file"],
    ] {
        let r = run(command(args, &[]), None);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
    }
    // --help works (and -h is the host).
    let help = run(command(&["kv", "get", "--help"], &[]), None).expect(0);
    assert!(help.text().contains("-h, --host"), "{help:?}");
}
