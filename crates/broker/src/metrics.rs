//! Broker counters (atomics; read by the HTTP metrics endpoint in a later issue).

use std::sync::atomic::AtomicU64;

/// Monotonic counters. Relaxed ordering: they are statistics, not synchronization.
#[derive(Debug, Default)]
pub struct Metrics {
    pub connections_total: AtomicU64,
    pub messages_in: AtomicU64,
    pub messages_out: AtomicU64,
    /// Messages not delivered because a session queue was full (QoS 0) or the
    /// session was offline and full (QoS 1/2).
    pub dropped: AtomicU64,
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
    /// Messages not queued because every session together held the broker-wide
    /// bound (`max_total_queued_*`); also counted in `dropped` or `slow_consumers`.
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
