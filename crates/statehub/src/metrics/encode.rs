//! The collector: every layer's counters, read and written out at scrape time. Names
//! follow Prometheus' conventions (`statehub_` prefix, base units, counters end in
//! `_total`, which the encoder appends); labels take a few fixed values each, never a
//! client id, topic, key, hub or group name.

use std::fmt::{Debug, Error};
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;
use std::sync::atomic::Ordering::Relaxed;

use statehub_broker::{Broker, Gauges, Metrics, PACKET_TYPES};
use statehub_state_store_service::{COMMANDS, RESULTS};
use statehub_storage::Store;
use statehub_webpubsub::{Counters, WebPubSub};

use super::enc::Enc;
use super::{ClusterSources, StateStoreSource};

#[derive(Debug)]
pub(super) struct Collect {
    pub(super) broker: Broker,
    pub(super) state_store: Arc<dyn StateStoreSource>,
    pub(super) storage: Option<Store>,
    pub(super) wps: Option<WebPubSub>,
    pub(super) cluster: ClusterSources,
}

impl Collector for Collect {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), Error> {
        let mut e = Enc(encoder);
        mqtt(&mut e, &self.broker)?;
        state_store(&mut e, self.state_store.as_ref())?;
        if let Some(store) = &self.storage {
            storage(&mut e, store)?;
        }
        if let Some(wps) = &self.wps {
            webpubsub(&mut e, wps)?;
        }
        super::cluster::encode(&mut e, &self.cluster)
    }
}

fn mqtt(e: &mut Enc<'_>, broker: &Broker) -> Result<(), Error> {
    let m = broker.metrics();
    let g = broker.gauges();
    mqtt_connections(e, m, &g)?;
    mqtt_traffic(e, m)?;
    mqtt_deliveries(e, m)?;
    mqtt_security(e, m)?;
    mqtt_sessions(e, &g)
}

fn mqtt_connections(e: &mut Enc<'_>, m: &Metrics, g: &Gauges) -> Result<(), Error> {
    e.gauge(
        "statehub_mqtt_connections",
        "Open MQTT connections (CONNECT received)",
        None,
        g.connections,
    )?;
    e.counter(
        "statehub_mqtt_connections_accepted",
        "MQTT connections accepted (CONNACK success)",
        None,
        m.connections_accepted.load(Relaxed),
    )?;
    e.counters(
        "statehub_mqtt_connections_refused",
        "CONNECTs refused with a CONNACK, by reason code",
        None,
        &["reason"],
        &m.connections_refused
            .snapshot()
            .iter()
            .map(|(r, n)| ([*r], *n))
            .collect::<Vec<_>>(),
    )?;
    e.counter(
        "statehub_mqtt_pending_evicted",
        "Connections closed before CONNECT to keep the pending-connection limits",
        None,
        m.pending_evicted.load(Relaxed),
    )?;
    Ok(())
}

fn mqtt_traffic(e: &mut Enc<'_>, m: &Metrics) -> Result<(), Error> {
    let packet = |counts: [(u64, u64); 16], bytes: bool| -> Vec<([&str; 1], u64)> {
        (1..16)
            .map(|i| {
                (
                    [PACKET_TYPES[i]],
                    if bytes { counts[i].1 } else { counts[i].0 },
                )
            })
            .collect()
    };
    let (inn, out) = (m.packets_in.snapshot(), m.packets_out.snapshot());
    e.counters(
        "statehub_mqtt_packets_received",
        "MQTT control packets read from clients, by type",
        None,
        &["type"],
        &packet(inn, false),
    )?;
    e.counters(
        "statehub_mqtt_packets_sent",
        "MQTT control packets written to clients, by type",
        None,
        &["type"],
        &packet(out, false),
    )?;
    e.counters(
        "statehub_mqtt_received",
        "Bytes of MQTT packets read, by packet type",
        Some(Unit::Bytes),
        &["type"],
        &packet(inn, true),
    )?;
    e.counters(
        "statehub_mqtt_sent",
        "Bytes of MQTT packets written, by packet type",
        Some(Unit::Bytes),
        &["type"],
        &packet(out, true),
    )?;
    e.counter(
        "statehub_mqtt_messages_received",
        "PUBLISHes routed (from clients and built-in services)",
        None,
        m.messages_in.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_messages_delivered",
        "Message copies queued to subscriber sessions",
        None,
        m.messages_out.load(Relaxed),
    )?;
    Ok(())
}

fn mqtt_deliveries(e: &mut Enc<'_>, m: &Metrics) -> Result<(), Error> {
    let dropped = [
        (["qos0_queue_full"], m.dropped_qos0_queue_full.load(Relaxed)),
        (
            ["queue_full_drop_newest"],
            m.dropped_queue_full_newest.load(Relaxed),
        ),
        (
            ["queue_full_drop_oldest"],
            m.dropped_queue_full_oldest.load(Relaxed),
        ),
        (["expired"], m.expired_dropped.load(Relaxed)),
        (["oversize"], m.oversize_dropped.load(Relaxed)),
        (["encode_failure"], m.encode_failures.load(Relaxed)),
    ];
    e.counters(
        "statehub_mqtt_messages_dropped",
        "Messages not delivered, by reason",
        None,
        &["reason"],
        &dropped,
    )?;
    e.counter("statehub_mqtt_publishes_refused_quota", "PUBLISHes refused because an offline session's queue was full (queue_full_policy = refuse)", None, m.refused_quota.load(Relaxed))?;
    e.counter("statehub_mqtt_publishes_refused_cluster", "QoS 1/2 PUBLISHes refused because the other nodes of the cluster (Redis) could not be given them", None, m.cluster_refused.load(Relaxed))?;
    e.counter("statehub_mqtt_copies_withdrawn_cluster", "QoS 2 copies of a PUBLISH refused because the cluster could not be given it, taken back from persistent sessions before they were sent (given once if the message reaches the cluster after all)", None, m.cluster_withdrawn.load(Relaxed))?;
    e.counter(
        "statehub_mqtt_broker_queue_full",
        "Deliveries that met the broker-wide queue bound (max_total_queued_*)",
        None,
        m.total_queue_full.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_slow_consumers",
        "Connections closed with 0x97 because they did not keep up",
        None,
        m.slow_consumers.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_publisher_pauses",
        "Times a publisher was paused for a subscriber past its backlog's high-water mark",
        None,
        m.publisher_pauses.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_publisher_paused",
        "Time publishers spent paused for subscribers past their high-water mark",
        Some(Unit::Seconds),
        m.publisher_paused_micros.load(Relaxed) as f64 / 1e6,
    )?;
    e.counter(
        "statehub_mqtt_protocol_errors",
        "Connections closed for a malformed packet or a protocol error",
        None,
        m.protocol_errors.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_packet_read_timeouts",
        "Connections closed because a started packet did not arrive in time",
        None,
        m.packet_read_timeouts.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_subscriptions_refused",
        "Topic filters refused with 0x97 for the subscription limits",
        None,
        m.subscriptions_refused.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_persistent_sessions_refused",
        "CONNECTs refused because max_persistent_sessions was reached",
        None,
        m.persistent_sessions_refused.load(Relaxed),
    )?;
    Ok(())
}

/// Authentication, authorization and abuse-rate refusals.
fn mqtt_security(e: &mut Enc<'_>, m: &Metrics) -> Result<(), Error> {
    e.counter(
        "statehub_mqtt_auth_failures",
        "Authentications refused (wrong or missing credentials, expired or forged tokens), after the constant delay",
        None,
        m.auth_failures.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_reauthentications",
        "Re-authentications (AUTH 0x19) that replaced a connection's credential",
        None,
        m.reauthentications.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_credentials_expired",
        "Connections closed because their token or certificate expired",
        None,
        m.credentials_expired.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_tls_handshake_failures",
        "TLS handshakes that failed or timed out on an MQTT listener",
        None,
        m.tls_handshake_failures.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_connects_denied",
        "CONNECTs and wills refused by the authorization rules (0x87)",
        None,
        m.connects_denied.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_publishes_denied",
        "PUBLISHes refused by the authorization rules or the built-in protections (0x87)",
        None,
        m.publishes_denied.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_subscriptions_denied",
        "Topic filters refused by the authorization rules or the built-in protections (0x87)",
        None,
        m.subscriptions_denied.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_connects_rate_limited",
        "CONNECTs refused with 0x9F for the connection rate per source address",
        None,
        m.connects_rate_limited.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_publish_rate_exceeded",
        "Connections closed with 0x96 for max_publish_rate",
        None,
        m.publish_rate_exceeded.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_reauth_rate_exceeded",
        "Connections closed with 0x96 for max_reauth_per_minute",
        None,
        m.reauth_rate_exceeded.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_bandwidth_throttles",
        "Times a connection's socket was left unread for max_bytes_per_second",
        None,
        m.bandwidth_throttles.load(Relaxed),
    )?;
    e.counter(
        "statehub_mqtt_bandwidth_throttled",
        "Time connections spent unread for max_bytes_per_second, all together",
        Some(Unit::Seconds),
        m.bandwidth_throttled_micros.load(Relaxed) as f64 / 1e6,
    )?;
    Ok(())
}

fn mqtt_sessions(e: &mut Enc<'_>, g: &Gauges) -> Result<(), Error> {
    let sessions = [
        (["online"], g.sessions_online),
        (["offline"], g.sessions_offline),
    ];
    e.gauges(
        "statehub_mqtt_sessions",
        "Sessions, by whether a connection is attached",
        None,
        &["state"],
        &sessions,
    )?;
    e.gauge(
        "statehub_mqtt_sessions_persistent",
        "Sessions kept beyond their connection (Session Expiry above 0)",
        None,
        g.sessions_persistent,
    )?;
    e.gauge(
        "statehub_mqtt_queued_messages",
        "Messages queued in all sessions, pending and in flight",
        None,
        g.queued_messages,
    )?;
    e.gauge(
        "statehub_mqtt_queued",
        "Bytes of the messages queued in all sessions",
        Some(Unit::Bytes),
        g.queued_bytes,
    )?;
    e.gauge(
        "statehub_mqtt_retained_messages",
        "Retained messages",
        None,
        g.retained_messages,
    )
}

fn state_store(e: &mut Enc<'_>, source: &dyn StateStoreSource) -> Result<(), Error> {
    let s = source.snapshot();
    let mut requests = Vec::with_capacity(COMMANDS.len() * RESULTS.len());
    for (c, command) in COMMANDS.iter().enumerate() {
        for (r, result) in RESULTS.iter().enumerate() {
            requests.push(([*command, *result], s.counts.requests[c][r]));
        }
    }
    e.counters(
        "statehub_state_store_requests",
        "State store requests, by command and result (error: a -ERR reply)",
        None,
        &["command", "result"],
        &requests,
    )?;
    e.histogram(
        "statehub_state_store_request_duration",
        "State store request latency, arrival to reply published (durable with --data-dir)",
        &s.latency,
    )?;
    e.gauge("statehub_state_store_keys", "Keys held", None, s.stats.keys)?;
    e.gauge(
        "statehub_state_store_size",
        "Bytes of the keys and values held",
        Some(Unit::Bytes),
        s.stats.bytes,
    )?;
    e.gauge(
        "statehub_state_store_observations",
        "KEYNOTIFY observations (client and key pairs)",
        None,
        s.observations,
    )?;
    e.counter(
        "statehub_state_store_notifications",
        "KEYNOTIFY notifications sent",
        None,
        s.counts.notifications,
    )?;
    e.counter(
        "statehub_state_store_busy_refusals",
        "State store requests refused (503) because the store's own thread had state_store.network_queue waiting (--redis only)",
        None,
        s.busy_refusals,
    )
}

fn storage(e: &mut Enc<'_>, store: &Store) -> Result<(), Error> {
    let s = store.io_stats();
    e.histogram(
        "statehub_storage_fsync_duration",
        "fsync/fdatasync latency of journal segments",
        &s.fsync,
    )?;
    e.gauge(
        "statehub_storage_journal_size",
        "Bytes of journal segments on disk",
        Some(Unit::Bytes),
        s.journal_bytes,
    )?;
    e.gauge(
        "statehub_storage_journal_segments",
        "Journal segments on disk",
        None,
        s.journal_segments,
    )?;
    e.gauge(
        "statehub_storage_snapshot_size",
        "Bytes of the current snapshot",
        Some(Unit::Bytes),
        s.snapshot_bytes,
    )?;
    let compactions = [(["ok"], s.compactions), (["failed"], s.compaction_failures)];
    e.counters(
        "statehub_storage_compactions",
        "Compactions of the journal into a snapshot, by result",
        None,
        &["result"],
        &compactions,
    )
}

fn webpubsub(e: &mut Enc<'_>, wps: &WebPubSub) -> Result<(), Error> {
    let c = wps.counters();
    e.gauge(
        "statehub_webpubsub_connections",
        "Open Web PubSub client sockets",
        None,
        c.connections,
    )?;
    e.gauge(
        "statehub_webpubsub_sessions",
        "Web PubSub sessions (reliable ones awaiting recovery included)",
        None,
        c.sessions,
    )?;
    e.gauge(
        "statehub_webpubsub_groups",
        "Groups with at least one member, over every hub",
        None,
        c.groups,
    )?;
    e.gauge("statehub_webpubsub_hubs", "Hubs in use", None, c.hubs)?;
    webpubsub_traffic(e, &c)
}

fn webpubsub_traffic(e: &mut Enc<'_>, c: &Counters) -> Result<(), Error> {
    e.counter(
        "statehub_webpubsub_messages_received",
        "Frames received from clients",
        None,
        c.messages_in,
    )?;
    e.counter(
        "statehub_webpubsub_messages_sent",
        "Data messages queued to clients (one per recipient)",
        None,
        c.messages_out,
    )?;
    e.counters(
        "statehub_webpubsub_acks",
        "Acks sent, by result",
        None,
        &["result"],
        &[(["ok"], c.acks_ok), (["error"], c.acks_error)],
    )?;
    e.counter(
        "statehub_webpubsub_sequence_acks",
        "sequenceAck messages received",
        None,
        c.sequence_acks,
    )?;
    e.counters(
        "statehub_webpubsub_recoveries",
        "Reliable session recoveries, by result",
        None,
        &["result"],
        &[(["ok"], c.recoveries_ok), (["failed"], c.recoveries_failed)],
    )?;
    e.counter("statehub_webpubsub_replay_lost_sessions", "Reliable sessions ended because their replay buffer no longer held every unacknowledged message", None, c.replay_lost_sessions)?;
    e.counter(
        "statehub_webpubsub_slow_consumers",
        "Connections closed because their outbound queue filled up",
        None,
        c.slow_consumers,
    )?;
    e.counters(
        "statehub_webpubsub_limit_refusals",
        "Refusals by a bound: connections_per_hub (handshake 429), groups_per_connection (join or handshake refused), kept_sends (a send refused while its hub keeps 10,000 waiting behind a client stream fragment's answer from the cluster)",
        None,
        &["limit"],
        &[
            (["connections_per_hub"], c.hub_full_refusals),
            (["groups_per_connection"], c.group_limit_refusals),
            (["kept_sends"], c.kept_refusals),
        ],
    )?;
    let written = c
        .replay_evictions
        .saturating_sub(c.replay_evictions_unwritten);
    let evictions = [
        (["true"], written),
        (["false"], c.replay_evictions_unwritten),
    ];
    e.counters("statehub_webpubsub_buffer_evictions", "Messages evicted from replay buffers unacknowledged, by whether they had been written to the socket", None, &["written"], &evictions)?;
    webpubsub_upstream(e, c)
}

/// Upstream CloudEvents calls.
fn webpubsub_upstream(e: &mut Enc<'_>, c: &Counters) -> Result<(), Error> {
    let calls = [
        (["ok"], c.upstream_ok),
        (["rejected"], c.upstream_rejected),
        (["failed"], c.upstream_failed),
    ];
    e.counters(
        "statehub_webpubsub_upstream_calls",
        "Upstream event handler calls, by result (rejected: a non-2xx answer)",
        None,
        &["result"],
        &calls,
    )?;
    e.counter(
        "statehub_webpubsub_upstream_dropped",
        "Fire-and-forget upstream events dropped because their queue was full",
        None,
        c.upstream_dropped,
    )?;
    e.histogram(
        "statehub_webpubsub_upstream_call_duration",
        "Upstream event handler call latency",
        &c.upstream_latency,
    )
}
