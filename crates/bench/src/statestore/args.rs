//! Command-line arguments of the `statestore` scenario ([`StateStoreArgs`]).
//!
//! Kept apart from the code that runs the scenario so the CLI surface can be
//! read (and reviewed for compatibility) in one place.

use clap::Args;

#[derive(Debug, Args)]
pub struct StateStoreArgs {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Connect over TLS, verifying the broker with this PEM CA file.
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the broker's certificate must carry (with --tls-ca).
    #[arg(long, default_value = "localhost")]
    pub tls_name: String,
    /// Number of client connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub clients: u32,
    /// Requests each client completes [default: 10000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub requests_per_client: Option<u64>,
    /// Send requests for this many seconds instead of a fixed count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Fraction of requests that are GETs (the rest are SETs); 0 = SET only, 1 = GET only.
    #[arg(long, default_value_t = 0.5)]
    pub ratio_get: f64,
    /// Number of distinct keys; each request picks one uniformly.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=999_999_999_999))]
    pub keys: u64,
    /// Bytes of every SET value.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=16 * 1024 * 1024))]
    pub value_size: u32,
    /// Requests each client keeps outstanding (1: wait for each response before
    /// the next request, like an SDK caller awaiting every call).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub pipeline: u16,
    /// Do not SET every key before measuring (GETs of unset keys are misses).
    #[arg(long)]
    pub no_populate: bool,
    /// Message Expiry Interval of every request, seconds (the SDK's request timeout).
    #[arg(long, default_value_t = 10)]
    pub message_expiry: u32,
    /// Seconds allowed for connecting and subscribing all clients.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Hard limit in seconds on populating and on the measured phase (each).
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Exit with status 1 if any request failed, timed out or (after populating) missed.
    #[arg(long)]
    pub fail_on_error: bool,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}
