//! Authorization rules in the binary: the `[authorization]` table and rules file,
//! `statehub check-config`, rumqttc (MQTT 5 and 3.1.1) allowed and refused with the
//! documented codes, and SIGHUP reloads (an invalid file keeps the rules in force);
//! state store keys refused as the store refuses them; the built-in protections of
//! the state store's per-client topics, with no rules at all.

mod common;
mod store_client;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{start, BIN};
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason, SubscribeReasonCode};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;

const PATIENCE: Duration = Duration::from_secs(20);

const RULES_YAML: &str = "
apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata: {name: test}
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      - principals:
          clientIds: ['sensor-*']
          attributes: [{floor: '1'}]
        brokerResources:
          - method: Connect
          - method: Publish
            topics: ['telemetry/{principal.clientId}']
          - method: Subscribe
            topics: ['commands/{principal.clientId}/#']
        stateStoreResources:
          - method: ReadWrite
            keys: ['{principal.clientId}/*']
";

/// A directory with `config.toml` naming `rules.yaml`, plus one rule inline: client
/// `watcher` may subscribe to everything.
fn setup(name: &str, rules: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("statehub-authz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("rules.yaml"), rules).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        "[authorization]\nrules_file = \"rules.yaml\"\n\n\
         [[authorization.rules]]\nprincipals = { clientIds = [\"watcher\"] }\n\
         brokerResources = [{ method = \"Connect\" }, { method = \"Subscribe\", topics = [\"#\"] }]\n",
    )
    .unwrap();
    dir
}

fn check_config(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .arg("check-config")
        .args(args)
        .env_remove("STATEHUB_CONFIG")
        .env("NO_COLOR", "1")
        .output()
        .expect("run statehub check-config");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        common::strip_ansi(&String::from_utf8_lossy(&out.stderr)),
    )
}

#[test]
fn check_config_prints_what_a_principal_may_do() {
    let dir = setup("check", RULES_YAML);
    let config = dir.join("config.toml");
    let config = config.to_str().unwrap();
    let (code, out, err) = check_config(&["--config", config, "--client-id", "sensor-7"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("config.toml: valid"), "{out}");
    assert!(
        out.contains("2 rules (1 from [authorization] rules, 1 from"),
        "{out}"
    );
    for line in [
        "connect: allowed",
        "    telemetry/sensor-7\n",
        "    commands/sensor-7/#\n",
        "state store read: GET, KEYNOTIFY, SCAN (keys):\n    glob: sensor-7/*\n",
        "state store write: SET, DEL, VDEL (keys):\n    glob: sensor-7/*\n",
    ] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
    // By attribute, and one whose name would widen a grant gets nothing there.
    let (_, out, _) = check_config(&[
        "--config",
        config,
        "--client-id",
        "x+",
        "--attribute",
        "floor=1",
    ]);
    assert!(
        out.contains("connect: allowed") && out.contains("publish (topic filters): nothing"),
        "{out}"
    );
    let (_, out, _) = check_config(&[
        "--config",
        config,
        "--client-id",
        "laptop",
        "--username",
        "guest",
    ]);
    assert!(out.contains("connect: denied"), "{out}");
}

#[test]
fn check_config_refuses_an_invalid_file() {
    let bad_rule = setup("bad-rule", "- principals: {clientIds: [a]}\n  brokerResources: [{method: Publish, topics: ['a/#/b']}]\n");
    let (code, _, err) =
        check_config(&["--config", bad_rule.join("config.toml").to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains("rule 2 (brokerResources[0])") && err.contains("a/#/b"),
        "{err}"
    );
    // Not only the rules: the whole file is checked as `serve` would.
    let dir = setup("bad-table", RULES_YAML);
    let config = dir.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("[mqtt]\nno_such_setting = 1\n\n{text}")).unwrap();
    let (code, _, err) = check_config(&["--config", config.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no_such_setting"), "{err}");
    let (code, _, err) = check_config(&["--config", dir.join("missing.toml").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
}

/// What a rumqttc client saw.
#[derive(Debug)]
enum Seen {
    ConnAck(rumqttc::v5::mqttbytes::v5::ConnectReturnCode),
    SubAck(Vec<SubscribeReasonCode>),
    PubAck(PubAckReason),
    Publish(Vec<u8>),
    Gone,
}

/// A v5 client whose events come out of the channel. rumqttc ends its connection when
/// a SUBACK or PUBACK refuses; the refusal is reported and the loop reconnects (that
/// CONNACK is not reported).
async fn client(addr: SocketAddr, id: &str) -> (AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    use rumqttc::v5::{ConnectionError, StateError};
    let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(opts, 16);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut connected = false;
        loop {
            let seen = match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) if connected => continue,
                Ok(Event::Incoming(Packet::ConnAck(a))) => {
                    connected = true;
                    Seen::ConnAck(a.code)
                }
                Ok(Event::Incoming(Packet::SubAck(a))) => Seen::SubAck(a.return_codes),
                Ok(Event::Incoming(Packet::PubAck(a))) => Seen::PubAck(a.reason),
                Ok(Event::Incoming(Packet::Publish(p))) => Seen::Publish(p.payload.to_vec()),
                Ok(_) => continue,
                Err(ConnectionError::ConnectionRefused(code)) => Seen::ConnAck(code),
                Err(ConnectionError::MqttState(StateError::SubFail { reason })) => {
                    Seen::SubAck(vec![reason])
                }
                Err(ConnectionError::MqttState(StateError::PubAckFail { reason })) => {
                    Seen::PubAck(reason)
                }
                Err(_) => Seen::Gone,
            };
            let gone = matches!(seen, Seen::Gone | Seen::ConnAck(_)) && !connected;
            if tx.send(seen).is_err() || gone {
                return;
            }
        }
    });
    (client, rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    timeout(PATIENCE, rx.recv())
        .await
        .expect("an event in time")
        .expect("the client's loop")
}

fn hangup(server: &common::Server) {
    let status = Command::new("kill")
        .args(["-HUP", &server.child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

fn await_log(server: &common::Server, needle: &str) {
    let deadline = std::time::Instant::now() + PATIENCE;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match server.log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(_) => break,
        }
    }
    panic!("no log line with {needle:?}");
}

fn serve(dir: &Path) -> common::Server {
    let config = dir.join("config.toml");
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend([
        "--mqtt-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
    ]);
    start(&args, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_allowed_and_refused_then_sighup_reloads() {
    let dir = setup("serve", RULES_YAML);
    let server = serve(&dir);
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("authorization: 2 rules")),
        "{:?}",
        server.startup
    );

    let (laptop, mut laptop_rx) = client(server.mqtt, "laptop").await;
    assert!(matches!(
        next(&mut laptop_rx).await,
        Seen::ConnAck(rumqttc::v5::mqttbytes::v5::ConnectReturnCode::NotAuthorized)
    ));
    drop(laptop);

    let (watcher, mut seen) = client(server.mqtt, "watcher").await;
    assert!(matches!(next(&mut seen).await, Seen::ConnAck(_)));
    watcher.subscribe("#", QoS::AtLeastOnce).await.unwrap();
    assert!(matches!(next(&mut seen).await, Seen::SubAck(_)));

    let (sensor, mut rx) = client(server.mqtt, "sensor-1").await;
    assert!(matches!(
        next(&mut rx).await,
        Seen::ConnAck(rumqttc::v5::mqttbytes::v5::ConnectReturnCode::Success)
    ));

    sensor
        .subscribe("commands/sensor-1/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    // One at a time: rumqttc reports a refused SUBACK as an error that may overtake
    // the events of packets read with it.
    let seen_ok = next(&mut rx).await;
    let Seen::SubAck(ok) = seen_ok else {
        panic!("SUBACK, got {seen_ok:?}")
    };
    assert_eq!(ok, [SubscribeReasonCode::Success(QoS::AtLeastOnce)]);
    sensor
        .subscribe("commands/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    let seen_refused = next(&mut rx).await;
    let Seen::SubAck(refused) = seen_refused else {
        panic!("SUBACK, got {seen_refused:?}")
    };
    assert_eq!(refused, [SubscribeReasonCode::NotAuthorized]);

    sensor
        .publish("telemetry/sensor-2", QoS::AtLeastOnce, false, "forged")
        .await
        .unwrap();
    assert!(matches!(
        next(&mut rx).await,
        Seen::PubAck(PubAckReason::NotAuthorized)
    ));
    sensor
        .publish("telemetry/sensor-1", QoS::AtLeastOnce, false, "ok")
        .await
        .unwrap();
    assert!(matches!(
        next(&mut rx).await,
        Seen::PubAck(PubAckReason::Success)
    ));
    // The refused message reached nobody: the next one is the first the watcher gets.
    assert!(matches!(next(&mut seen).await, Seen::Publish(p) if p == b"ok"));

    // New rules: sensor-1 may now publish on telemetry/sensor-2.
    std::fs::write(
        dir.join("rules.yaml"),
        RULES_YAML.replace("'telemetry/{principal.clientId}'", "'telemetry/#'"),
    )
    .unwrap();
    hangup(&server);
    await_log(&server, "SIGHUP: authorization: 2 rules");
    sensor
        .publish("telemetry/sensor-2", QoS::AtLeastOnce, false, "now ok")
        .await
        .unwrap();
    assert!(matches!(
        next(&mut rx).await,
        Seen::PubAck(PubAckReason::Success)
    ));
    assert!(matches!(next(&mut seen).await, Seen::Publish(p) if p == b"now ok"));

    // An invalid file keeps the rules in force.
    std::fs::write(dir.join("rules.yaml"), "- principals: {}\n").unwrap();
    hangup(&server);
    await_log(&server, "the rules in force stay");
    sensor
        .publish("telemetry/sensor-2", QoS::AtLeastOnce, false, "still ok")
        .await
        .unwrap();
    assert!(matches!(
        next(&mut rx).await,
        Seen::PubAck(PubAckReason::Success)
    ));
    assert!(matches!(next(&mut seen).await, Seen::Publish(p) if p == b"still ok"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rumqttc_3_1_1_refusals() {
    use rumqttc::{
        AsyncClient, ConnectReturnCode, Event, MqttOptions, Packet, QoS, SubscribeReasonCode,
    };
    let dir = setup("v311", RULES_YAML);
    let server = serve(&dir);
    let opts = |id: &str| {
        let mut o = MqttOptions::new(id, server.mqtt.ip().to_string(), server.mqtt.port());
        o.set_keep_alive(Duration::from_secs(30));
        o
    };
    let (_laptop, mut eventloop) = AsyncClient::new(opts("laptop"), 16);
    match timeout(PATIENCE, eventloop.poll()).await.unwrap() {
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => {
            assert_eq!(code, ConnectReturnCode::NotAuthorized)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let (watcher, mut seen) = client(server.mqtt, "watcher").await;
    assert!(matches!(next(&mut seen).await, Seen::ConnAck(_)));
    watcher
        .subscribe("#", rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await
        .unwrap();
    assert!(matches!(next(&mut seen).await, Seen::SubAck(_)));
    let (sensor, mut eventloop) = AsyncClient::new(opts("sensor-1"), 16);
    sensor
        .subscribe("commands/#", QoS::AtLeastOnce)
        .await
        .unwrap();
    // 3.1.1: a refused PUBLISH is acknowledged as usual and dropped.
    sensor
        .publish("telemetry/sensor-2", QoS::AtLeastOnce, false, "forged")
        .await
        .unwrap();
    let (mut suback, mut puback) = (None, false);
    while suback.is_none() || !puback {
        match timeout(PATIENCE, eventloop.poll()).await.unwrap().unwrap() {
            Event::Incoming(Packet::SubAck(a)) => suback = Some(a.return_codes),
            Event::Incoming(Packet::PubAck(_)) => puback = true,
            _ => {}
        }
    }
    assert_eq!(suback.unwrap(), [SubscribeReasonCode::Failure]);
    sensor
        .publish("telemetry/sensor-1", QoS::AtLeastOnce, false, "ok")
        .await
        .unwrap();
    loop {
        let event = timeout(PATIENCE, eventloop.poll()).await.unwrap().unwrap();
        if matches!(event, Event::Incoming(Packet::PubAck(_))) {
            break;
        }
    }
    // The dropped message reached nobody: the next one is the first the watcher gets.
    assert!(matches!(next(&mut seen).await, Seen::Publish(p) if p == b"ok"));
}

fn mosquitto(tool: &str, addr: SocketAddr, args: &[&str]) -> (i32, String) {
    let out = Command::new(tool)
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string(), "-V", "5"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{tool} (Debian package mosquitto-clients): {e}"));
    let text = String::from_utf8_lossy(&out.stderr).to_lowercase();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn mosquitto_clients_get_the_documented_refusals() {
    let dir = setup("mosquitto", RULES_YAML);
    let server = serve(&dir);
    let (code, err) = mosquitto(
        "mosquitto_pub",
        server.mqtt,
        &["-i", "laptop", "-t", "t", "-m", "m"],
    );
    assert!(code != 0 && err.contains("not authorized"), "{code} {err}");
    let forged = [
        "-i",
        "sensor-1",
        "-q",
        "1",
        "-t",
        "telemetry/sensor-2",
        "-m",
        "m",
    ];
    let (_, err) = mosquitto("mosquitto_pub", server.mqtt, &forged);
    assert!(err.contains("publish 1 failed: not authorized"), "{err}");
    let own = [
        "-i",
        "sensor-1",
        "-q",
        "1",
        "-t",
        "telemetry/sensor-1",
        "-m",
        "m",
    ];
    let (code, err) = mosquitto("mosquitto_pub", server.mqtt, &own);
    assert!(code == 0 && err.is_empty(), "{code} {err}");
    let wide = ["-i", "sensor-1", "-t", "commands/#", "-W", "20"];
    let (_, err) = mosquitto("mosquitto_sub", server.mqtt, &wide);
    assert!(
        err.contains("all subscription requests were denied"),
        "{err}"
    );
}

const STORE: &str = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";
const NOT_AUTHORIZED: &[u8] = b"-ERR not authorized\r\n";

/// What a state store client needs, and keys under its own id plus one read-only key.
const STORE_RULES: &str = "
- principals: {clientIds: ['app-*']}
  brokerResources:
    - {method: Connect}
    - {method: Publish, topics: ['statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke']}
    - {method: Subscribe, topics: ['clients/{principal.clientId}/#']}
  stateStoreResources:
    - {method: ReadWrite, keys: ['{principal.clientId}/*']}
    - {method: Read, keyType: String, keys: [shared]}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_key_gets_the_stores_not_authorized_refusal() {
    use store_client::StoreClient;
    let dir = setup("store", STORE_RULES);
    let server = serve(&dir);
    let mut a = StoreClient::connect(server.mqtt, "app-a").await;
    let mut b = StoreClient::connect(server.mqtt, "app-b").await;
    assert_eq!(
        b.call(&[b"KEYNOTIFY", b"app-b/k"]).await.payload,
        b"+OK\r\n"
    );
    assert_eq!(
        a.call(&[b"SET", b"app-a/k", b"v"]).await.payload,
        b"+OK\r\n"
    );
    assert_eq!(a.call(&[b"GET", b"app-a/k"]).await.payload, b"$1\r\nv\r\n");
    assert_ne!(a.call(&[b"GET", b"shared"]).await.payload, NOT_AUTHORIZED);
    let refused: [&[&[u8]]; 6] = [
        &[b"SET", b"app-b/k", b"forged"],
        &[b"DEL", b"app-b/k"],
        &[b"VDEL", b"app-b/k", b"v"],
        &[b"GET", b"app-b/k"],
        &[b"KEYNOTIFY", b"app-b/k"],
        &[b"SET", b"shared", b"x"],
    ];
    for args in refused {
        assert_eq!(a.call(args).await.payload, NOT_AUTHORIZED, "{args:?}");
    }
    // Nothing changed and nothing was notified: b's first notification is its own SET.
    assert_eq!(b.call(&[b"GET", b"app-b/k"]).await.payload, b"$-1\r\n");
    assert_eq!(
        b.call(&[b"SET", b"app-b/k", b"mine"]).await.payload,
        b"+OK\r\n"
    );
    let first = b.notification(PATIENCE).await.expect("a notification");
    assert!(
        !first.payload.windows(6).any(|w| w == b"forged"),
        "{first:?}"
    );
    assert!(first.payload.windows(4).any(|w| w == b"mine"), "{first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rules_the_store_topics_of_another_client_are_refused() {
    use store_client::{StoreClient, LOCAL};
    let server = start(&LOCAL, &[]);
    let mut victim = StoreClient::connect(server.mqtt, "victim").await;
    assert_eq!(victim.call(&[b"KEYNOTIFY", b"k"]).await.payload, b"+OK\r\n");
    let (attacker, mut rx) = client(server.mqtt, "attacker").await;
    assert!(matches!(next(&mut rx).await, Seen::ConnAck(_)));
    let victim_hex = "76696374696D";
    let notify = format!("clients/statestore/v1/{STORE}/{victim_hex}/command/notify/6B");
    let response = format!("clients/victim/services/statestore/v1/{STORE}/command/invoke/response");
    let theirs = [
        format!("clients/statestore/v1/{STORE}/{victim_hex}/#"),
        response.clone(),
    ];
    for filter in theirs {
        attacker
            .subscribe(filter.clone(), QoS::AtLeastOnce)
            .await
            .unwrap();
        let seen = next(&mut rx).await;
        assert!(
            matches!(&seen, Seen::SubAck(c) if c == &[SubscribeReasonCode::NotAuthorized]),
            "{filter}: {seen:?}"
        );
    }
    for topic in [notify.as_str(), response.as_str(), "$SYS/forged"] {
        attacker
            .publish(topic, QoS::AtLeastOnce, false, "forged")
            .await
            .unwrap();
        let seen = next(&mut rx).await;
        assert!(
            matches!(seen, Seen::PubAck(PubAckReason::NotAuthorized)),
            "{topic}: {seen:?}"
        );
    }
    // Wildcards are allowed, but deliver nothing of another client's store traffic.
    attacker.subscribe("#", QoS::AtLeastOnce).await.unwrap();
    assert!(matches!(next(&mut rx).await, Seen::SubAck(_)));
    assert_eq!(victim.call(&[b"SET", b"k", b"v"]).await.payload, b"+OK\r\n");
    let first = victim
        .notification(PATIENCE)
        .await
        .expect("the notification");
    assert!(
        !first.payload.windows(6).any(|w| w == b"forged"),
        "{first:?}"
    );
    attacker
        .publish("marker", QoS::AtLeastOnce, false, "marker")
        .await
        .unwrap();
    loop {
        match next(&mut rx).await {
            Seen::PubAck(PubAckReason::Success) => {}
            Seen::Publish(p) => {
                assert_eq!(p, b"marker", "the attacker got another client's message");
                break;
            }
            other => panic!("{other:?}"),
        }
    }
}
