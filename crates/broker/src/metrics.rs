//! Broker counters (atomics), read through `Broker::metrics`; no endpoint serves them yet.

use std::sync::atomic::AtomicU64;

/// Monotonic counters. Relaxed ordering: they are statistics, not synchronization.
#[derive(Debug, Default)]
pub struct Metrics {
    pub connections_total: AtomicU64,
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
    /// Messages over a client's Maximum Packet Size, discarded as the spec says.
    pub oversize_dropped: AtomicU64,
    /// Connections closed with 0x97 because they did not keep up.
    pub slow_consumers: AtomicU64,
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
    /// TLS handshakes that failed or timed out (each logged, rate-limited).
    pub tls_handshake_failures: AtomicU64,
    /// CONNECTs and re-authentications refused by the authenticator (bad
    /// credentials, an anonymous client where none may be).
    pub auth_failures: AtomicU64,
    /// Successful re-authentications (AUTH 0x19 answered with AUTH 0x00).
    pub reauthentications: AtomicU64,
    /// Connections closed because their credential (token, certificate) expired
    /// without a re-authentication.
    pub credentials_expired: AtomicU64,
}
