//! Command-line arguments of the `mqtt` scenario ([`MqttArgs`], [`TopicMode`]).
//!
//! Kept apart from the code that runs the scenario so the CLI surface can be
//! read (and reviewed for compatibility) in one place.

use clap::{Args, ValueEnum};

use super::HEADER_LEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopicMode {
    /// Every publisher publishes to one topic; every subscriber subscribes to it.
    Shared,
    /// Publisher i publishes to its own topic. Subscribers are spread over the
    /// topics: with M >= N subscriber j takes topic j mod N, otherwise subscriber j
    /// takes every topic i with i mod M == j.
    PerPublisher,
    /// Publisher i publishes to its own topic `…/p/{i}`; every subscriber subscribes
    /// to the single filter `…/p/+` and so receives every publisher's messages
    /// (fan-in: many devices, one consumer).
    Wildcard,
}

#[derive(Debug, Args)]
pub struct MqttArgs {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Connect over TLS, verifying the broker with this PEM CA file.
    /// Port the subscribers connect to, if not `--port` (another node of a cluster on
    /// the same host: publishers on one node, subscribers on another).
    #[arg(long)]
    pub subscriber_port: Option<u16>,

    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the broker's certificate must carry (with --tls-ca).
    #[arg(long, default_value = "localhost")]
    pub tls_name: String,
    /// Number of publishing connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub publishers: u32,
    /// Number of subscribing connections (0: measure publishing only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub subscribers: u32,
    /// QoS of publishes and subscriptions.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: u8,
    /// Messages each publisher sends [default: 10000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub messages_per_publisher: Option<u64>,
    /// Publish for this many seconds instead of a fixed message count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Payload bytes per message (at least 20: the timestamp header).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(HEADER_LEN as i64..=16 * 1024 * 1024))]
    pub payload_size: u32,
    /// Topic layout.
    #[arg(long, value_enum, default_value_t = TopicMode::Shared)]
    pub topic_mode: TopicMode,
    /// Speak MQTT 3.1.1 instead of MQTT 5.
    #[arg(long)]
    pub v311: bool,
    /// QoS 1: PUBLISHes in flight (awaiting PUBACK) per publisher; capped by the
    /// broker's Receive Maximum under MQTT 5.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Messages per second per publisher (0: as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Seconds allowed for connecting and subscribing all clients.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// After publishing: seconds without progress before outstanding PUBACKs and
    /// deliveries are given up as lost.
    #[arg(long, default_value_t = 5.0)]
    pub drain_timeout: f64,
    /// Hard limit in seconds on the publishing phase.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Topic prefix; a per-run id is appended so runs never see each other's messages.
    #[arg(long, default_value = "statehub-bench")]
    pub topic_prefix: String,
    /// Process id of the broker, when it runs on this machine: its CPU time (from
    /// /proc) from the start of publishing until delivery ends is reported.
    #[arg(long)]
    pub broker_pid: Option<u32>,
    /// Exit with status 1 if any expected message was lost (or any QoS 1 PUBACK missing).
    #[arg(long)]
    pub fail_on_loss: bool,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}
