//! The TLS configuration of a listener, from PEM files.
//!
//! rustls with the ring provider and its defaults: TLS 1.3 preferred, TLS 1.2
//! allowed (nothing older exists in rustls), modern cipher suites only. With a client
//! CA, client certificates are verified against it (mutual TLS); they are required
//! at the handshake with `require_client_cert`, else optional (a listener that also
//! takes passwords or tokens lets clients without one through to CONNECT).
//!
//! Every error names the file at fault.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use serde::Deserialize;

/// A listener's `tls` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The server's certificate chain, PEM, its own certificate first.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates are verified against.
    pub client_ca: Option<PathBuf>,
    /// Refuse a TLS handshake without a client certificate (needs `client_ca`).
    #[serde(default)]
    pub require_client_cert: bool,
}

/// Why a TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read TLS {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS {what} {path}: {reason}")]
    Invalid {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("TLS private key {key} does not match the certificate in {cert}")]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("require_client_cert needs a client_ca")]
    RequireWithoutCa,
}

/// The rustls crypto provider statehub uses everywhere.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the server configuration `files` describe, offering `alpn` protocols.
pub fn server_config(files: &TlsFiles, alpn: &[&[u8]]) -> Result<rustls::ServerConfig, TlsError> {
    let chain = certificates(&files.cert, "certificate chain")?;
    let key = private_key(&files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid {
            what: "configuration",
            path: files.cert.clone(),
            reason: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None if files.require_client_cert => return Err(TlsError::RequireWithoutCa),
        None => builder.with_no_client_auth(),
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, files)?),
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
        },
        e => TlsError::Invalid {
            what: "private key",
            path: files.key.clone(),
            reason: e.to_string(),
        },
    })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The files `files` reads (watched for changes).
pub fn watched_files(files: &TlsFiles) -> Vec<PathBuf> {
    let mut paths = vec![files.cert.clone(), files.key.clone()];
    paths.extend(files.client_ca.clone());
    paths
}

fn client_verifier(
    path: &Path,
    files: &TlsFiles,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        what: "client CA",
        path: path.to_owned(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, "client CA")? {
        roots.add(cert).map_err(|e| invalid(e.to_string()))?;
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let builder = match files.require_client_cert {
        true => builder,
        false => builder.allow_unauthenticated(),
    };
    builder.build().map_err(|e| invalid(e.to_string()))
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file; at least one.
pub fn certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path, what)?;
    let certs = rustls_pemfile::certs(&mut pem.as_slice())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Invalid {
            what,
            path: path.to_owned(),
            reason: "no CERTIFICATE block in the PEM file".into(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path, "private key")?;
    let invalid = |reason: String| TlsError::Invalid {
        what: "private key",
        path: path.to_owned(),
        reason,
    };
    rustls_pemfile::private_key(&mut pem.as_slice())
        .map_err(|e| invalid(e.to_string()))?
        .ok_or_else(|| invalid("no PRIVATE KEY block in the PEM file".into()))
}
