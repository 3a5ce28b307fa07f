//! Broker settings. Defaults are what a production broker should do; the Eclipse
//! Paho interoperability suite expects a few reference-broker quirks, which are
//! switches here (see `tests/paho-interop.toml`).

use serde::Deserialize;

/// Everything the broker core can be told. Deserialized from the `[mqtt]` table of
/// the TOML config file; every field has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Largest packet accepted from a client (advertised as Maximum Packet Size).
    pub max_packet_size: u32,
    /// Receive Maximum advertised to clients: QoS 2 messages a client may have
    /// un-released at once, and QoS 1/2 PUBLISHes whose acknowledgement is not sent
    /// yet (it waits for a cluster, retain or session store write). Exceeding it is
    /// DISCONNECT 0x93; an MQTT 3.1.1 connection is not read past the second bound.
    pub receive_maximum: u16,
    /// Topic Alias Maximum advertised to clients (aliases they may use towards us);
    /// also the most aliases we assign to one client (each is a topic kept for the
    /// connection's life).
    pub topic_alias_maximum: u16,
    /// Assign topic aliases on messages to clients that allow them.
    pub server_topic_aliases: bool,
    /// Largest keep alive a client may ask for; a larger (or zero, if
    /// `keep_alive_zero_allowed` is false) request is answered with Server Keep Alive.
    pub max_keep_alive: u16,
    /// Whether a client may disable keep alive with 0.
    pub keep_alive_zero_allowed: bool,
    /// Upper bound on the Session Expiry Interval a client may ask for (seconds); a
    /// larger request, and an MQTT 3.1.1 session without Clean Session, gets this one
    /// (told in the CONNACK's Session Expiry Interval to MQTT 5 clients). Set to
    /// 4294967295, a session that asks for it (and every 3.1.1 one) never expires.
    pub max_session_expiry: u32,
    /// Sessions kept beyond their connection (Session Expiry above 0) at once; a
    /// CONNECT that would make one more gets CONNACK 0x97 Quota exceeded (3.1.1:
    /// return code 3, Server unavailable). Resuming or replacing one is always allowed.
    pub max_persistent_sessions: usize,
    /// Messages queued per session (pending and in flight) while it is offline; a
    /// connected session may hold 1.5x this before it is a slow consumer (0x97).
    pub max_queued_messages: usize,
    /// Bytes of payload and topic queued per offline session (1.5x while connected, as
    /// above).
    pub max_queued_bytes: usize,
    /// Messages queued (pending and in flight) across every session. Past it, a
    /// message for an offline session is dropped (counted, logged), and a connected
    /// session that cannot take one is disconnected with 0x97 like a slow consumer.
    pub max_total_queued_messages: usize,
    /// Bytes of payload and topic queued across every session (as above). A message
    /// shared by several sessions counts once per session.
    pub max_total_queued_bytes: usize,
    /// The high-water mark of a connected session's backlog (messages queued and in
    /// flight; at most `max_queued_messages`): a client whose QoS 1/2 PUBLISH is
    /// routed to a session past it stops being read until every such session has
    /// drained to half the mark (publisher back-pressure; see docs/limits.md).
    pub backpressure_high_water: usize,
    /// The same in bytes of payload and topic queued (at most `max_queued_bytes`).
    pub backpressure_high_water_bytes: usize,
    /// Seconds a connected session may stay past its high-water mark while
    /// publishers wait for it; then it is a slow consumer: DISCONNECT 0x97, and the
    /// publishers go on. 0 turns publisher back-pressure off (a subscriber that falls
    /// behind is then cut off only at 1.5 x `max_queued_messages`).
    pub slow_consumer_timeout_secs: u64,
    /// What a QoS 1/2 message meets at an offline session whose queue (or every
    /// session's together) is full; see [`QueueFull`].
    pub queue_full_policy: QueueFull,
    /// Queue QoS 0 messages for offline sessions (Mosquitto's `queue_qos0_messages`).
    pub queue_qos0_offline: bool,
    /// Topic filters whose subscription is refused with 0x80 (Not authorized is
    /// 0x87; the Paho suite expects the generic 0x80 for `test/nosubscribe`).
    pub refused_filters: Vec<String>,
    /// Bytes buffered for a socket before the broker stops draining the session
    /// queue into it (the queue then fills and the slow-consumer policy applies).
    pub socket_write_high_water: usize,
    /// Seconds a client has to send CONNECT (and finish any AUTH exchange) after the
    /// TCP connection opens.
    pub connect_timeout_secs: u64,
    /// Maximum concurrent client connections that have sent CONNECT; further ones get
    /// CONNACK 0x97 (Quota exceeded; return code 3 for MQTT 3.1.1). Connections that
    /// have not sent CONNECT yet are bounded by the two settings below instead.
    pub max_connections: usize,
    /// Connections open without a CONNECT yet, in total. At the limit, the oldest of
    /// them is closed to make room if it has been silent for a second (a real client
    /// sends CONNECT at once; a socket that stays silent is the one to go), else the
    /// new one is closed.
    pub max_pending_connections: usize,
    /// Connections open without a CONNECT yet from one IPv4 address (one /64 prefix
    /// for IPv6), with the same rule at the limit.
    pub max_pending_per_address: usize,
    /// Seconds a packet may take to arrive once its first byte has (the keep alive
    /// counts any byte, so a packet trickled a byte at a time would hold its buffer
    /// for ever without this). The connection is closed without a DISCONNECT.
    pub packet_read_timeout_secs: u64,
    /// Most topic levels in a topic name or filter (each level is a node of the
    /// subscription or retained index). A SUBSCRIBE filter over it gets 0x8F, a
    /// PUBLISH over it 0x90 (PUBACK/PUBREC for QoS 1/2, DISCONNECT for QoS 0), a will
    /// topic over it CONNACK 0x90.
    pub max_topic_levels: usize,
    /// Most topic filters handled in one SUBSCRIBE; the ones after it get 0x97 (Quota
    /// exceeded; 0x80 for MQTT 3.1.1) in the SUBACK.
    pub max_filters_per_subscribe: usize,
    /// Most subscriptions one session holds; a new filter beyond it gets 0x97 (0x80
    /// for MQTT 3.1.1) in the SUBACK (replacing an existing one is always allowed).
    pub max_subscriptions_per_client: usize,
    /// How a message matching several subscriptions of one client is delivered
    /// (MQTT 5 allows both [MQTT-3.3.4-2], [MQTT-3.3.4-3]).
    pub overlapping_subscriptions: Overlap,
    /// Milliseconds from a CONNECT (or AUTH) with wrong credentials to its refusal
    /// (±10%), whatever the check took: the timing tells nothing about which part
    /// was wrong, and guessing is slow. 0 answers at once.
    pub auth_failure_delay_ms: u64,
    /// New connections per second one source address (IPv4 address, IPv6 /64) may
    /// open once its burst (`connect_burst_per_address`) is spent; past it a CONNECT
    /// gets CONNACK 0x9F Connection rate exceeded (3.1.1: return code 3). 0: no limit.
    pub connect_rate_per_address: u32,
    /// Connections one source address may open at once before the rate applies.
    pub connect_burst_per_address: u32,
    /// PUBLISH packets per second one connection may send, with a burst of one
    /// second's worth; past it the connection is closed with DISCONNECT 0x96 Message
    /// rate too high (3.1.1: closed). 0: no limit.
    pub max_publish_rate: u32,
    /// Seconds between updates of the `$SYS/broker/...` topics (Mosquitto's names and
    /// `sys_interval`), retained messages the broker publishes from its counters. 0:
    /// no `$SYS` topics.
    pub sys_interval_secs: u64,
    /// Bytes per second one connection may send (every byte of every packet as read
    /// from the socket; over TLS the decrypted bytes), as a token bucket holding
    /// `max_bytes_burst`. Past it the broker stops reading the socket until the bucket
    /// has refilled: the client is slowed by TCP's flow control, nothing is dropped or
    /// refused, the read buffer stays bounded, and the pause does not count against
    /// the client's keep alive or packet deadline. A `[[mqtt.listeners]]` entry may
    /// set its own. 0: no limit.
    pub max_bytes_per_second: u64,
    /// Bytes one connection may send at once before `max_bytes_per_second` applies;
    /// 0: one second's worth.
    pub max_bytes_burst: u64,
    /// Re-authentications (AUTH 0x19) one connection may start per minute, with a
    /// burst of a minute's worth: each checks a credential (a token's signature), so
    /// a client looping on AUTH would cost far more than its packets. Past it the
    /// connection is closed with DISCONNECT 0x96 Message rate too high. 0: no limit.
    pub max_reauth_per_minute: u32,
}

/// What a QoS 1/2 message for an offline session meets when the session's queue
/// (`max_queued_messages`, `max_queued_bytes`) or what all sessions queue together
/// (`max_total_queued_*`) is full. QoS 0 copies are dropped whatever the policy, and a
/// connected session that falls that far behind is a slow consumer (DISCONNECT 0x97)
/// whatever the policy. Every message dropped or refused is counted in
/// [`Metrics`](crate::Metrics) and logged (rate-limited, naming the session).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QueueFull {
    /// The session's oldest queued messages make room for the new one. Messages in
    /// flight, and QoS 2 messages that may have reached the client before a restart,
    /// are never dropped; if only those fill the queue, the new message is dropped
    /// for that session instead. The publisher's acknowledgement is unchanged.
    #[default]
    DropOldest,
    /// The new message is not queued for that session (Mosquitto's behaviour); the
    /// other subscribers get it and the publisher's acknowledgement is unchanged.
    DropNewest,
    /// A client's QoS 1/2 PUBLISH that a full queue would have to take is delivered
    /// to nobody and not retained: an MQTT 5 publisher gets PUBACK/PUBREC 0x97 (Quota
    /// exceeded); an MQTT 3.1.1 one, which cannot be told, has its connection closed
    /// without the acknowledgement (it resends the message when it reconnects).
    /// Messages the broker makes (wills, service replies) fall back to drop-newest.
    Refuse,
}

/// Delivery of a message that matches several subscriptions of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// One copy with the highest QoS and every matching subscription identifier.
    #[default]
    Single,
    /// One copy per matching subscription, each with its own QoS and identifier.
    PerSubscription,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            max_packet_size: 1024 * 1024,
            receive_maximum: 1024,
            topic_alias_maximum: 64,
            server_topic_aliases: false,
            max_keep_alive: 0,
            keep_alive_zero_allowed: true,
            max_session_expiry: 24 * 3600,
            max_persistent_sessions: 100_000,
            max_queued_messages: 10_000,
            max_queued_bytes: 64 * 1024 * 1024,
            max_total_queued_messages: 1_000_000,
            max_total_queued_bytes: 1024 * 1024 * 1024,
            backpressure_high_water: 1000,
            backpressure_high_water_bytes: 8 * 1024 * 1024,
            slow_consumer_timeout_secs: 10,
            queue_full_policy: QueueFull::DropOldest,
            queue_qos0_offline: false,
            refused_filters: Vec::new(),
            socket_write_high_water: 1024 * 1024,
            connect_timeout_secs: 5,
            max_connections: 100_000,
            max_pending_connections: 8192,
            max_pending_per_address: 1024,
            packet_read_timeout_secs: 30,
            max_topic_levels: 128,
            max_filters_per_subscribe: 256,
            max_subscriptions_per_client: 1000,
            overlapping_subscriptions: Overlap::Single,
            auth_failure_delay_ms: 1000,
            connect_rate_per_address: 100,
            connect_burst_per_address: 5000,
            max_publish_rate: 0,
            sys_interval_secs: 0,
            max_bytes_per_second: 0,
            max_bytes_burst: 0,
            max_reauth_per_minute: 10,
        }
    }
}
