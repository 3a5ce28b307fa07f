//! Broker counters (atomics), read through `Broker::metrics` and `Broker::gauges`; the
//! binary serves them. Relaxed ordering throughout: they are statistics, not
//! synchronization, and each costs one uncontended atomic add where it is counted.

use std::sync::atomic::{AtomicU64, Ordering};

use statehub_mqtt_codec::{Packet, ReasonCode};

/// Monotonic counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Connections that sent a CONNECT (accepted or not).
    pub connections_total: AtomicU64,
    /// Connections answered with a successful CONNACK.
    pub connections_accepted: AtomicU64,
    /// CONNECTs refused with a CONNACK, by reason code (see [`Refusals`]).
    pub connections_refused: Refusals,
    /// Control packets read from clients, by type.
    pub packets_in: PacketCounts,
    /// Control packets written to clients, by type.
    pub packets_out: PacketCounts,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
    /// Messages not delivered because a session queue was full: the sum of
    /// `dropped_qos0_queue_full`, `dropped_queue_full_newest` and
    /// `dropped_queue_full_oldest`.
    pub dropped: AtomicU64,
    /// QoS 0 copies not queued because the session's queue (or every session's
    /// together) was full.
    pub dropped_qos0_queue_full: AtomicU64,
    /// QoS 1/2 copies not queued for a full offline session: `queue_full_policy =
    /// "drop-newest"`, drop-oldest with nothing it may drop, and messages the broker
    /// makes under `refuse`.
    pub dropped_queue_full_newest: AtomicU64,
    /// Queued messages dropped from a full offline session to make room for a newer
    /// one (`queue_full_policy = "drop-oldest"`).
    pub dropped_queue_full_oldest: AtomicU64,
    /// Client PUBLISHes (QoS 1/2) delivered to nobody because a full offline
    /// session's queue would have had to take them (`queue_full_policy = "refuse"`):
    /// answered 0x97 (MQTT 5), or the connection closed (3.1.1, see
    /// `refused_quota_closed`).
    pub refused_quota: AtomicU64,
    /// Of `refused_quota`, the MQTT 3.1.1 publishers' connections closed without the
    /// acknowledgement (3.1.1 has no way to say Quota exceeded).
    pub refused_quota_closed: AtomicU64,
    /// Client PUBLISHes (QoS 1/2) refused because the other nodes of a cluster could
    /// not be given them (see `fabric.rs`): the reason code to MQTT 5, the connection
    /// closed for 3.1.1.
    pub cluster_refused: AtomicU64,
    /// QoS 2 copies of such a refused PUBLISH taken back from persistent sessions
    /// before they were sent (`Broker::withdraw_refused`).
    pub cluster_withdrawn: AtomicU64,
    /// Messages over a client's Maximum Packet Size, discarded as the spec says.
    pub oversize_dropped: AtomicU64,
    /// Connections closed with 0x97 because they did not keep up: past their
    /// high-water mark for `slow_consumer_timeout_secs` while publishers waited, or
    /// past 1.5 x the queue bounds.
    pub slow_consumers: AtomicU64,
    /// Times a publisher's connection stopped reading because a subscriber it routed
    /// a QoS 1/2 message to was past its high-water mark (publisher back-pressure).
    pub publisher_pauses: AtomicU64,
    /// Microseconds publishers' connections spent so paused, counted when each pause
    /// ends.
    pub publisher_paused_micros: AtomicU64,
    pub protocol_errors: AtomicU64,
    /// Outbound packets that could not be encoded (a message the broker cannot write:
    /// a topic or property over the protocol's length limits). Each is logged.
    pub encode_failures: AtomicU64,
    /// Queued messages dropped unsent because their Message Expiry Interval passed
    /// first (a delayed reply, a backlog).
    pub expired_dropped: AtomicU64,
    /// Connections closed before CONNECT to keep the pending-connection limits.
    pub pending_evicted: AtomicU64,
    /// Connections closed because a started packet did not arrive in time.
    pub packet_read_timeouts: AtomicU64,
    /// Topic filters refused with 0x97 for the per-SUBSCRIBE or per-client limit.
    pub subscriptions_refused: AtomicU64,
    /// Messages that met the broker-wide bound (`max_total_queued_*`); also counted
    /// in one of `dropped_*`, `refused_quota` or `slow_consumers`.
    pub total_queue_full: AtomicU64,
    /// CONNECTs refused with 0x97 because they would make one persistent session more
    /// than `max_persistent_sessions`.
    pub persistent_sessions_refused: AtomicU64,
    /// CONNECTs refused with 0x87 by the authorization rules (or a will topic they, or
    /// the built-in protections, do not allow).
    pub connects_denied: AtomicU64,
    /// PUBLISHes refused by the authorization rules or the built-in protections
    /// (PUBACK/PUBREC 0x87, or dropped: QoS 0, MQTT 3.1.1).
    pub publishes_denied: AtomicU64,
    /// SUBSCRIBE filters refused with 0x87 (0x80 for MQTT 3.1.1) likewise.
    pub subscriptions_denied: AtomicU64,
    /// CONNECTs refused with 0x9F: their source address opened connections faster
    /// than `connect_rate_per_address` allows.
    pub connects_rate_limited: AtomicU64,
    /// Connections closed with 0x96: they sent PUBLISH faster than `max_publish_rate`.
    pub publish_rate_exceeded: AtomicU64,
    /// Times a connection's socket was left unread because it sent faster than its
    /// `max_bytes_per_second`.
    pub bandwidth_throttles: AtomicU64,
    /// Microseconds connections spent so throttled, all together.
    pub bandwidth_throttled_micros: AtomicU64,
    /// TLS handshakes that failed or timed out (each logged, rate-limited).
    pub tls_handshake_failures: AtomicU64,
    /// CONNECTs and re-authentications refused by the authenticator (bad
    /// credentials, an anonymous client where none may be).
    pub auth_failures: AtomicU64,
    /// Successful re-authentications (AUTH 0x19 answered with AUTH 0x00).
    pub reauthentications: AtomicU64,
    /// Connections closed with 0x96: they re-authenticated more often than
    /// `max_reauth_per_minute`.
    pub reauth_rate_exceeded: AtomicU64,
    /// Connections closed because their credential (token, certificate) expired
    /// without a re-authentication.
    pub credentials_expired: AtomicU64,
}

/// The names of the MQTT control packet types, indexed by their number on the wire
/// (0 is reserved and never counted).
pub const PACKET_TYPES: [&str; 16] = [
    "reserved",
    "connect",
    "connack",
    "publish",
    "puback",
    "pubrec",
    "pubrel",
    "pubcomp",
    "subscribe",
    "suback",
    "unsubscribe",
    "unsuback",
    "pingreq",
    "pingresp",
    "disconnect",
    "auth",
];

/// The wire number of `p`'s packet type: its index in [`PACKET_TYPES`].
pub fn packet_type(p: &Packet) -> usize {
    match p {
        Packet::Connect(_) => 1,
        Packet::ConnAck(_) => 2,
        Packet::Publish(_) => 3,
        Packet::PubAck(_) => 4,
        Packet::PubRec(_) => 5,
        Packet::PubRel(_) => 6,
        Packet::PubComp(_) => 7,
        Packet::Subscribe(_) => 8,
        Packet::SubAck(_) => 9,
        Packet::Unsubscribe(_) => 10,
        Packet::UnsubAck(_) => 11,
        Packet::PingReq => 12,
        Packet::PingResp => 13,
        Packet::Disconnect(_) => 14,
        Packet::Auth(_) => 15,
    }
}

/// Packets and their bytes (fixed header included), per packet type.
#[derive(Debug, Default)]
pub struct PacketCounts {
    packets: [AtomicU64; 16],
    bytes: [AtomicU64; 16],
}

impl PacketCounts {
    /// Counts `n` packets of type `kind` (see [`packet_type`]) taking `bytes` in all.
    pub(crate) fn add(&self, kind: usize, n: u64, bytes: usize) {
        let kind = kind & 15;
        self.packets[kind].fetch_add(n, Ordering::Relaxed);
        self.bytes[kind].fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// (packets, bytes) per packet type, indexed as [`PACKET_TYPES`].
    pub fn snapshot(&self) -> [(u64, u64); 16] {
        std::array::from_fn(|i| {
            (
                self.packets[i].load(Ordering::Relaxed),
                self.bytes[i].load(Ordering::Relaxed),
            )
        })
    }
}

/// The first CONNACK reason code that refuses a connection; [`Refusals`] counts
/// 0x80..=0xA2 (every MQTT 5 error code) in one slot each.
const FIRST_REFUSAL: u8 = 0x80;

/// CONNECTs refused, per CONNACK reason code (3.1.1 return codes are counted under the
/// MQTT 5 code the broker chose before mapping).
#[derive(Debug)]
pub struct Refusals([AtomicU64; 35]);

impl Default for Refusals {
    fn default() -> Self {
        Refusals(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Refusals {
    pub(crate) fn add(&self, code: ReasonCode) {
        let slot = usize::from(code.0.saturating_sub(FIRST_REFUSAL)).min(self.0.len() - 1);
        self.0[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// (reason, count) for every reason counted at least once; the reason is the
    /// code's name in snake case (`bad_user_name_or_password`).
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        self.0
            .iter()
            .enumerate()
            .map(|(i, n)| (refusal_name(i), n.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

fn refusal_name(slot: usize) -> &'static str {
    const NAMES: [&str; 35] = [
        "unspecified_error",
        "malformed_packet",
        "protocol_error",
        "implementation_specific_error",
        "unsupported_protocol_version",
        "client_identifier_not_valid",
        "bad_user_name_or_password",
        "not_authorized",
        "server_unavailable",
        "server_busy",
        "banned",
        "server_shutting_down",
        "bad_authentication_method",
        "keep_alive_timeout",
        "session_taken_over",
        "topic_filter_invalid",
        "topic_name_invalid",
        "packet_identifier_in_use",
        "packet_identifier_not_found",
        "receive_maximum_exceeded",
        "topic_alias_invalid",
        "packet_too_large",
        "message_rate_too_high",
        "quota_exceeded",
        "administrative_action",
        "payload_format_invalid",
        "retain_not_supported",
        "qos_not_supported",
        "use_another_server",
        "server_moved",
        "shared_subscriptions_not_supported",
        "connection_rate_exceeded",
        "maximum_connect_time",
        "subscription_identifiers_not_supported",
        "wildcard_subscriptions_not_supported",
    ];
    NAMES.get(slot).copied().unwrap_or("other")
}

/// What the broker holds now, read at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Open client connections (CONNECT received, not yet closed).
    pub connections: u64,
    /// Sessions with a connection attached.
    pub sessions_online: u64,
    /// Sessions kept without a connection (waiting for their client or their expiry).
    pub sessions_offline: u64,
    /// Sessions kept beyond their connection (Session Expiry above 0), online or not.
    pub sessions_persistent: u64,
    /// Messages queued in every session together, pending and in flight.
    pub queued_messages: u64,
    /// Their bytes.
    pub queued_bytes: u64,
    /// Retained messages.
    pub retained_messages: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_named_by_reason_code() {
        let r = Refusals::default();
        r.add(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        r.add(ReasonCode::BAD_USER_NAME_OR_PASSWORD);
        r.add(ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED);
        r.add(ReasonCode::QUOTA_EXCEEDED);
        assert_eq!(
            r.snapshot(),
            vec![
                ("bad_user_name_or_password", 2),
                ("quota_exceeded", 1),
                ("wildcard_subscriptions_not_supported", 1)
            ]
        );
    }

    #[test]
    fn packet_counts_add_up_per_type() {
        let c = PacketCounts::default();
        c.add(packet_type(&Packet::PingReq), 1, 2);
        c.add(3, 5, 100);
        let s = c.snapshot();
        assert_eq!(s[12], (1, 2));
        assert_eq!(s[3], (5, 100));
        assert_eq!(PACKET_TYPES[12], "pingreq");
    }
}
