//! Settings from three places, strongest first: command-line flags, `STATEHUB_*`
//! environment variables (clap reads both), and the TOML file given by `--config`.
//! Anything none of them sets keeps its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use statehub_broker::BrokerConfig;
use statehub_state_store_service::Settings as StateStoreSettings;
use statehub_storage::{SyncPolicy, SyncPolicyParseError};
use statehub_webpubsub::Config as WebPubSubConfig;

/// `statehub serve` flags. Each has an environment variable of the same name.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "STATEHUB_CONFIG")]
    pub config: Option<PathBuf>,
    /// MQTT listener address (default 0.0.0.0:1883; port 0 picks a free port).
    #[arg(long, env = "STATEHUB_MQTT_LISTEN")]
    pub mqtt_listen: Option<SocketAddr>,
    /// HTTP listener address (default 0.0.0.0:8080; port 0 picks a free port).
    #[arg(long, env = "STATEHUB_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// MQTT worker threads, each a single-threaded runtime (default: one per core).
    #[arg(long, env = "STATEHUB_MQTT_THREADS")]
    pub mqtt_threads: Option<usize>,
    /// Web PubSub access key (give it twice for primary and secondary; the env
    /// variable takes a comma-separated list). Tokens signed with any of them are
    /// accepted on `/client/hubs/{hub}` and the REST API; replaces the file's keys.
    #[arg(
        long = "access-key",
        env = "STATEHUB_ACCESS_KEYS",
        value_delimiter = ','
    )]
    pub access_keys: Vec<String>,
    /// Seconds to wait for connections to close on shutdown (default 5).
    #[arg(long, env = "STATEHUB_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
    /// Keep the state store in this directory and lose nothing acknowledged across a
    /// crash or restart (default: in memory only). One statehub per directory.
    #[arg(long, env = "STATEHUB_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// With --data-dir: `always` (fsync before every acknowledgement, shared by
    /// concurrent writers; the default) or `interval=<ms>` (acknowledge once written to
    /// the OS, fsync every <ms>: a power failure may lose the last <ms> of writes).
    #[arg(long, env = "STATEHUB_SYNC")]
    pub sync: Option<SyncPolicy>,
}

/// The TOML file's shape.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub mqtt_listen: Option<SocketAddr>,
    pub http_listen: Option<SocketAddr>,
    pub shutdown_grace_secs: Option<u64>,
    pub mqtt_threads: Option<usize>,
    pub mqtt: BrokerConfig,
    /// The `[state_store]` table: quotas, node id, duplicate-request cache.
    pub state_store: StateStoreSettings,
    /// Web PubSub access keys (see `ServeArgs::access_keys`); kept for files written
    /// before the `[webpubsub]` table, whose `access_keys` take precedence.
    pub access_keys: Vec<String>,
    /// See `ServeArgs::data_dir`.
    pub data_dir: Option<PathBuf>,
    /// See `ServeArgs::sync` (`"always"` or `"interval=<ms>"`).
    pub sync: Option<String>,
    /// With a data dir: how much closed journal compaction waits for, in MiB (1 to
    /// 4096; default 64; half the snapshot if that is more). Smaller keeps a small
    /// store's disk footprint smaller at the cost of compacting more often (see
    /// `statehub_storage::Options::compact_after_bytes`).
    pub compact_after_mib: Option<u64>,
    /// With a data dir: how much closed journal compaction may fall behind before writes
    /// wait for it, in MiB (1 to 1048576; default 256; twice the compaction threshold if
    /// that is more). Bounds the disk used and the start-up time under a write flood
    /// (see `statehub_storage::Options::max_journal_bytes`).
    pub max_journal_mib: Option<u64>,
    /// The `[webpubsub]` table: access keys, limits, per-hub event handlers.
    pub webpubsub: WebPubSubConfig,
}

/// The journal's sizes from the file (`compact_after_mib`, `max_journal_mib`), in bytes:
/// each from 1 MiB to its maximum, and only with a data directory.
fn journal_sizes(
    file: &FileConfig,
    data_dir: bool,
    path: Option<&Path>,
) -> Result<(u64, u64), ConfigError> {
    let defaults = statehub_storage::Options::default();
    let mib = |key, value: Option<u64>, max, default| match value {
        Some(_) if !data_dir => Err(ConfigError::JournalWithoutDataDir(key)),
        Some(mib) if !(1..=max).contains(&mib) => Err(ConfigError::Mib {
            path: path.map(Path::to_owned).unwrap_or_default(),
            key,
            value: mib,
            max,
        }),
        Some(mib) => Ok(mib << 20),
        None => Ok(default),
    };
    Ok((
        mib(
            "compact_after_mib",
            file.compact_after_mib,
            4096,
            defaults.compact_after_bytes,
        )?,
        mib(
            "max_journal_mib",
            file.max_journal_mib,
            1 << 20,
            defaults.max_journal_bytes,
        )?,
    ))
}

/// Why the configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid config file {path}: sync: {source}")]
    Sync {
        path: PathBuf,
        source: SyncPolicyParseError,
    },
    #[error("sync is set to {0} but there is no data_dir: an in-memory store has nothing to sync")]
    SyncWithoutDataDir(SyncPolicy),
    #[error("invalid config file {path}: {key} is {value}; expected 1 to {max}")]
    Mib {
        path: PathBuf,
        key: &'static str,
        value: u64,
        max: u64,
    },
    #[error("{0} is set but there is no data_dir: an in-memory store has no journal")]
    JournalWithoutDataDir(&'static str),
    #[error(transparent)]
    WebPubSub(#[from] statehub_webpubsub::config::ConfigError),
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub mqtt_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub shutdown_grace_secs: u64,
    pub mqtt_threads: usize,
    pub broker: BrokerConfig,
    pub state_store: StateStoreSettings,
    /// Web PubSub, with its access keys resolved (flag/env, then `[webpubsub]`, then
    /// the top-level `access_keys`).
    pub webpubsub: WebPubSubConfig,
    /// `None`: the in-memory store.
    pub data_dir: Option<PathBuf>,
    pub sync: SyncPolicy,
    /// How much closed journal compaction waits for, in bytes.
    pub compact_after_bytes: u64,
    /// How far compaction may fall behind before writes wait, in bytes.
    pub max_journal_bytes: u64,
}

impl Settings {
    pub fn resolve(args: &ServeArgs) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => load(path)?,
            None => FileConfig::default(),
        };
        let file_sync = match (&file.sync, &args.config) {
            (Some(text), Some(path)) => {
                Some(
                    text.parse::<SyncPolicy>()
                        .map_err(|source| ConfigError::Sync {
                            path: path.clone(),
                            source,
                        })?,
                )
            }
            _ => None,
        };
        let data_dir = args.data_dir.clone().or(file.data_dir.clone());
        let sync = args.sync.or(file_sync);
        if let (None, Some(sync)) = (&data_dir, sync) {
            return Err(ConfigError::SyncWithoutDataDir(sync));
        }
        let (compact_after_bytes, max_journal_bytes) =
            journal_sizes(&file, data_dir.is_some(), args.config.as_deref())?;
        Ok(Settings {
            mqtt_listen: args
                .mqtt_listen
                .or(file.mqtt_listen)
                .unwrap_or(([0, 0, 0, 0], 1883).into()),
            http_listen: args
                .http_listen
                .or(file.http_listen)
                .unwrap_or(([0, 0, 0, 0], 8080).into()),
            shutdown_grace_secs: args
                .shutdown_grace_secs
                .or(file.shutdown_grace_secs)
                .unwrap_or(5),
            mqtt_threads: args
                .mqtt_threads
                .or(file.mqtt_threads)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
                .max(1),
            broker: file.mqtt,
            state_store: file.state_store,
            webpubsub: {
                let mut wps = file.webpubsub;
                if !args.access_keys.is_empty() {
                    wps.access_keys = args.access_keys.clone();
                } else if wps.access_keys.is_empty() {
                    wps.access_keys = file.access_keys;
                }
                wps.validate()?;
                wps
            },
            data_dir,
            sync: sync.unwrap_or_default(),
            compact_after_bytes,
            max_journal_bytes,
        })
    }
}

fn load(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.into(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.into(),
        source: Box::new(source),
    })
}
