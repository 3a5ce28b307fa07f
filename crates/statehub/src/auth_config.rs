//! The security settings: MQTT listeners (`[[mqtt.listeners]]`), their TLS and
//! authentication, the `[authentication]` table the methods come from, and the
//! HTTP listener's TLS. Resolved here into one [`ListenerSettings`] per MQTT
//! listener; `listeners.rs` turns those into running listeners.
//!
//! Secure defaults: a listener with no authentication method accepts anonymous
//! clients from loopback addresses only (Mosquitto 2's local-only mode) unless
//! anonymous access is explicitly allowed; a listener with a method accepts no
//! anonymous client unless explicitly allowed.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;
use statehub_auth::jwt::TokenConfig;
use statehub_auth::tls::TlsFiles;
use statehub_auth::x509::X509Config;
use statehub_auth::Anonymous;

/// The `[authentication]` table: the methods listeners may use.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// A Mosquitto password file (`statehub passwd` writes one).
    pub password_file: Option<PathBuf>,
    /// Anonymous clients on every listener that does not say otherwise: `true` from
    /// anywhere, `false` never. Unset: from loopback only on listeners without an
    /// authentication method, never on the others.
    pub allow_anonymous: Option<bool>,
    /// JWT / Kubernetes service-account tokens.
    pub tokens: Option<TokenConfig>,
    /// X.509 client certificates (on TLS listeners with a `client_ca`).
    pub x509: Option<X509Config>,
    /// How often (seconds) certificate, key, password and token key files are
    /// checked for changes and reloaded (SIGHUP reloads at once). 0: only on SIGHUP.
    pub reload_poll_secs: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            password_file: None,
            allow_anonymous: None,
            tokens: None,
            x509: None,
            reload_poll_secs: 5,
        }
    }
}

/// An authentication method a listener accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    Password,
    Token,
    X509,
}

/// One `[[mqtt.listeners]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    pub address: SocketAddr,
    /// TLS on this listener (conventionally port 8883).
    pub tls: Option<TlsFiles>,
    /// The methods of `[authentication]` this listener accepts (default: every one
    /// configured that applies; X.509 needs the listener's `client_ca`).
    pub authentication: Option<Vec<Method>>,
    /// Overrides `[authentication] allow_anonymous` for this listener.
    pub allow_anonymous: Option<bool>,
    /// Overrides `[mqtt] max_bytes_per_second` for this listener's connections.
    pub max_bytes_per_second: Option<u64>,
    /// Overrides `[mqtt] max_bytes_burst` for this listener's connections.
    pub max_bytes_burst: Option<u64>,
}

/// A listener's own bandwidth settings; what it leaves out comes from `[mqtt]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BandwidthOverride {
    pub bytes_per_second: Option<u64>,
    pub burst: Option<u64>,
}

/// A listener, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerSettings {
    pub address: SocketAddr,
    pub tls: Option<TlsFiles>,
    pub password: bool,
    pub token: bool,
    pub x509: bool,
    pub anonymous: Anonymous,
    pub bandwidth: BandwidthOverride,
}

/// Why the listeners cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("listener {0}: method {1:?} is not configured in [authentication]")]
    NotConfigured(SocketAddr, Method),
    #[error("listener {0}: x509 needs TLS with a client_ca")]
    X509WithoutClientCa(SocketAddr),
    #[error("--mqtts-listen needs --tls-cert and --tls-key")]
    TlsFlags,
    #[error("--mqtt-listen (or mqtt_listen) and [[mqtt.listeners]] both name listeners; use one")]
    Both,
}

/// The command line's and environment's security settings.
#[derive(Debug, Clone, Default)]
pub struct SecurityFlags {
    pub allow_anonymous: bool,
    pub password_file: Option<PathBuf>,
    pub mqtts_listen: Option<SocketAddr>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
}

impl SecurityFlags {
    /// The TLS files the flags name, if both the certificate and the key are given.
    pub fn tls_files(&self) -> Option<TlsFiles> {
        Some(TlsFiles {
            cert: self.tls_cert.clone()?,
            key: self.tls_key.clone()?,
            client_ca: self.tls_client_ca.clone(),
            require_client_cert: false,
        })
    }
}

/// The flags folded into the `[authentication]` table (flags win).
pub fn authentication(flags: &SecurityFlags, mut auth: AuthConfig) -> AuthConfig {
    if flags.password_file.is_some() {
        auth.password_file = flags.password_file.clone();
    }
    if flags.allow_anonymous {
        auth.allow_anonymous = Some(true);
    }
    auth
}

/// The MQTT listeners: the configured `[[mqtt.listeners]]`, or one plain listener on
/// `plain` (the `--mqtt-listen` address), plus one TLS listener for `--mqtts-listen`.
pub fn listeners(
    flags: &SecurityFlags,
    auth: &AuthConfig,
    configured: Vec<ListenerConfig>,
    plain: Option<SocketAddr>,
) -> Result<Vec<ListenerSettings>, ListenerError> {
    let mut list = configured;
    match (list.is_empty(), plain) {
        (false, Some(_)) => return Err(ListenerError::Both),
        (true, plain) => list.push(ListenerConfig {
            address: plain.unwrap_or(([0, 0, 0, 0], 1883).into()),
            tls: None,
            authentication: None,
            allow_anonymous: None,
            max_bytes_per_second: None,
            max_bytes_burst: None,
        }),
        (false, None) => {}
    }
    if let Some(address) = flags.mqtts_listen {
        list.push(ListenerConfig {
            address,
            tls: Some(flags.tls_files().ok_or(ListenerError::TlsFlags)?),
            authentication: None,
            allow_anonymous: None,
            max_bytes_per_second: None,
            max_bytes_burst: None,
        });
    }
    list.into_iter().map(|l| resolve(auth, l)).collect()
}

fn resolve(auth: &AuthConfig, l: ListenerConfig) -> Result<ListenerSettings, ListenerError> {
    let client_ca = l.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    let configured = |m: Method| match m {
        Method::Password => auth.password_file.is_some(),
        Method::Token => auth.tokens.is_some(),
        Method::X509 => client_ca,
    };
    let methods = match &l.authentication {
        Some(methods) => {
            for &m in methods {
                if m == Method::X509 && !client_ca {
                    return Err(ListenerError::X509WithoutClientCa(l.address));
                }
                if !configured(m) {
                    return Err(ListenerError::NotConfigured(l.address, m));
                }
            }
            methods.clone()
        }
        None => [Method::Password, Method::Token, Method::X509]
            .into_iter()
            .filter(|&m| configured(m))
            .collect(),
    };
    let anonymous = match l.allow_anonymous.or(auth.allow_anonymous) {
        Some(true) => Anonymous::Allow,
        Some(false) => Anonymous::Refuse,
        None if methods.is_empty() => Anonymous::LoopbackOnly,
        None => Anonymous::Refuse,
    };
    Ok(ListenerSettings {
        address: l.address,
        tls: l.tls,
        password: methods.contains(&Method::Password),
        token: methods.contains(&Method::Token),
        x509: methods.contains(&Method::X509),
        anonymous,
        bandwidth: BandwidthOverride {
            bytes_per_second: l.max_bytes_per_second,
            burst: l.max_bytes_burst,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(client_ca: bool) -> TlsFiles {
        TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
            client_ca: client_ca.then(|| "ca.pem".into()),
            require_client_cert: false,
        }
    }

    #[test]
    fn without_authentication_anonymous_clients_are_local_only() {
        let flags = SecurityFlags::default();
        let l = listeners(&flags, &AuthConfig::default(), vec![], None).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].address, ([0, 0, 0, 0], 1883).into());
        assert_eq!(l[0].anonymous, Anonymous::LoopbackOnly);
        let open = authentication(
            &SecurityFlags {
                allow_anonymous: true,
                ..flags
            },
            AuthConfig::default(),
        );
        let l = listeners(&SecurityFlags::default(), &open, vec![], None).unwrap();
        assert_eq!(l[0].anonymous, Anonymous::Allow);
    }

    #[test]
    fn a_listener_with_a_method_refuses_anonymous_clients_unless_told() {
        let auth = AuthConfig {
            password_file: Some("passwd".into()),
            ..AuthConfig::default()
        };
        let configured = vec![
            ListenerConfig {
                address: ([127, 0, 0, 1], 1883).into(),
                tls: None,
                authentication: Some(vec![]),
                allow_anonymous: None,
                max_bytes_per_second: None,
                max_bytes_burst: None,
            },
            ListenerConfig {
                address: ([0, 0, 0, 0], 8883).into(),
                tls: Some(tls(true)),
                authentication: None,
                allow_anonymous: None,
                max_bytes_per_second: None,
                max_bytes_burst: None,
            },
        ];
        let l = listeners(&SecurityFlags::default(), &auth, configured, None).unwrap();
        assert_eq!(l[0].anonymous, Anonymous::LoopbackOnly);
        assert!(!l[0].password);
        assert!(l[1].password && l[1].x509 && !l[1].token);
        assert_eq!(l[1].anonymous, Anonymous::Refuse);
    }

    #[test]
    fn inconsistent_listeners_are_refused() {
        let auth = AuthConfig::default();
        let x509_plain = vec![ListenerConfig {
            address: ([0, 0, 0, 0], 8883).into(),
            tls: Some(tls(false)),
            authentication: Some(vec![Method::X509]),
            allow_anonymous: None,
            max_bytes_per_second: None,
            max_bytes_burst: None,
        }];
        assert!(matches!(
            listeners(&SecurityFlags::default(), &auth, x509_plain.clone(), None),
            Err(ListenerError::X509WithoutClientCa(_))
        ));
        let mut token = x509_plain.clone();
        token[0].authentication = Some(vec![Method::Token]);
        assert!(matches!(
            listeners(&SecurityFlags::default(), &auth, token, None),
            Err(ListenerError::NotConfigured(_, Method::Token))
        ));
        let plain = Some(([127, 0, 0, 1], 1).into());
        assert!(matches!(
            listeners(&SecurityFlags::default(), &auth, x509_plain, plain),
            Err(ListenerError::Both)
        ));
        let tls_flag = SecurityFlags {
            mqtts_listen: Some(([0, 0, 0, 0], 8883).into()),
            ..SecurityFlags::default()
        };
        assert!(matches!(
            listeners(&tls_flag, &auth, vec![], None),
            Err(ListenerError::TlsFlags)
        ));
    }
}
