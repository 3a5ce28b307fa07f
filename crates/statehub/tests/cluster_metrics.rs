//! The cluster fabric on `/metrics` (`--redis`), against the binary and a real
//! redis-server: the counters move with cross-node traffic, the `redis up` gauges fall
//! to 0 when redis-server is killed (and the error counters rise) and return to 1 when
//! it is back; docs/metrics.md's `statehub_cluster_` rows are what a cluster node
//! exposes.

mod common;
mod store_client;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::Server;
use statehub_broker::codec::{QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, RawClient, V5};
use store_client::StoreClient;

const KEY: &str = "cluster-metrics-access-key-0123456789abcdef";
const PATIENCE: Duration = Duration::from_secs(30);
const PRODUCTS: [&str; 3] = ["mqtt", "state_store", "webpubsub"];

/// A node on `redis` with Web PubSub on, so every product's metrics are there.
fn node(redis: &RedisServer, id: &str) -> Server {
    let toml = format!("[webpubsub]\naccess_keys = [\"{KEY}\"]\n");
    common::start_configured(&toml, &["--redis", &redis.url(), "--node-id", id])
}

/// A scrape: every sample by `name{labels}` as written, and every family's type.
struct Scrape {
    samples: BTreeMap<String, f64>,
    types: BTreeMap<String, String>,
}

impl Scrape {
    fn take(server: &Server) -> Scrape {
        let out = common::scrape(server.http);
        let (head, body) = out.split_once("\r\n\r\n").expect("a response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let (samples, types) = common::parse_metrics(body);
        Scrape { samples, types }
    }

    /// One sample's value; panics if it is not exposed.
    fn get(&self, sample: &str) -> f64 {
        *self
            .samples
            .get(sample)
            .unwrap_or_else(|| panic!("{sample} is not exposed"))
    }

    fn up(&self, product: &str) -> f64 {
        self.get(&format!(
            "statehub_cluster_redis_up{{product=\"{product}\"}}"
        ))
    }
}

/// Scrapes `server` until `cond` holds (at most [`PATIENCE`]); the scrape that held.
async fn scrape_until(server: &Server, what: &str, cond: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let scrape = Scrape::take(server);
        if cond(&scrape) {
            return scrape;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn all_up(s: &Scrape, value: f64) -> bool {
    PRODUCTS.iter().all(|p| s.up(p) == value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_counters_move_with_cross_node_traffic_and_redis_up_follows_redis() {
    let mut redis = RedisServer::start();
    let a = node(&redis, "a");
    let b = node(&redis, "b");
    let a0 = scrape_until(&a, "a reaches redis", |s| all_up(s, 1.0)).await;
    let b0 = scrape_until(&b, "b reaches redis", |s| all_up(s, 1.0)).await;

    // A QoS 1 message published on a reaches a subscriber on b through the stream.
    let mut sub = RawClient::connect(b.mqtt, V5, "metrics-sub").await;
    sub.subscribe("m/t", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "metrics-pub").await;
    let code = publisher
        .publish_simple("m/t", QoS::AtLeastOnce, b"x")
        .await;
    assert_eq!(code, ReasonCode::SUCCESS);
    assert_eq!(&sub.expect_publish_ack().await.payload[..], b"x");
    let read = "statehub_cluster_mqtt_stream_entries_read_total";
    let received = "statehub_cluster_mqtt_received_total";
    scrape_until(&b, "b's reader applied a's message", |s| {
        s.get(read) > b0.get(read) && s.get(received) > b0.get(received)
    })
    .await;
    let a1 = Scrape::take(&a);
    for name in [
        "statehub_cluster_mqtt_forwarded_total",
        "statehub_cluster_mqtt_writer_batches_total",
    ] {
        assert!(a1.get(name) > a0.get(name), "{name} on a");
    }
    let mut store = StoreClient::connect(a.mqtt, "metrics-store").await;
    let (stat, _) = store.call_status(&[b"SET", b"k", b"v"]).await;
    assert_eq!(stat.as_deref(), Some("200"));
    let calls = "statehub_cluster_state_store_redis_calls_total";
    assert!(Scrape::take(&a).get(calls) > a1.get(calls), "{calls}");

    redis.kill();
    let down = scrape_until(&a, "a sees redis down", |s| all_up(s, 0.0)).await;
    let code = publisher
        .publish_simple("m/t", QoS::AtLeastOnce, b"y")
        .await;
    assert_eq!(code, ReasonCode::UNSPECIFIED_ERROR, "refused while down");
    let (stat, _) = store.call_status(&[b"SET", b"k", b"w"]).await;
    assert_eq!(stat.as_deref(), Some("503"));
    let errors = [
        "statehub_cluster_mqtt_writer_errors_total",
        "statehub_cluster_state_store_redis_errors_total",
        "statehub_cluster_webpubsub_writer_errors_total",
    ];
    let after = Scrape::take(&a);
    for name in errors {
        assert!(after.get(name) > a1.get(name), "{name} rose");
    }
    assert!(
        after.get(errors[1]) > down.get(errors[1]),
        "the 503 counted"
    );

    redis.restart();
    scrape_until(&a, "a sees redis back", |s| all_up(s, 1.0)).await;
    scrape_until(&b, "b sees redis back", |s| all_up(s, 1.0)).await;
}

/// A reliable JSON client of hub `h` on `server` that joins `g` and sends `hi` to it;
/// returns the open socket once it got the message back.
async fn reliable_roundtrip(server: &Server) -> common::wps::Ws {
    let protocol = Some("json.reliable.webpubsub.azure.v1");
    let mut ws = common::wps::client(server.http, KEY, "h", protocol).await;
    common::wps::join_and_send(&mut ws).await;
    while !common::wps::next_text(&mut ws)
        .await
        .contains(r#""type":"message""#)
    {}
    ws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reliable_sessions_frames_are_counted_as_mirrored() {
    let redis = RedisServer::start();
    let a = node(&redis, "a");
    let before = scrape_until(&a, "a reaches redis", |s| all_up(s, 1.0)).await;
    let frame = r#"statehub_cluster_webpubsub_mirrored_total{kind="frame"}"#;
    let change = r#"statehub_cluster_webpubsub_mirrored_total{kind="change"}"#;
    let _ws = reliable_roundtrip(&a).await;
    scrape_until(&a, "the session's open and its frame mirrored", |s| {
        s.get(frame) > before.get(frame) && s.get(change) > before.get(change)
    })
    .await;
}

/// docs/metrics.md's rows of `statehub_cluster_` metrics: (name as queried, type,
/// label names).
fn documented() -> Vec<(String, String, BTreeSet<String>)> {
    common::documented_metrics("statehub_cluster_")
}

#[test]
fn the_docs_cluster_rows_are_what_a_cluster_node_exposes() {
    let redis = RedisServer::start();
    let a = node(&redis, "a");
    let scrape = Scrape::take(&a);
    let mut documented_families = BTreeSet::new();
    for (name, kind, labels) in documented() {
        let family = match kind.as_str() {
            "counter" => name
                .strip_suffix("_total")
                .expect("a counter ends in _total"),
            _ => name.as_str(),
        };
        assert_eq!(scrape.types.get(family), Some(&kind), "{name}");
        let exposed: BTreeSet<String> = scrape
            .samples
            .keys()
            .filter(|s| s.split('{').next() == Some(name.as_str()))
            .filter_map(|s| s.split_once('{'))
            .flat_map(|(_, l)| l.trim_end_matches('}').split(',').map(str::to_owned))
            .filter_map(|pair| pair.split_once('=').map(|(k, _)| k.to_owned()))
            .collect();
        assert_eq!(exposed, labels, "labels of {name}");
        assert!(
            documented_families.insert(family.to_owned()),
            "{name} twice"
        );
    }
    let exposed: BTreeSet<String> = scrape
        .types
        .keys()
        .filter(|f| f.starts_with("statehub_cluster_"))
        .cloned()
        .collect();
    let undocumented: Vec<_> = exposed.difference(&documented_families).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/metrics.md: {undocumented:?}"
    );
}
