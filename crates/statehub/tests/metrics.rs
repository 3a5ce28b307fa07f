//! `/metrics`, `/healthz` and `/readyz` against the binary: counts that move with real
//! MQTT, state store and Web PubSub traffic, a refused connection under its reason, and
//! docs/metrics.md held to the real scrape (every documented metric exposed, every
//! exposed metric documented, with the same type and labels).

mod common;
mod store_client;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use common::{start, Server};
use statehub_test_support::{connect_packet, publish, RawClient, V5};
use store_client::StoreClient;

const KEY: &str = "metrics-test-access-key-0123456789abcdef";

/// The binary with every layer on: a data directory and Web PubSub.
fn start_full(dir: &std::path::Path) -> Server {
    let config = dir.join("statehub.toml");
    std::fs::write(&config, format!("[webpubsub]\naccess_keys = [\"{KEY}\"]\n")).unwrap();
    let data = dir.join("data");
    start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    )
}

/// (status code, body) of a GET.
fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let out = common::http_get(addr, path);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned());
    (status, body.unwrap_or_default())
}

/// A scrape: every sample by `name{labels}` as written, and every family's type.
struct Scrape {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
    text: String,
}

impl Scrape {
    fn take(server: &Server) -> Scrape {
        let (status, text) = http_get(server.http, "/metrics");
        assert_eq!(status, 200, "{text}");
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
        let (samples, types) = common::parse_metrics(&text);
        Scrape {
            samples,
            types,
            text,
        }
    }

    /// The value of one sample (`name` or `name{k="v",...}`); 0 if absent (a refusal
    /// reason not seen yet is not listed).
    fn get(&self, sample: &str) -> f64 {
        self.samples.get(sample).copied().unwrap_or(0.0)
    }

    /// Label names of a family's samples (`le` left out).
    fn labels(&self, family: &str) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for sample in self.samples.keys() {
            let (name, labels) = sample.split_once('{').unwrap_or((sample, ""));
            let base = ["_total", "_bucket", "_sum", "_count", "_created"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            if base != family && name != family {
                continue;
            }
            for pair in labels.trim_end_matches('}').split(',') {
                if let Some((k, _)) = pair.split_once('=') {
                    if k != "le" {
                        keys.insert(k.to_owned());
                    }
                }
            }
        }
        keys
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_move_with_real_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_full(dir.path());
    let before = Scrape::take(&server);

    // N QoS 1 PUBLISHes: N packets in, N PUBACKs out, N messages routed.
    const N: usize = 7;
    let mut client = RawClient::connect(server.mqtt, V5, "metrics-publisher").await;
    for i in 0..N {
        let p = publish("metrics/t", statehub_broker::codec::QoS::AtLeastOnce, b"x");
        assert!(client.publish(p).await.is_success(), "publish {i}");
    }
    let mqtt = Scrape::take(&server);
    let delta = |s: &Scrape, name: &str| s.get(name) - before.get(name);
    let n = N as f64;
    assert_eq!(
        delta(
            &mqtt,
            r#"statehub_mqtt_packets_received_total{type="publish"}"#
        ),
        n
    );
    assert_eq!(
        delta(&mqtt, r#"statehub_mqtt_packets_sent_total{type="puback"}"#),
        n
    );
    assert_eq!(delta(&mqtt, "statehub_mqtt_messages_received_total"), n);
    assert_eq!(
        delta(
            &mqtt,
            r#"statehub_mqtt_packets_received_total{type="connect"}"#
        ),
        1.0
    );
    assert_eq!(
        delta(&mqtt, "statehub_mqtt_connections_accepted_total"),
        1.0
    );
    assert!(
        delta(
            &mqtt,
            r#"statehub_mqtt_received_bytes_total{type="publish"}"#
        ) >= n * 13.0
    );
    assert_eq!(mqtt.get("statehub_mqtt_connections"), 1.0);
    assert_eq!(mqtt.get(r#"statehub_mqtt_sessions{state="online"}"#), 1.0);

    // A refused CONNECT (3.1.1, empty client id without clean session) under its reason.
    let mut refused = connect_packet(statehub_broker::codec::ProtocolVersion::V311, "");
    refused.clean_start = false;
    let (_c, ack) = RawClient::connect_with(server.mqtt, refused).await;
    assert!(!ack.reason_code.is_success());
    let after_refusal = Scrape::take(&server);
    assert_eq!(
        delta(
            &after_refusal,
            r#"statehub_mqtt_connections_refused_total{reason="client_identifier_not_valid"}"#
        ),
        1.0,
        "{}",
        after_refusal.text
    );

    // A SET and a GET: one ok request each, a key held, latencies and an fsync recorded.
    let mut store = StoreClient::connect(server.mqtt, "metrics-store").await;
    assert_eq!(store.call(&[b"SET", b"k", b"v"]).await.payload, b"+OK\r\n");
    assert_eq!(store.call(&[b"GET", b"k"]).await.payload, b"$1\r\nv\r\n");
    assert_eq!(store.call(&[b"NOPE"]).await.payload[0], b'-');
    let ss = Scrape::take(&server);
    let requests = |cmd: &str, result: &str| {
        delta(
            &ss,
            &format!(r#"statehub_state_store_requests_total{{command="{cmd}",result="{result}"}}"#),
        )
    };
    assert_eq!(requests("set", "ok"), 1.0);
    assert_eq!(requests("get", "ok"), 1.0);
    assert_eq!(requests("invalid", "error"), 1.0);
    assert_eq!(requests("set", "error"), 0.0);
    assert_eq!(ss.get("statehub_state_store_keys"), 1.0);
    assert_eq!(ss.get("statehub_state_store_size_bytes"), 2.0);
    assert_eq!(
        delta(&ss, "statehub_state_store_request_duration_seconds_count"),
        3.0
    );
    assert!(delta(&ss, "statehub_storage_fsync_duration_seconds_count") >= 1.0);
    assert!(ss.get("statehub_storage_journal_size_bytes") > 0.0);

    // Web PubSub: join a group and send to it, both acked; the sender gets the message.
    let ws = wps_roundtrip(server.http).await;
    let w = Scrape::take(&server);
    assert_eq!(w.get("statehub_webpubsub_connections"), 1.0);
    assert_eq!(w.get("statehub_webpubsub_groups"), 1.0);
    assert_eq!(delta(&w, "statehub_webpubsub_messages_received_total"), 2.0);
    assert_eq!(delta(&w, "statehub_webpubsub_messages_sent_total"), 1.0);
    assert_eq!(
        delta(&w, r#"statehub_webpubsub_acks_total{result="ok"}"#),
        2.0
    );
    drop(ws);
}

/// Connects a JSON client, joins `g` and sends to it; returns the open socket.
async fn wps_roundtrip(http: SocketAddr) -> common::wps::Ws {
    let mut ws = common::wps::client(http, KEY, "h", Some("json.webpubsub.azure.v1")).await;
    common::wps::join_and_send(&mut ws).await;
    let (mut acks, mut message) = (0, false);
    while acks < 2 || !message {
        let text = common::wps::next_text(&mut ws).await;
        if text.contains(r#""type":"ack""#) {
            assert!(text.contains(r#""success":true"#), "{text}");
            acks += 1;
        } else if text.contains(r#""type":"message""#) {
            message = true;
        }
    }
    ws
}

/// docs/metrics.md's table, row by row: (name as queried, type, label names).
fn documented() -> Vec<(String, String, BTreeSet<String>)> {
    // A cluster node's rows are held to its scrape by tests/cluster_metrics.rs.
    let mut rows = common::documented_metrics("statehub_");
    rows.retain(|(name, _, _)| !name.starts_with("statehub_cluster_"));
    rows
}

#[test]
fn the_docs_table_is_what_a_scrape_exposes() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_full(dir.path());
    let scrape = Scrape::take(&server);
    let mut documented_families = BTreeSet::new();
    for (name, kind, labels) in documented() {
        // Counters are queried with `_total`; their family (the TYPE line) has none.
        let family = match kind.as_str() {
            "counter" => name
                .strip_suffix("_total")
                .unwrap_or_else(|| panic!("counter {name} must end in _total"))
                .to_owned(),
            _ => name.clone(),
        };
        assert_eq!(
            scrape.types.get(&family),
            Some(&kind),
            "docs/metrics.md lists {name} as a {kind}; the scrape does not"
        );
        let exposed = scrape.labels(&family);
        if !exposed.is_empty() {
            assert_eq!(exposed, labels, "labels of {name}");
        }
        assert!(documented_families.insert(family), "{name} listed twice");
    }
    let exposed: BTreeSet<String> = scrape.types.keys().cloned().collect();
    let undocumented: Vec<_> = exposed.difference(&documented_families).collect();
    assert!(
        undocumented.is_empty(),
        "exposed but not in docs/metrics.md: {undocumented:?}"
    );
}

#[test]
fn healthz_and_readyz_answer_once_started() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_full(dir.path());
    assert_eq!(http_get(server.http, "/healthz"), (200, "ok\n".to_owned()));
    assert_eq!(
        http_get(server.http, "/readyz"),
        (200, "ready\n".to_owned())
    );
}
