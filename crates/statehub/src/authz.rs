//! The `[authorization]` table: where the rules come from, loading them into a
//! [`Policy`], and reloading them on SIGHUP.
//!
//! Rules come from the table itself (`[[authorization.rules]]`, in the AIO resource's
//! field names) and from `rules_file`, a YAML or JSON file holding what an AIO
//! `BrokerAuthorization` resource holds (its whole manifest, its `authorizationPolicies`,
//! or the list of rules); both together are one list. No rule anywhere: no
//! authorization (everything allowed but the built-in protections).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use statehub_authz::rules::{self, Format, Rule};
use statehub_authz::{ParseError, Policy, PolicyError};
use statehub_broker::Broker;

/// The `[authorization]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthorizationConfig {
    /// A YAML or JSON rules file (`.json` is read as JSON, anything else as YAML);
    /// relative to the config file's directory.
    pub rules_file: Option<PathBuf>,
    /// Rules written in the config file.
    pub rules: Vec<Rule>,
}

/// The rules cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    #[error("cannot read rules file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid rules file {path}: {source}")]
    Parse { path: PathBuf, source: ParseError },
    #[error("authorization rules: {0}")]
    Rule(#[from] PolicyError),
    #[error("reloading {path}: {source}")]
    Config {
        path: PathBuf,
        source: Box<crate::config::ConfigError>,
    },
}

/// The loaded rules and where each came from, for people to read.
#[derive(Debug)]
pub struct Loaded {
    /// `None`: no rules.
    pub policy: Option<Arc<Policy>>,
    pub from_table: usize,
    pub from_file: Option<(PathBuf, usize)>,
}

impl AuthorizationConfig {
    /// Reads `rules_file` (relative to `base`, the config file's directory) and
    /// compiles it with the table's rules.
    pub fn load(&self, base: Option<&Path>) -> Result<Loaded, AuthzError> {
        let mut all = self.rules.clone();
        let mut from_file = None;
        if let Some(file) = &self.rules_file {
            let path = match base {
                Some(dir) if file.is_relative() => dir.join(file),
                _ => file.clone(),
            };
            let text = std::fs::read_to_string(&path).map_err(|source| AuthzError::Read {
                path: path.clone(),
                source,
            })?;
            let format = Format::from_name(&path.to_string_lossy());
            let read = rules::parse(&text, format).map_err(|source| AuthzError::Parse {
                path: path.clone(),
                source,
            })?;
            from_file = Some((path, read.len()));
            all.extend(read);
        }
        let policy = Policy::compile(&all)?;
        Ok(Loaded {
            policy: (!policy.is_empty()).then(|| Arc::new(policy)),
            from_table: self.rules.len(),
            from_file,
        })
    }
}

impl Loaded {
    /// One line saying what is in force.
    pub fn summary(&self) -> String {
        let Some(policy) = &self.policy else {
            return "authorization: no rules; every client may do everything but what the \
                    built-in protections refuse"
                .to_owned();
        };
        let file = match &self.from_file {
            Some((path, n)) => format!(", {n} from {}", path.display()),
            None => String::new(),
        };
        format!(
            "authorization: {} rules ({} from [authorization] rules{file}); what no rule grants is denied",
            policy.len(),
            self.from_table
        )
    }
}

/// Reloads the rules from the config file (its `[authorization]` table and the rules
/// file it names) on every SIGHUP. Install it before the listeners open: SIGHUP would
/// otherwise end the process.
#[derive(Debug)]
pub struct Reloader {
    hangup: tokio::signal::unix::Signal,
    config: Option<PathBuf>,
}

impl Reloader {
    pub fn install(config: Option<PathBuf>) -> std::io::Result<Reloader> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Reloader {
            hangup: signal(SignalKind::hangup())?,
            config,
        })
    }

    /// Until `shutdown`: on each SIGHUP, the rules the file gives now replace the
    /// broker's; a file that does not load leaves the rules in force and is logged.
    pub async fn run(mut self, broker: Broker, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                got = self.hangup.recv() => if got.is_none() { return },
            }
            match reload(self.config.as_deref()) {
                Ok(loaded) => {
                    broker.set_policy(loaded.policy.clone());
                    tracing::info!("SIGHUP: {}", loaded.summary());
                }
                Err(e) => tracing::error!("SIGHUP: {e}; the rules in force stay"),
            }
        }
    }
}

/// The rules the config file gives now.
fn reload(config: Option<&Path>) -> Result<Loaded, AuthzError> {
    let Some(path) = config else {
        return Ok(Loaded {
            policy: None,
            from_table: 0,
            from_file: None,
        });
    };
    let table = crate::config::authorization_table(path).map_err(|source| AuthzError::Config {
        path: path.to_owned(),
        source: Box::new(source),
    })?;
    table.load(path.parent())
}
