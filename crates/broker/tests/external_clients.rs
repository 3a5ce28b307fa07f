//! Interop with real third-party clients: Eclipse Mosquitto's `mosquitto_pub` /
//! `mosquitto_sub` and Eclipse Paho Python 2.x, MQTT 5 and 3.1.1, with properties.
//!
//! The tools come from `scripts/install-test-deps.sh` (Debian mosquitto-clients and
//! a venv with paho-mqtt at <repo>/.venv). A missing tool FAILS the test, naming
//! that script: these tests are never skipped silently.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use statehub_broker::codec::{QoS, ReasonCode};
use statehub_broker::Broker;
use statehub_test_support::*;

const INSTALL: &str =
    "run scripts/install-test-deps.sh (or scripts/test.sh, which runs it) to install it";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn mosquitto(tool: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/local/bin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file());
    found
        .unwrap_or_else(|| panic!("{tool} not found (Debian package mosquitto-clients): {INSTALL}"))
}

fn paho_python() -> PathBuf {
    let candidates = std::env::var_os("VIRTUAL_ENV")
        .map(|v| PathBuf::from(v).join("bin/python"))
        .into_iter()
        .chain([repo_root().join(".venv/bin/python")]);
    for py in candidates {
        if !py.is_file() {
            continue;
        }
        let ok = Command::new(&py)
            .args(["-c", "import paho.mqtt, sys; sys.exit(0 if paho.mqtt.__version__.startswith('2.') else 1)"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return py;
        }
    }
    panic!("no Python with paho-mqtt 2.x in $VIRTUAL_ENV or <repo>/.venv: {INSTALL}");
}

fn paho_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/paho_client.py")
}

/// Runs a started child to completion within `limit` (killing it otherwise).
async fn finish(mut child: std::process::Child, limit: Duration, what: &str) -> Output {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if tokio::time::Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} did not finish within {limit:?}; stdout: {} stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn(cmd: &mut Command) -> std::process::Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

async fn wait_for_subscriptions(broker: &Broker, n: usize) {
    assert!(
        wait_until(Duration::from_secs(6), || broker.subscription_count() >= n).await,
        "external subscriber did not subscribe in time"
    );
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "tool failed: {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn mosquitto_sub(
    addr: std::net::SocketAddr,
    version: &str,
    topic: &str,
    format: &str,
) -> std::process::Child {
    spawn(Command::new(mosquitto("mosquitto_sub")).args([
        "-h",
        "127.0.0.1",
        "-p",
        &addr.port().to_string(),
        "-V",
        version,
        "-q",
        "1",
        "-C",
        "1",
        "-W",
        "8",
        "-t",
        topic,
        "-F",
        format,
    ]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_v5_publish_and_subscribe_with_properties() {
    let (broker, addr) = start_default().await;
    let sub = mosquitto_sub(addr, "mqttv5", "ext/#", "%t|%p|%q|%C|%R|%D|%E|%P");
    wait_for_subscriptions(&broker, 1).await;
    let publ = spawn(Command::new(mosquitto("mosquitto_pub")).args([
        "-h",
        "127.0.0.1",
        "-p",
        &addr.port().to_string(),
        "-V",
        "mqttv5",
        "-q",
        "1",
        "-t",
        "ext/a",
        "-m",
        "hello",
        "-D",
        "publish",
        "user-property",
        "k1",
        "v1",
        "-D",
        "publish",
        "user-property",
        "k1",
        "v2",
        "-D",
        "publish",
        "user-property",
        "a",
        "b",
        "-D",
        "publish",
        "content-type",
        "text/x",
        "-D",
        "publish",
        "response-topic",
        "resp/t",
        "-D",
        "publish",
        "correlation-data",
        "abc",
        "-D",
        "publish",
        "message-expiry-interval",
        "30",
        "-D",
        "publish",
        "payload-format-indicator",
        "1",
    ]));
    stdout(&finish(publ, Duration::from_secs(8), "mosquitto_pub").await);
    let line = stdout(&finish(sub, Duration::from_secs(9), "mosquitto_sub").await);
    let fields: Vec<&str> = line.split('|').collect();
    assert_eq!(fields.len(), 8, "{line}");
    assert_eq!(
        &fields[..6],
        ["ext/a", "hello", "1", "text/x", "resp/t", "abc"],
        "{line}"
    );
    assert!(matches!(fields[6], "29" | "30"), "message expiry: {line}");
    assert_eq!(
        fields[7], "k1:v1 k1:v2 a:b",
        "user properties in order, duplicates kept: {line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_v311_subscriber_gets_a_v5_publish() {
    let (broker, addr) = start_default().await;
    let sub = mosquitto_sub(addr, "mqttv311", "ext3/+", "%t|%p|%q|%r");
    wait_for_subscriptions(&broker, 1).await;
    let publ = spawn(Command::new(mosquitto("mosquitto_pub")).args([
        "-h",
        "127.0.0.1",
        "-p",
        &addr.port().to_string(),
        "-V",
        "mqttv5",
        "-q",
        "2",
        "-t",
        "ext3/x",
        "-m",
        "to v3",
        "-D",
        "publish",
        "user-property",
        "dropped",
        "for v3",
    ]));
    stdout(&finish(publ, Duration::from_secs(8), "mosquitto_pub").await);
    let line = stdout(&finish(sub, Duration::from_secs(9), "mosquitto_sub").await);
    assert_eq!(line, "ext3/x|to v3|1|0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_v311_publish_and_retained_to_v5_subscriber() {
    let (_broker, addr) = start_default().await;
    let publ = spawn(Command::new(mosquitto("mosquitto_pub")).args([
        "-h",
        "127.0.0.1",
        "-p",
        &addr.port().to_string(),
        "-V",
        "mqttv311",
        "-q",
        "1",
        "-r",
        "-t",
        "ext/ret",
        "-m",
        "kept",
    ]));
    stdout(&finish(publ, Duration::from_secs(8), "mosquitto_pub").await);
    let sub = mosquitto_sub(addr, "mqttv5", "ext/ret", "%t|%p|%r");
    let line = stdout(&finish(sub, Duration::from_secs(9), "mosquitto_sub").await);
    assert_eq!(line, "ext/ret|kept|1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_subscriber_gets_every_property() {
    let (broker, addr) = start_default().await;
    let sub = spawn(Command::new(paho_python()).arg(paho_script()).args([
        "127.0.0.1",
        &addr.port().to_string(),
        "5",
        "paho/#",
        "sub",
    ]));
    wait_for_subscriptions(&broker, 1).await;
    let mut publ = RawClient::connect(addr, V5, "to-paho").await;
    let mut p = publish("paho/t", QoS::AtLeastOnce, b"{\"from\":\"rust\"}");
    p.properties = full_properties();
    assert_eq!(publ.publish(p).await, ReasonCode::SUCCESS);
    let out = stdout(&finish(sub, Duration::from_secs(10), "paho subscriber").await);
    for want in [
        r#""topic": "paho/t""#,
        r#""qos": 1"#,
        r#""user": [["k", "1"], ["a", "x"], ["k", "2"], ["k", "1"]]"#,
        r#""content_type": "application/json""#,
        r#""response_topic": "reply/to/me""#,
        r#""correlation": "000102ff""#,
        r#""pfi": 1"#,
    ] {
        assert!(out.contains(want), "missing {want} in paho output: {out}");
    }
    assert!(
        out.contains(r#""expiry": 3600"#) || out.contains(r#""expiry": 3599"#),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v5_publisher_properties_reach_a_v5_subscriber() {
    let (_broker, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "from-paho").await;
    sub.subscribe("paho/#", opts(QoS::AtLeastOnce)).await;
    let publ = spawn(Command::new(paho_python()).arg(paho_script()).args([
        "127.0.0.1",
        &addr.port().to_string(),
        "5",
        "paho/in",
        "pub",
    ]));
    let out = stdout(&finish(publ, Duration::from_secs(10), "paho publisher").await);
    assert!(out.contains(r#""puback": "Success""#), "{out}");
    let got = sub.expect_publish_ack().await;
    assert_eq!(&*got.topic, "paho/in");
    assert_eq!(&got.payload[..], b"{\"from\":\"paho\"}");
    let pr = &got.properties;
    assert_eq!(
        pr.user_properties,
        vec![(bs("k"), bs("1")), (bs("a"), bs("x")), (bs("k"), bs("2"))]
    );
    assert_eq!(pr.content_type.as_deref(), Some("application/json"));
    assert_eq!(pr.response_topic.as_deref(), Some("reply/py"));
    assert_eq!(
        pr.correlation_data,
        Some(Bytes::from_static(b"\x00\x01corr"))
    );
    assert!(pr.payload_format_utf8);
    assert!(matches!(pr.message_expiry_interval, Some(59 | 60)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paho_v311_both_directions() {
    let (broker, addr) = start_default().await;
    let sub = spawn(Command::new(paho_python()).arg(paho_script()).args([
        "127.0.0.1",
        &addr.port().to_string(),
        "3",
        "paho3/#",
        "sub",
    ]));
    wait_for_subscriptions(&broker, 1).await;
    let mut publ = RawClient::connect(addr, V311, "to-paho3").await;
    publ.publish_simple("paho3/t", QoS::ExactlyOnce, b"{\"from\":\"rust\"}")
        .await;
    let out = stdout(&finish(sub, Duration::from_secs(10), "paho v3 subscriber").await);
    assert!(
        out.contains(r#""topic": "paho3/t""#) && out.contains(r#""qos": 1"#),
        "{out}"
    );

    let mut rsub = RawClient::connect(addr, V5, "from-paho3").await;
    rsub.subscribe("paho3/#", opts(QoS::AtLeastOnce)).await;
    let p = spawn(Command::new(paho_python()).arg(paho_script()).args([
        "127.0.0.1",
        &addr.port().to_string(),
        "3",
        "paho3/in",
        "pub",
    ]));
    stdout(&finish(p, Duration::from_secs(10), "paho v3 publisher").await);
    let got = rsub.expect_publish_ack().await;
    assert_eq!(&*got.topic, "paho3/in");
    assert!(got.properties.user_properties.is_empty());
}
