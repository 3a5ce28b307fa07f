//! The cluster fabric's metrics (`--redis`): whether each product reaches Redis, how its
//! stream readers keep up, what its writers could not write. Each layer counts in its
//! own crate (`statehub-broker-redis`, `statehub-state-store-redis`,
//! `statehub-webpubsub-redis`); the sources are handed over as each layer starts, and
//! read at scrape time like every other metric.

use std::fmt::Error;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

use prometheus_client::registry::Unit;
use statehub_broker_redis::RedisFabric;
use statehub_state_store_redis::{Counters as StoreCounters, FeedCounters};
use statehub_webpubsub_redis::RedisCluster;

use super::enc::Enc;

/// The cluster layers a node runs, filled in as each starts (none without `--redis`).
#[derive(Debug, Clone, Default)]
pub struct ClusterSources(Arc<Slots>);

#[derive(Debug, Default)]
struct Slots {
    mqtt: OnceLock<RedisFabric>,
    store: OnceLock<(Arc<StoreCounters>, Arc<FeedCounters>)>,
    webpubsub: OnceLock<Arc<RedisCluster>>,
}

impl ClusterSources {
    /// The broker's fabric.
    pub fn set_mqtt(&self, fabric: &RedisFabric) {
        let _ = self.0.mqtt.set(fabric.clone());
    }

    /// The state store engine's calls and its change feed.
    pub fn set_state_store(&self, calls: Arc<StoreCounters>, feed: Arc<FeedCounters>) {
        let _ = self.0.store.set((calls, feed));
    }

    /// Web PubSub's cluster.
    pub fn set_webpubsub(&self, cluster: Arc<RedisCluster>) {
        let _ = self.0.webpubsub.set(cluster);
    }
}

fn n(counter: &AtomicU64) -> u64 {
    counter.load(Relaxed)
}

/// Every cluster metric of the layers that run.
pub(super) fn encode(e: &mut Enc<'_>, sources: &ClusterSources) -> Result<(), Error> {
    let slots = &*sources.0;
    let mut up = Vec::new();
    if let Some(fabric) = slots.mqtt.get() {
        up.push((["mqtt"], u64::from(fabric.redis_up())));
    }
    if let Some((_, feed)) = slots.store.get() {
        up.push((["state_store"], u64::from(feed.up.load(Relaxed))));
    }
    if let Some(wps) = slots.webpubsub.get() {
        up.push((["webpubsub"], u64::from(wps.redis_up())));
    }
    if up.is_empty() {
        return Ok(());
    }
    e.gauges(
        "statehub_cluster_redis_up",
        "1 while the product's Redis writer (state store: change feed) reaches Redis, 0 while it does not",
        None,
        &["product"],
        &up,
    )?;
    if let Some(fabric) = slots.mqtt.get() {
        mqtt_stream(e, fabric)?;
        mqtt_sessions(e, fabric)?;
    }
    if let Some((calls, feed)) = slots.store.get() {
        state_store(e, calls, feed)?;
    }
    if let Some(wps) = slots.webpubsub.get() {
        webpubsub(e, wps)?;
    }
    Ok(())
}

fn mqtt_stream(e: &mut Enc<'_>, fabric: &RedisFabric) -> Result<(), Error> {
    let c = fabric.counters();
    let counters = [
        ("statehub_cluster_mqtt_forwarded", "Messages this node appended to the cluster stream", n(&c.forwarded)),
        ("statehub_cluster_mqtt_received", "Other nodes' messages read from the stream and routed here", n(&c.received)),
        ("statehub_cluster_mqtt_not_forwarded", "QoS 0 messages not forwarded to other nodes (writer queue full, or Redis out of reach)", n(&c.dropped)),
        ("statehub_cluster_mqtt_malformed", "Stream entries or messages skipped because they could not be decoded or encoded", n(&c.malformed)),
        ("statehub_cluster_mqtt_stream_entries_read", "Stream entries the reader applied (every node's)", n(&c.entries_read)),
        ("statehub_cluster_mqtt_stream_gaps", "Times the reader found entries trimmed (mqtt_stream_len) before it read them: messages lost for this node", n(&c.gaps)),
        ("statehub_cluster_mqtt_read_errors", "Stream reads that failed (the reader reconnects and reads on)", n(&c.read_errors)),
        ("statehub_cluster_mqtt_writer_batches", "Writer pipelines Redis answered", n(&c.batches)),
        ("statehub_cluster_mqtt_writer_errors", "Writer pipelines that failed (their QoS 1/2 PUBLISHes refused with 0x80)", n(&c.write_errors)),
        ("statehub_cluster_mqtt_not_replicated", "Writer batches fewer replicas acknowledged than redis_wait_replicas (their QoS 1/2 PUBLISHes refused with 0x80)", n(&c.not_replicated)),
        ("statehub_cluster_mqtt_writer_held", "Writer batches held back while a node's reader (this node's own included) was more than mqtt_reader_lag_limit entries behind (their PUBACKs waited)", n(&c.held)),
        ("statehub_cluster_mqtt_liveness_failures", "Liveness renewals that failed", n(&c.liveness_failures)),
        ("statehub_cluster_mqtt_retained_restored", "Retained changes made here while Redis was out of reach, written once it was back", n(&c.retained_restored)),
        ("statehub_cluster_mqtt_retained_unrestored", "Retained changes made here while Redis was out of reach past the bound on them (mqtt_queue topics): they stay on this node only", n(&c.retained_unrestored)),
        ("statehub_cluster_mqtt_retained_untracked", "Retained changes made here past the bound on those still to come in the stream: another node's older change of the topic may replace one here", n(&c.retained_untracked)),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, None, v)?;
    }
    let held_ms = n(&c.held_ms);
    e.counter(
        "statehub_cluster_mqtt_writer_held",
        "Time the writer held batches back for a reader past mqtt_reader_lag_limit",
        Some(Unit::Seconds),
        held_ms as f64 / 1000.0,
    )?;
    let lag_ms = n(&c.reader_lag_ms);
    e.gauge(
        "statehub_cluster_mqtt_reader_lag",
        "How far behind the stream reader was at its last read: the age of the last entry of a full batch, 0 once a read took all there was",
        Some(Unit::Seconds),
        lag_ms as f64 / 1000.0,
    )
}

fn mqtt_sessions(e: &mut Enc<'_>, fabric: &RedisFabric) -> Result<(), Error> {
    let sessions = fabric.sessions();
    let c = sessions.counters();
    let counters = [
        ("statehub_cluster_mqtt_session_batches", "Persistent-session writer batches written to Redis (one script call each)", n(&c.written)),
        ("statehub_cluster_mqtt_session_write_errors", "Persistent-session writer batches that failed to reach Redis (retried; acknowledgements waiting for them refused with 0x80)", n(&c.failed)),
        ("statehub_cluster_mqtt_session_fenced", "Session changes refused because another node owns the session now", n(&c.fenced)),
        ("statehub_cluster_mqtt_session_not_replicated", "Persistent-session batches fewer replicas acknowledged than redis_wait_replicas (acknowledgements waiting for them refused with 0x80)", n(&c.not_replicated)),
        ("statehub_cluster_mqtt_sessions_adopted", "Persistent sessions claimed by this node from another (released or dead)", n(&c.adopted)),
        ("statehub_cluster_mqtt_session_replayed", "Messages replayed from the stream into sessions that moved here", n(&c.replayed)),
        ("statehub_cluster_mqtt_session_not_redelivered", "Stream messages the reader did not deliver to sessions that moved here holding them already (appended late by the node they came from)", n(&c.not_redelivered)),
        ("statehub_cluster_mqtt_session_withdrawn_given", "This node's own refused messages whose entry reached the stream after all, given by its reader to the sessions their QoS 2 copies were taken back from", n(&c.withdrawn_given)),
        ("statehub_cluster_mqtt_session_origins_forgotten", "Origins of sessions that moved here forgotten past the bound on them (a late message of the node one came from would reach it again; logged)", n(&c.adopted_forgotten)),
        ("statehub_cluster_mqtt_sessions_expiring", "Sessions of dead nodes whose expiry clock this node's sweeper started", n(&c.expiring)),
        ("statehub_cluster_mqtt_sessions_swept", "Sessions no live node held that this node's sweeper forgot at their expiry, with their messages", n(&c.swept)),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, None, v)?;
    }
    Ok(())
}

fn state_store(e: &mut Enc<'_>, calls: &StoreCounters, feed: &FeedCounters) -> Result<(), Error> {
    let counters = [
        ("statehub_cluster_state_store_redis_calls", "Redis round trips of state store requests and expiry (a command, a script, or a script with its WAIT)", n(&calls.calls)),
        ("statehub_cluster_state_store_redis_errors", "Those that failed (the request answered 503)", n(&calls.errors)),
        ("statehub_cluster_state_store_not_replicated", "Writes fewer replicas acknowledged than redis_wait_replicas (answered 503)", n(&calls.not_replicated)),
        ("statehub_cluster_state_store_feed_applied", "Changes read from the change feed (every node's) and handed to this node's observers", n(&feed.applied)),
        ("statehub_cluster_state_store_feed_lost", "Changes trimmed from the change feed (feed_len) before this node read them: notifications lost", n(&feed.lost)),
        ("statehub_cluster_state_store_feed_read_errors", "Change feed reads that failed (the feed reconnects and reads on)", n(&feed.read_errors)),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, None, v)?;
    }
    e.gauge(
        "statehub_cluster_state_store_feed_lag",
        "How far behind the change feed was at its last read: the age of the last change of a full batch, 0 once a read took all there was",
        Some(Unit::Seconds),
        n(&feed.lag_ms) as f64 / 1000.0,
    )
}

fn webpubsub(e: &mut Enc<'_>, wps: &RedisCluster) -> Result<(), Error> {
    let c = wps.counters();
    let counters = [
        ("statehub_cluster_webpubsub_writer_pipelines", "Writer pipelines Redis answered (operations, index changes, session mirrors)", n(&c.pipelines)),
        ("statehub_cluster_webpubsub_writer_errors", "Writer attempts that failed (retried in order; sends to other nodes refused meanwhile)", n(&c.write_errors)),
        ("statehub_cluster_webpubsub_entries_read", "Operations stream entries the reader read (every node's)", n(&c.entries_read)),
        ("statehub_cluster_webpubsub_read_errors", "Operations stream reads that failed (the reader reconnects and reads on)", n(&c.read_errors)),
        ("statehub_cluster_webpubsub_lost", "Other nodes' operations trimmed (webpubsub_stream_len) before this node read them", wps.lost()),
        ("statehub_cluster_webpubsub_not_replicated", "Writer pipelines and claims fewer replicas acknowledged than redis_wait_replicas (what waited for them refused: 503, InternalServerError, 1013)", n(&c.not_replicated)),
    ];
    for (name, help, v) in counters {
        e.counter(name, help, None, v)?;
    }
    e.counters(
        "statehub_cluster_webpubsub_mirrored",
        "Reliable sessions' changes mirrored into Redis for recovery on another node, by kind: frame, or change",
        None,
        &["kind"],
        &[(["frame"], n(&c.mirrored_frames)), (["change"], n(&c.mirrored_changes))],
    )?;
    e.gauge(
        "statehub_cluster_webpubsub_reader_lag",
        "How far behind the operations reader was at its last read: the age of the last entry of a full batch, 0 once a read took all there was",
        Some(Unit::Seconds),
        n(&c.reader_lag_ms) as f64 / 1000.0,
    )?;
    e.counter(
        "statehub_cluster_webpubsub_mirror_overflows",
        "Reliable sessions some of whose changes could not be queued for Redis: ended (1008), recoverable nowhere",
        None,
        n(&c.mirror_overflows),
    )?;
    e.counters(
        "statehub_cluster_webpubsub_claims",
        "Reliable sessions this node claimed from another, by result: ok, or failed (gone, ended, Redis out of reach)",
        None,
        &["result"],
        &[(["ok"], n(&c.claims)), (["failed"], n(&c.claims_failed))],
    )
}
