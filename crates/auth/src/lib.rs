//! statehub's authentication mechanisms, kept out of the broker, which only knows
//! its `Authenticator` hook and `TlsSource`:
//!
//! * [`passwd`]: Mosquitto password files (`$7$` PBKDF2-SHA512, `$6$`) and the
//!   lines `statehub passwd` writes;
//! * [`jwt`]: JWT / Kubernetes service-account token validation;
//! * [`x509`]: client certificates to user names and attributes;
//! * [`listener`]: one listener's combination of them, anonymous access included;
//! * [`tls`]: a listener's rustls configuration from PEM files;
//! * [`watch`]: values reloaded when their files change or on SIGHUP;
//! * [`checks`]: the bound on password hashes and token checks running at once.

pub mod checks;
pub mod jwt;
pub mod listener;
pub mod passwd;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;
pub mod watch;
pub mod x509;

pub use listener::{Anonymous, ListenerAuth, SAT_METHOD};
pub use watch::{Reload, Watched};

/// Why a file-based configuration could not be (re)loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Passwd(#[from] passwd::PasswdError),
    #[error(transparent)]
    Token(#[from] jwt::TokenConfigError),
    #[error(transparent)]
    X509(#[from] x509::X509ConfigError),
}
