//! Settings from three places, strongest first: command-line flags, `STATEHUB_*`
//! environment variables (clap reads both), and the TOML file given by `--config`.
//! Anything none of them sets keeps its default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use statehub_auth::tls::TlsFiles;
use statehub_broker::BrokerConfig;
use statehub_state_store_service::Settings as StateStoreSettings;
use statehub_storage::{SyncPolicy, SyncPolicyParseError};
use statehub_webpubsub::Config as WebPubSubConfig;

use crate::admin::AdminConfig;
use crate::auth_config::{
    self, AuthConfig, ListenerConfig, ListenerError, ListenerSettings, SecurityFlags,
};
use crate::authz::{AuthorizationConfig, Loaded};

/// `statehub serve` flags. Each has an environment variable of the same name.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "STATEHUB_CONFIG")]
    pub config: Option<PathBuf>,
    /// MQTT listener address, IP:PORT or HOST:PORT (default 0.0.0.0:1883; port 0 picks a free port). Not
    /// with `[[mqtt.listeners]]` in the config file.
    #[arg(long, env = "STATEHUB_MQTT_LISTEN", value_parser = crate::first_use::listen_addr)]
    pub mqtt_listen: Option<SocketAddr>,
    /// An MQTT listener with TLS (conventionally 0.0.0.0:8883), with --tls-cert and
    /// --tls-key, besides the plain one.
    #[arg(long, env = "STATEHUB_MQTTS_LISTEN", value_parser = crate::first_use::listen_addr)]
    pub mqtts_listen: Option<SocketAddr>,
    /// The server's TLS certificate chain (PEM) for --mqtts-listen and --http-tls.
    #[arg(long, env = "STATEHUB_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "STATEHUB_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// CA certificates (PEM) that client certificates of --mqtts-listen are verified
    /// against (mutual TLS; their subject becomes the user name).
    #[arg(long, env = "STATEHUB_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve HTTP (Web PubSub, REST, health) over TLS with --tls-cert and --tls-key.
    #[arg(long, env = "STATEHUB_HTTP_TLS")]
    pub http_tls: bool,
    /// Mosquitto password file (`statehub passwd` writes one); clients must then
    /// authenticate.
    #[arg(long, env = "STATEHUB_PASSWORD_FILE")]
    pub password_file: Option<PathBuf>,
    /// Accept clients without credentials from any address. Without it (and without
    /// authentication configured) they are accepted from loopback addresses only.
    #[arg(long, env = "STATEHUB_ALLOW_ANONYMOUS")]
    pub allow_anonymous: bool,
    /// HTTP listener address, IP:PORT or HOST:PORT (default 0.0.0.0:8080; port 0 picks a free port).
    #[arg(long, env = "STATEHUB_HTTP_LISTEN", value_parser = crate::first_use::listen_addr)]
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
    /// The dashboard's and admin API's key (at least 16 bytes; replaces the file's
    /// `[admin] key`). Without one, both are off.
    #[arg(long, env = "STATEHUB_ADMIN_KEY")]
    pub admin_key: Option<String>,
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
}

/// The TOML file's shape.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    #[serde(deserialize_with = "crate::first_use::de_listen_addr")]
    pub mqtt_listen: Option<SocketAddr>,
    #[serde(deserialize_with = "crate::first_use::de_listen_addr")]
    pub http_listen: Option<SocketAddr>,
    pub shutdown_grace_secs: Option<u64>,
    pub mqtt_threads: Option<usize>,
    pub mqtt: MqttTable,
    /// The `[authentication]` table: password file, tokens, X.509, anonymous access.
    pub authentication: AuthConfig,
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
    /// The `[http]` table: the HTTP listener's limits.
    pub http: HttpConfig,
    /// The `[admin]` table: the dashboard's key and limits.
    pub admin: AdminConfig,
    /// The `[cluster]` table: the state store in Redis (see `cluster.rs`).
    pub cluster: crate::cluster::ClusterConfig,
    /// The `[authorization]` table: rules, inline or in a file (see `authz.rs`).
    pub authorization: AuthorizationConfig,
}

/// The `[mqtt]` table: the broker's settings and the `[[mqtt.listeners]]`.
#[derive(Debug, Default, Deserialize)]
pub struct MqttTable {
    #[serde(flatten)]
    pub broker: BrokerConfig,
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
}

/// The `[http]` table: limits of the HTTP listener (health, the Web PubSub client
/// endpoint and REST API). They bound what a client that opens connections and sends
/// nothing, or one byte at a time, can hold.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Concurrent HTTP connections, upgraded WebSockets included; past it a new
    /// connection is answered 503 and closed. Default: sized from the file-descriptor
    /// limit at start-up (see `fds.rs`), at most 100,000.
    pub max_connections: Option<usize>,
    /// A request's head (request line and headers) must arrive within this many
    /// seconds of the connection opening or of the previous response (10).
    pub header_timeout_secs: u64,
    /// A request's body must be read and its response produced within this many
    /// seconds of its head (30); past it: 408 and the connection closes. Must exceed
    /// `[webpubsub.limits] upstream_timeout_secs`: a WebSocket handshake waits for the
    /// upstream `connect` handler.
    pub request_timeout_secs: u64,
    /// A connection (before any WebSocket upgrade) that moves no byte either way for
    /// this many seconds is closed (30): a client that stops reading its responses.
    pub idle_timeout_secs: u64,
    /// MQTT over WebSocket on `/mqtt` (true): the broker's clients, sessions and
    /// limits, on this listener.
    pub mqtt_websocket: bool,
    /// HTTPS and WSS: the `[http.tls]` table (`cert`, `key`).
    pub tls: Option<TlsFiles>,
    /// Bearer token that lets a scraper from another host read `/metrics` (loopback
    /// peers need none). Unset: `/metrics` answers 403 to non-loopback peers.
    pub metrics_token: Option<String>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_connections: None,
            header_timeout_secs: 10,
            request_timeout_secs: 30,
            idle_timeout_secs: 30,
            mqtt_websocket: true,
            tls: None,
            metrics_token: None,
        }
    }
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
    WebPubSub(#[from] statehub_webpubsub::ConfigError),
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminConfigError),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
    #[error("invalid [http] table: {0}")]
    Http(String),
    #[error(transparent)]
    Listeners(#[from] ListenerError),
    #[error("--http-tls needs --tls-cert and --tls-key")]
    HttpTlsFlags,
    #[error(transparent)]
    Authorization(#[from] crate::authz::AuthzError),
    /// A Web PubSub access key is refused; `origin` says where the keys came from.
    #[error("web pubsub access keys from {origin}: {source}")]
    AccessKey {
        origin: String,
        source: statehub_webpubsub::ConfigError,
    },
}

/// Everything `serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The MQTT listeners, with their TLS and authentication.
    pub mqtt_listeners: Vec<ListenerSettings>,
    /// The authentication methods listeners refer to.
    pub authentication: AuthConfig,
    pub http_listen: SocketAddr,
    pub shutdown_grace_secs: u64,
    pub mqtt_threads: usize,
    pub broker: BrokerConfig,
    /// Whether the file sets `[mqtt] max_connections` (else it is sized from the
    /// file-descriptor limit at start-up).
    pub mqtt_max_connections_set: bool,
    pub state_store: StateStoreSettings,
    /// The HTTP listener's limits.
    pub http: HttpConfig,
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
    /// The dashboard, with its key resolved (flag/env, then `[admin] key`).
    pub admin: AdminConfig,
    /// `Some`: the state store lives in Redis, shared with other nodes.
    pub cluster: Option<crate::cluster::Cluster>,
    /// The authorization rules, loaded (`None` inside: no rules).
    pub authorization: Arc<Loaded>,
    /// The config file, if any (SIGHUP reloads its rules).
    pub config: Option<PathBuf>,
}

impl Settings {
    pub fn resolve(args: &ServeArgs) -> Result<Settings, ConfigError> {
        let (file, mqtt_max_connections_set) = match &args.config {
            Some(path) => load(path)?,
            None => (FileConfig::default(), false),
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
        let cluster = crate::cluster::resolve(
            &args.cluster,
            file.cluster.clone(),
            &file.state_store.store.node_id,
            data_dir.is_some(),
        )?;
        let flags = SecurityFlags {
            allow_anonymous: args.allow_anonymous,
            password_file: args.password_file.clone(),
            mqtts_listen: args.mqtts_listen,
            tls_cert: args.tls_cert.clone(),
            tls_key: args.tls_key.clone(),
            tls_client_ca: args.tls_client_ca.clone(),
        };
        let authentication = auth_config::authentication(&flags, file.authentication);
        let plain = args.mqtt_listen.or(file.mqtt_listen);
        let mqtt_listeners =
            auth_config::listeners(&flags, &authentication, file.mqtt.listeners, plain)?;
        let mut http_config = file.http;
        if args.http_tls {
            http_config.tls = Some(flags.tls_files().ok_or(ConfigError::HttpTlsFlags)?);
        }
        Ok(Settings {
            mqtt_listeners,
            authentication,
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
            broker: file.mqtt.broker,
            mqtt_max_connections_set,
            state_store: file.state_store,
            http: http(http_config, &file.webpubsub)?,
            webpubsub: webpubsub(args, file.webpubsub, file.access_keys)?,
            data_dir,
            sync: sync.unwrap_or_default(),
            compact_after_bytes,
            max_journal_bytes,
            admin: file.admin.resolve(args.admin_key.clone())?,
            cluster,
            authorization: Arc::new(
                file.authorization
                    .load(args.config.as_deref().and_then(Path::parent))?,
            ),
            config: args.config.clone(),
        })
    }
}

/// The `[webpubsub]` table with its access keys resolved (flag/env, then the table's,
/// then the file's top-level ones) and validated.
fn webpubsub(
    args: &ServeArgs,
    mut wps: WebPubSubConfig,
    top_level_keys: Vec<String>,
) -> Result<WebPubSubConfig, ConfigError> {
    let file = || {
        args.config
            .as_deref()
            .map_or_else(String::new, |p| p.display().to_string())
    };
    let origin = if !args.access_keys.is_empty() {
        wps.access_keys = args.access_keys.clone();
        "--access-key or STATEHUB_ACCESS_KEYS".to_owned()
    } else if !wps.access_keys.is_empty() {
        format!("[webpubsub] access_keys in {}", file())
    } else {
        wps.access_keys = top_level_keys;
        format!("access_keys in {}", file())
    };
    wps.validate().map_err(|e| match e {
        e @ statehub_webpubsub::ConfigError::ShortAccessKey { .. } => {
            ConfigError::AccessKey { origin, source: e }
        }
        e => e.into(),
    })?;
    Ok(wps)
}

/// The `[http]` table, checked: timeouts of at least a second, a request timeout
/// longer than the upstream `connect` handler may take.
fn http(http: HttpConfig, wps: &WebPubSubConfig) -> Result<HttpConfig, ConfigError> {
    if http.max_connections == Some(0) {
        return Err(ConfigError::Http(
            "max_connections must be at least 1".into(),
        ));
    }
    if [
        http.header_timeout_secs,
        http.request_timeout_secs,
        http.idle_timeout_secs,
    ]
    .contains(&0)
    {
        return Err(ConfigError::Http("timeouts must be at least 1 s".into()));
    }
    let upstream = wps.limits.upstream_timeout.as_secs();
    if http.request_timeout_secs <= upstream {
        return Err(ConfigError::Http(format!(
            "request_timeout_secs ({}) must exceed [webpubsub.limits] upstream_timeout_secs \
             ({upstream}): a WebSocket handshake waits for the upstream connect handler",
            http.request_timeout_secs
        )));
    }
    Ok(http)
}

/// The `[authorization]` table of the config file at `path`, the whole file checked.
pub fn authorization_table(path: &Path) -> Result<AuthorizationConfig, ConfigError> {
    Ok(load(path)?.0.authorization)
}

/// The file, and whether it sets `[mqtt] max_connections`.
fn load(path: &Path) -> Result<(FileConfig, bool), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.into(),
        source,
    })?;
    let parse_error = |source| ConfigError::Parse {
        path: path.into(),
        source: Box::new(source),
    };
    let table: toml::Table = toml::from_str(&text).map_err(parse_error)?;
    // `[mqtt]` is read with its listeners flattened beside the broker's settings,
    // which lets unknown keys through and loses the key's name from a type error:
    // check them against the broker's own table first.
    if let Some(toml::Value::Table(mqtt)) = table.get("mqtt") {
        let mut broker = mqtt.clone();
        broker.remove("listeners");
        toml::Value::Table(broker)
            .try_into::<BrokerConfig>()
            .map_err(parse_error)?;
    }
    let file: FileConfig = toml::from_str(&text).map_err(parse_error)?;
    let max_connections_set = table
        .get("mqtt")
        .and_then(|mqtt| mqtt.get("max_connections"))
        .is_some();
    Ok((file, max_connections_set))
}
