//! The MQTT listeners and what secures them: each listener's authentication (from
//! the shared password file, token validator and X.509 mapping) and TLS, and the
//! task that reloads certificates, keys, password files and token keys when their
//! files change (polled) or on SIGHUP, without touching open connections.

use std::sync::Arc;
use std::time::Duration;

use statehub_auth::jwt::TokenValidator;
use statehub_auth::passwd::PasswordFile;
use statehub_auth::tls::{server_config, watched_files, TlsFiles};
use statehub_auth::x509::X509Mapping;
use statehub_auth::{Anonymous, ListenerAuth, LoadError, Reload, Watched};
use statehub_broker::{Authenticator, Bandwidth, Broker, MqttListener, TlsSource};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth_config::{AuthConfig, ListenerSettings};

/// The loaded authentication methods and every file-backed value to reload.
#[derive(Debug)]
pub struct Security {
    passwords: Option<Arc<Watched<PasswordFile>>>,
    tokens: Option<Arc<Watched<TokenValidator>>>,
    x509: Option<Arc<X509Mapping>>,
    reloadable: Vec<Arc<dyn Reload>>,
    hangup: tokio::signal::unix::Signal,
    poll: Duration,
}

impl Security {
    /// Loads the methods `[authentication]` configures (errors name the file) and
    /// installs the SIGHUP handler.
    pub fn load(auth: &AuthConfig) -> Result<Security, SecurityError> {
        use tokio::signal::unix::{signal, SignalKind};
        let hangup = signal(SignalKind::hangup()).map_err(SecurityError::Signal)?;
        let mut reloadable: Vec<Arc<dyn Reload>> = Vec::new();
        let passwords = match &auth.password_file {
            Some(path) => {
                let p = path.clone();
                let what = format!("password file {}", path.display());
                let file = Watched::load(what, vec![path.clone()], move || {
                    Ok(PasswordFile::load(&p)?)
                })?;
                tracing::info!(
                    "password file {}: {} users",
                    path.display(),
                    file.get().len()
                );
                reloadable.push(file.clone());
                Some(file)
            }
            None => None,
        };
        let tokens = match &auth.tokens {
            Some(config) => {
                let c = config.clone();
                let files = TokenValidator::files(config);
                let validator =
                    Watched::load("token keys", files, move || Ok(TokenValidator::load(&c)?))?;
                reloadable.push(validator.clone());
                Some(validator)
            }
            None => None,
        };
        // Without an [authentication.x509] table, a listener with a client CA still
        // maps certificates to user names.
        let x509_config = auth.x509.clone().unwrap_or_default();
        let x509 = Some(Arc::new(
            X509Mapping::new(&x509_config).map_err(LoadError::from)?,
        ));
        Ok(Security {
            passwords,
            tokens,
            x509,
            reloadable,
            hangup,
            poll: Duration::from_secs(auth.reload_poll_secs),
        })
    }

    /// A listener's authentication.
    pub fn listener_auth(&self, l: &ListenerSettings) -> ListenerAuth {
        ListenerAuth {
            passwords: self.passwords.clone().filter(|_| l.password),
            tokens: self.tokens.clone().filter(|_| l.token),
            x509: self.x509.clone().filter(|_| l.x509),
            anonymous: l.anonymous,
        }
    }

    /// The HTTP listener's TLS configuration, if `[http.tls]` (or `--http-tls`) asks
    /// for one.
    pub fn http_tls(
        &mut self,
        files: Option<&TlsFiles>,
    ) -> Result<Option<Arc<dyn TlsSource>>, SecurityError> {
        let Some(files) = files else { return Ok(None) };
        let what = format!(
            "TLS certificate of the HTTP listener ({})",
            files.cert.display()
        );
        let alpn: &'static [&'static [u8]] = &[b"http/1.1"];
        Ok(Some(self.tls(what, files, alpn)?))
    }

    /// How MQTT over WebSocket authenticates: as the first MQTT listener does, with
    /// client certificates only if the HTTP listener asks for them (`client_certs`:
    /// its TLS has a client CA).
    pub fn websocket_auth(
        &self,
        listeners: &[ListenerSettings],
        client_certs: bool,
    ) -> Option<Arc<dyn Authenticator>> {
        let first = listeners.first()?;
        let settings = ListenerSettings {
            x509: client_certs,
            ..first.clone()
        };
        Some(Arc::new(self.listener_auth(&settings)))
    }

    /// A TLS configuration from `files`, reloaded with the rest.
    pub fn tls(
        &mut self,
        what: String,
        files: &TlsFiles,
        alpn: &'static [&'static [u8]],
    ) -> Result<Arc<Watched<rustls::ServerConfig>>, SecurityError> {
        let f = files.clone();
        let config = Watched::load(what, watched_files(files), move || {
            Ok(server_config(&f, alpn)?)
        })?;
        self.reloadable.push(config.clone());
        Ok(config)
    }

    /// Reloads what changed every poll interval, and everything on SIGHUP, until
    /// `shutdown`.
    pub fn spawn_reloader(mut self, shutdown: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.poll.max(Duration::from_secs(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let force = tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = self.hangup.recv() => true,
                    _ = tick.tick(), if !self.poll.is_zero() => false,
                };
                if force {
                    tracing::info!("SIGHUP: reloading certificates, password and token key files");
                }
                reload_all(&self.reloadable, force);
            }
        })
    }
}

fn reload_all(items: &[Arc<dyn Reload>], force: bool) {
    for item in items {
        match item.reload(force) {
            Ok(true) => tracing::info!("reloaded {}", item.what()),
            Ok(false) => {}
            Err(e) => tracing::error!(
                "cannot reload {}; the previous one stays in use: {e}",
                item.what()
            ),
        }
    }
}

/// Why security could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot install the SIGHUP handler: {0}")]
    Signal(std::io::Error),
    /// `source` names the listener and the address (`first_use::bind_error`).
    #[error("{source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A listener's bandwidth limit: its own settings, else the `[mqtt]` table's.
fn bandwidth(broker: &Broker, l: &ListenerSettings) -> Option<Bandwidth> {
    let cfg = broker.config();
    let rate = l.bandwidth.bytes_per_second;
    let burst = l.bandwidth.burst;
    Bandwidth::new(
        rate.unwrap_or(cfg.max_bytes_per_second),
        burst.unwrap_or(cfg.max_bytes_burst),
    )
}

/// Binds every MQTT listener, with its authentication and TLS, and logs each with
/// what it accepts.
pub async fn bind(
    broker: &Broker,
    listeners: &[ListenerSettings],
    security: &mut Security,
    workers: &[Handle],
) -> Result<Vec<MqttListener>, SecurityError> {
    let mut bound = Vec::new();
    for l in listeners {
        let auth = security.listener_auth(l);
        let described = auth.describe();
        let mut listener = MqttListener::bind(broker.clone(), l.address)
            .await
            .map_err(|e| SecurityError::Bind {
                addr: l.address,
                source: crate::first_use::bind_error("MQTT", l.address, e),
            })?
            .with_workers(workers.to_vec())
            .with_authenticator(Arc::new(auth))
            .with_bandwidth(bandwidth(broker, l));
        let addr = listener
            .local_addr()
            .map_err(|source| SecurityError::Bind {
                addr: l.address,
                source,
            })?;
        let mut tls = "";
        if let Some(files) = &l.tls {
            let what = format!(
                "TLS certificate of MQTT listener {addr} ({})",
                files.cert.display()
            );
            listener = listener.with_tls(security.tls(what, files, &[])?);
            tls = " with TLS";
        }
        tracing::info!("mqtt listening on {addr}{tls} (authentication: {described})");
        if l.anonymous == Anonymous::LoopbackOnly {
            tracing::warn!(
                "mqtt {addr}: no authentication configured, so clients without credentials are \
                 accepted from loopback addresses only; --allow-anonymous (or [authentication] \
                 allow_anonymous = true) accepts them from anywhere (see docs/security.md)"
            );
        }
        bound.push(listener);
    }
    Ok(bound)
}
