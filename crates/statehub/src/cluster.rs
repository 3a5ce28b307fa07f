//! Scale-out of the state store: with `--redis` / `[cluster] redis_url`, the state store
//! lives in Redis ([`RedisEngine`]) and every statehub node on that Redis serves the same
//! store. Each node runs its own machine over the engine (its own observers, its own
//! expiry task) and one thread that reads the store's change feed and notifies the
//! node's observers. Web PubSub spans the nodes on the same Redis
//! (`statehub-webpubsub-redis`), and so does the broker with its persistent sessions
//! (`statehub-broker-redis`). A data directory is refused with `--redis`: the store,
//! retained messages and sessions all live in Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use statehub_broker::Broker;
use statehub_redis_common::Wait;
use statehub_state_store::{AllowAll, Machine};
use statehub_state_store_redis::{defaults, Options, RedisEngine};
use statehub_state_store_service::{Settings as StateStoreSettings, StateStoreService};
use statehub_webpubsub::WebPubSub;
use statehub_webpubsub_redis::RedisCluster;
use tokio::task::JoinHandle;

use crate::metrics::ClusterSources;

/// `statehub serve` cluster flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClusterArgs {
    /// Keep the state store in Redis at this URL (`redis://host:port[/db]`), shared by
    /// every statehub node given the same URL (default: this node's own store).
    #[arg(long = "redis", env = "STATEHUB_REDIS")]
    pub redis_url: Option<String>,
    /// This node's id in the cluster, unique among the nodes on one Redis (default:
    /// `node-<pid>-<start time in ms>`).
    #[arg(long, env = "STATEHUB_NODE_ID")]
    pub node_id: Option<String>,
    /// Acknowledge a state store write, a QoS 1/2 PUBLISH, a retained change and a
    /// persistent session's change, a Web PubSub send, membership change or claim only
    /// once this many Redis replicas have it (`WAIT`); fewer within `[cluster]
    /// redis_wait_timeout_ms` is a 503 (state store, Web PubSub REST), 0x80 (MQTT), an
    /// `InternalServerError` ack or 1013 (Web PubSub clients) (default 0: once the
    /// primary has it).
    #[arg(long, env = "STATEHUB_REDIS_WAIT_REPLICAS")]
    pub redis_wait_replicas: Option<u32>,
}

/// The `[cluster]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// See [`ClusterArgs::redis_url`].
    pub redis_url: Option<String>,
    /// See [`ClusterArgs::node_id`].
    pub node_id: Option<String>,
    /// The namespace of the store's keys in Redis: nodes with the same one share a
    /// store (`statehub`).
    pub namespace: String,
    /// Bound on every Redis call, in milliseconds (2000): past it the request is
    /// answered 503.
    pub timeout_ms: u64,
    /// The change feed (a Redis stream) is trimmed to about this many entries (10000):
    /// how far a node's reader may fall behind before notifications are lost.
    pub feed_len: u64,
    /// Web PubSub's stream of operations between nodes is trimmed to about this many
    /// entries (10000): how far a node may fall behind before it misses sends.
    pub webpubsub_stream_len: u64,
    /// Most Web PubSub operations waiting to be written to Redis (10000); past it a
    /// send to other nodes is refused (REST 503, ack `InternalServerError`).
    pub webpubsub_queue: usize,
    /// The broker's message stream is trimmed to about this many entries (100000): how
    /// far a node's reader may fall behind before its subscribers miss messages.
    pub mqtt_stream_len: u64,
    /// Publishers wait (their PUBACKs held) while a live node's stream reader (their
    /// own node's included) is more than this many entries behind the stream's head (half of
    /// `mqtt_stream_len`, and at most that; 0: never wait), so no reader that keeps
    /// reading falls past the trim. A node whose reader made no progress for
    /// `mqtt_node_ttl_ms` is not waited for.
    pub mqtt_reader_lag_limit: Option<u64>,
    /// Most messages a node holds for its Redis writer (10000): past it QoS 1/2
    /// PUBLISHes are refused with 0x97 and QoS 0 ones stay on their node.
    pub mqtt_queue: usize,
    /// See [`ClusterArgs::redis_wait_replicas`] (0).
    pub redis_wait_replicas: u32,
    /// How long a write waits for those replicas, in milliseconds (500); below
    /// `timeout_ms`.
    pub redis_wait_timeout_ms: u64,
    /// A node that has not renewed its liveness key in Redis for this many
    /// milliseconds (10000) is dead: its persistent MQTT sessions are taken over by the
    /// node their client reconnects to, its shared groups no longer picked.
    pub mqtt_node_ttl_ms: u64,
    /// How often, in milliseconds (10000), one live node forgets the persistent MQTT
    /// sessions past their expiry that no node holds (their node died, or their
    /// client never came back for them), with the messages they kept.
    pub mqtt_session_sweep_ms: u64,
}

/// A node's cluster settings: its state store and its Web PubSub on Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    /// The state store's.
    pub store: Options,
    /// Web PubSub's.
    pub webpubsub: statehub_webpubsub_redis::Options,
    /// The broker's fabric.
    pub mqtt: statehub_broker_redis::Options,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            redis_url: None,
            node_id: None,
            namespace: defaults::NAMESPACE.to_owned(),
            timeout_ms: u64::try_from(defaults::TIMEOUT.as_millis()).unwrap_or(u64::MAX),
            feed_len: defaults::FEED_LEN,
            webpubsub_stream_len: statehub_webpubsub_redis::defaults::STREAM_LEN,
            webpubsub_queue: statehub_webpubsub_redis::defaults::QUEUE,
            mqtt_stream_len: statehub_broker_redis::defaults::STREAM_LEN,
            mqtt_reader_lag_limit: None,
            mqtt_queue: statehub_broker_redis::defaults::QUEUE,
            redis_wait_replicas: 0,
            redis_wait_timeout_ms: 500,
            mqtt_node_ttl_ms: u64::try_from(statehub_broker_redis::defaults::NODE_TTL.as_millis())
                .unwrap_or(u64::MAX),
            mqtt_session_sweep_ms: u64::try_from(
                statehub_broker_redis::defaults::SESSION_SWEEP.as_millis(),
            )
            .unwrap_or(u64::MAX),
        }
    }
}

/// The `[cluster]` settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("[cluster] {0}")]
    Invalid(&'static str),
    #[error("a Redis state store and --data-dir exclude each other: the store lives in Redis")]
    WithDataDir,
}

/// Resolves flags over the file's table: `None` without a Redis URL.
pub fn resolve(
    args: &ClusterArgs,
    file: ClusterConfig,
    version_node_id: &str,
    data_dir: bool,
) -> Result<Option<Cluster>, ClusterError> {
    // Checked with or without a Redis URL, as a table that cannot be used.
    let lag_limit = check_mqtt(&file)?;
    let Some(url) = args.redis_url.clone().or_else(|| file.redis_url.clone()) else {
        return Ok(None);
    };
    if data_dir {
        return Err(ClusterError::WithDataDir);
    }
    check_redis(&file)?;
    let wait = wait(
        args.redis_wait_replicas.unwrap_or(file.redis_wait_replicas),
        file.redis_wait_timeout_ms,
        file.timeout_ms,
    )?;
    let node = args.node_id.clone().or_else(|| file.node_id.clone());
    let node = node.unwrap_or_else(|| {
        let started = statehub_state_store::unix_ms(std::time::SystemTime::now());
        format!("node-{}-{started}", std::process::id())
    });
    if node.is_empty() {
        return Err(ClusterError::Invalid("node_id must be non-empty"));
    }
    let store = Options {
        url,
        namespace: file.namespace.clone(),
        node,
        version_node_id: version_node_id.to_owned(),
        timeout: Duration::from_millis(file.timeout_ms),
        feed_len: file.feed_len,
        wait,
    };
    Ok(Some(Cluster::new(store, lag_limit, &file)))
}

/// The broker's bounds, which a table must keep with or without a Redis URL; returns
/// the reader lag limit.
fn check_mqtt(file: &ClusterConfig) -> Result<u64, ClusterError> {
    if file.mqtt_stream_len == 0 {
        return Err(ClusterError::Invalid("mqtt_stream_len must be at least 1"));
    }
    let lag_limit = file
        .mqtt_reader_lag_limit
        .unwrap_or(file.mqtt_stream_len / 2);
    // What other writers append within one round trip comes on top of the limit
    // (docs/cluster.md, "A node falls behind"): half the stream is left for it.
    if lag_limit > file.mqtt_stream_len / 2 {
        return Err(ClusterError::Invalid(
            "mqtt_reader_lag_limit must be at most half of mqtt_stream_len",
        ));
    }
    if file.mqtt_queue == 0 {
        return Err(ClusterError::Invalid("mqtt_queue must be at least 1"));
    }
    if file.mqtt_node_ttl_ms < 100 {
        return Err(ClusterError::Invalid(
            "mqtt_node_ttl_ms must be at least 100",
        ));
    }
    if file.mqtt_session_sweep_ms < 100 {
        return Err(ClusterError::Invalid(
            "mqtt_session_sweep_ms must be at least 100",
        ));
    }
    Ok(lag_limit)
}

/// The bounds the state store and Web PubSub on Redis need.
fn check_redis(file: &ClusterConfig) -> Result<(), ClusterError> {
    if file.timeout_ms == 0 {
        return Err(ClusterError::Invalid("timeout_ms must be at least 1"));
    }
    if file.feed_len == 0 || file.webpubsub_stream_len == 0 {
        return Err(ClusterError::Invalid(
            "feed_len and webpubsub_stream_len must be at least 1",
        ));
    }
    if file.webpubsub_queue == 0 {
        return Err(ClusterError::Invalid("webpubsub_queue must be at least 1"));
    }
    if file.namespace.is_empty() || file.namespace.contains(['{', '}']) {
        return Err(ClusterError::Invalid(
            "namespace must be non-empty, without braces",
        ));
    }
    Ok(())
}

impl Cluster {
    /// Web PubSub's and the broker's options beside the state store's, from a table
    /// [`check_mqtt`] and [`check_redis`] passed.
    fn new(store: Options, lag_limit: u64, file: &ClusterConfig) -> Self {
        let webpubsub = statehub_webpubsub_redis::Options {
            url: store.url.clone(),
            namespace: store.namespace.clone(),
            node: store.node.clone(),
            timeout: store.timeout,
            stream_len: file.webpubsub_stream_len,
            queue: file.webpubsub_queue,
            wait: store.wait,
        };
        let mqtt = statehub_broker_redis::Options {
            url: store.url.clone(),
            namespace: store.namespace.clone(),
            node: store.node.clone(),
            timeout: store.timeout,
            stream_len: file.mqtt_stream_len,
            reader_lag_limit: lag_limit,
            queue: file.mqtt_queue,
            wait_replicas: store.wait.map_or(0, |w| w.replicas),
            wait_timeout: store.wait.map_or(Duration::ZERO, |w| w.timeout),
            node_ttl: Duration::from_millis(file.mqtt_node_ttl_ms),
            session_sweep: Duration::from_millis(file.mqtt_session_sweep_ms),
        };
        Self {
            store,
            webpubsub,
            mqtt,
        }
    }
}

/// The replicas a write (state store, MQTT, Web PubSub) waits for, if any, and for how long (less
/// than one Redis call may take, or the call would time out first).
fn wait(replicas: u32, wait_ms: u64, timeout_ms: u64) -> Result<Option<Wait>, ClusterError> {
    if replicas == 0 {
        return Ok(None);
    }
    if wait_ms == 0 || wait_ms >= timeout_ms {
        return Err(ClusterError::Invalid(
            "redis_wait_timeout_ms must be at least 1 and below timeout_ms",
        ));
    }
    Ok(Some(Wait {
        replicas,
        timeout: Duration::from_millis(wait_ms),
    }))
}

/// Spans Web PubSub over the nodes on the cluster's Redis (nothing without a cluster or
/// without Web PubSub), its counters read by `metrics`.
pub fn start_webpubsub(
    cluster: Option<&Cluster>,
    service: Option<&WebPubSub>,
    metrics: &ClusterSources,
) -> std::io::Result<()> {
    let (Some(cluster), Some(service)) = (cluster, service) else {
        return Ok(());
    };
    // Its threads stop at the end of the service's shutdown (after handing this node's
    // reliable sessions over): `WebPubSub::shutdown`.
    let joined = RedisCluster::start(&cluster.webpubsub, service)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, crate::chain(&e)))?;
    metrics.set_webpubsub(joined);
    tracing::info!(
        "web pubsub spans the nodes on redis at {} (node {})",
        cluster.webpubsub.url,
        cluster.webpubsub.node
    );
    Ok(())
}

/// The state store on Redis, registered on the broker, its expiry task and change feed
/// running, their counters read by `metrics`; returns the expiry task. Starts even
/// while Redis is down (requests are then answered 503 until it is back).
pub fn start_state_store(
    options: &Options,
    settings: &StateStoreSettings,
    broker: &Broker,
    metrics: &ClusterSources,
) -> std::io::Result<(JoinHandle<()>, crate::StateStoreRef)> {
    let invalid = |e: &dyn std::error::Error| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, crate::chain(e))
    };
    let config = settings.machine_config().map_err(|e| invalid(&e))?;
    let engine = RedisEngine::open(options).map_err(|e| invalid(&e))?;
    // One machine per connection, each observing under a name of its own (`shards.rs`
    // in the service); their calls counted together.
    let mut rest = Vec::new();
    for shard in 1..settings.network_threads.max(1) {
        let node = format!("{}/{shard}", options.node);
        let options = Options {
            node,
            ..options.clone()
        };
        let mut more = RedisEngine::open(&options).map_err(|e| invalid(&e))?;
        more.count_into(engine.counters());
        rest.push(Machine::shared(more, AllowAll, config.clone()));
    }
    let mut feed = RedisEngine::feed(options).map_err(|e| invalid(&e))?;
    metrics.set_state_store(engine.counters(), feed.counters());
    if let Err(e) = feed.start() {
        tracing::warn!(
            "redis at {} is unreachable ({}); state store requests are answered 503 until it is back",
            options.url,
            crate::chain(&e)
        );
    }
    let machine = Machine::shared(engine, AllowAll, config);
    let service = Arc::new(StateStoreService::with_change_feed(
        machine,
        rest,
        settings,
        options.timeout,
    ));
    // Redis calls block: they are made on the store's own threads, never on the MQTT
    // workers or the runtime's.
    service.run_engine_on_own_thread(settings.network_queue)?;
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::Builder::new()
        .name("state-store-feed".into())
        .spawn({
            let (service, broker, stop) = (service.clone(), broker.clone(), stop.clone());
            move || feed.run(&stop, |change| service.apply_change(&broker, &change))
        })?;
    let shutdown = broker.shutdown_token();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stop.store(true, Ordering::Relaxed);
    });
    tracing::info!(
        "state store in redis at {} (namespace {:?}), node {}",
        options.url,
        options.namespace,
        options.node
    );
    Ok(crate::register_shared(broker, service))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(table: &str) -> Result<Option<Cluster>, ClusterError> {
        let file: ClusterConfig = toml::from_str(table).unwrap();
        resolve(&ClusterArgs::default(), file, "node", false)
    }

    #[test]
    fn the_reader_lag_limit_defaults_to_half_the_stream_and_stays_at_most_that() {
        let url = "redis_url = \"redis://127.0.0.1:1\"\n";
        let lag =
            |t: &str| resolved(&format!("{url}{t}")).map(|c| c.unwrap().mqtt.reader_lag_limit);
        assert_eq!(lag("mqtt_stream_len = 50\n").unwrap(), 25);
        assert_eq!(
            lag("mqtt_stream_len = 50\nmqtt_reader_lag_limit = 20\n").unwrap(),
            20
        );
        assert_eq!(lag("mqtt_reader_lag_limit = 0\n").unwrap(), 0);
        assert_eq!(
            lag("mqtt_stream_len = 50\nmqtt_reader_lag_limit = 25\n").unwrap(),
            25
        );
        // Less than half the stream left above the limit for what other writers
        // append within a round trip.
        assert!(lag("mqtt_stream_len = 50\nmqtt_reader_lag_limit = 26\n").is_err());
        assert!(lag("mqtt_stream_len = 50\nmqtt_reader_lag_limit = 50\n").is_err());
    }

    #[test]
    fn the_broker_bounds_come_from_the_cluster_table_and_zero_is_refused() {
        let url = "redis_url = \"redis://127.0.0.1:1\"\n";
        let cluster = resolved(&format!("{url}mqtt_stream_len = 50\nmqtt_queue = 7\n"))
            .unwrap()
            .unwrap();
        assert_eq!((cluster.mqtt.stream_len, cluster.mqtt.queue), (50, 7));
        assert_eq!(cluster.mqtt.node, cluster.store.node);
        assert!(
            resolved("mqtt_queue = 0\n").is_err(),
            "refused without a URL too"
        );
        assert!(resolved(&format!("{url}mqtt_stream_len = 0\n")).is_err());
        let default = resolved(url).unwrap().unwrap();
        assert_eq!(default.mqtt.queue, statehub_broker_redis::defaults::QUEUE);
    }

    #[test]
    fn redis_wait_needs_a_timeout_below_the_call_timeout() {
        let url = "redis_url = \"redis://127.0.0.1:1\"\n";
        assert_eq!(resolved(url).unwrap().unwrap().store.wait, None);
        let wait = resolved(&format!("{url}redis_wait_replicas = 2\n"))
            .unwrap()
            .unwrap()
            .store
            .wait;
        let mqtt = resolved(&format!("{url}redis_wait_replicas = 2\n"))
            .unwrap()
            .unwrap()
            .mqtt;
        assert_eq!(
            (mqtt.wait_replicas, mqtt.wait_timeout.as_millis()),
            (2, 500)
        );
        assert_eq!(
            wait,
            Some(Wait {
                replicas: 2,
                timeout: Duration::from_millis(500)
            })
        );
        for bad in ["redis_wait_timeout_ms = 0", "redis_wait_timeout_ms = 2000"] {
            let table = format!("{url}redis_wait_replicas = 1\n{bad}\n");
            assert!(resolved(&table).is_err(), "{bad}");
        }
    }
}
