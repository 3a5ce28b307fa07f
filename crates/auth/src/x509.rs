//! X.509 client certificates (mutual TLS) as identities.
//!
//! The TLS layer has already verified the chain against the listener's client CA;
//! here the client's own certificate gives the user name (its subject Common Name,
//! else its first DNS/URI/e-mail Subject Alternative Name, or the other way round)
//! and the connection's expiry (its `notAfter`). Attributes come from the
//! configuration, as the AIO broker's X.509 "authorization attributes": each entry
//! names a subject; its attributes go to a client whose certificate has that
//! subject, or whose chain was issued by a CA with that subject (the issuer of any
//! certificate it presented). A client certificate's own entry wins over its CAs'.
//!
//! Subjects are compared as sets of `TYPE=value` pairs, so `CN = smart-fan, O =
//! Contoso` matches a certificate whatever the order and spacing.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use serde::Deserialize;
use statehub_broker::Identity;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::objects::{oid2abbrev, oid_registry};
use x509_parser::prelude::FromDer;
use x509_parser::x509::X509Name;

/// Which of a certificate's names becomes the user name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UsernameFrom {
    /// The subject's Common Name, else the first Subject Alternative Name.
    #[default]
    Cn,
    /// The first Subject Alternative Name, else the Common Name.
    San,
}

/// The `[authentication.x509]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X509Config {
    #[serde(default)]
    pub username: UsernameFrom,
    /// Attributes per certificate subject or per issuing CA subject.
    #[serde(default)]
    pub attributes: Vec<SubjectAttributes>,
}

/// One `[[authentication.x509.attributes]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubjectAttributes {
    /// A distinguished name: `CN = Contoso Root CA, O = Contoso, C = US`.
    pub subject: String,
    pub attributes: BTreeMap<String, String>,
}

/// Why the X.509 configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum X509ConfigError {
    #[error("[authentication.x509] subject {0:?} is not `TYPE = value, ...`")]
    Subject(String),
}

/// Why a certificate gives no identity (safe to log).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("no client certificate")]
    None,
    #[error("client certificate cannot be parsed")]
    Parse,
    #[error("client certificate has no Common Name or Subject Alternative Name")]
    NoName,
}

/// A distinguished name as a sorted list of (type, value).
type Dn = Vec<(String, String)>;

/// Maps verified client certificates to identities.
#[derive(Debug, Clone)]
pub struct X509Mapping {
    username: UsernameFrom,
    entries: Vec<(Dn, BTreeMap<String, String>)>,
}

impl X509Mapping {
    pub fn new(config: &X509Config) -> Result<X509Mapping, X509ConfigError> {
        let entries = config
            .attributes
            .iter()
            .map(|e| {
                let dn = parse_dn(&e.subject)
                    .ok_or_else(|| X509ConfigError::Subject(e.subject.clone()))?;
                Ok((dn, e.attributes.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(X509Mapping {
            username: config.username,
            entries,
        })
    }

    /// The identity of the client that presented `chain` (its own certificate first).
    pub fn identity(&self, chain: &[Bytes]) -> Result<Identity, CertError> {
        let leaf_der = chain.first().ok_or(CertError::None)?;
        let (_, leaf) = X509Certificate::from_der(leaf_der).map_err(|_| CertError::Parse)?;
        let username = username(&leaf, self.username).ok_or(CertError::NoName)?;
        let mut issuers = vec![dn(leaf.issuer())];
        for der in &chain[1..] {
            if let Ok((_, ca)) = X509Certificate::from_der(der) {
                issuers.push(dn(ca.subject()));
                issuers.push(dn(ca.issuer()));
            }
        }
        let subject = dn(leaf.subject());
        let mut attributes = BTreeMap::new();
        for (entry, attrs) in &self.entries {
            if issuers.contains(entry) {
                attributes.extend(attrs.clone());
            }
        }
        for (entry, attrs) in &self.entries {
            if *entry == subject {
                attributes.extend(attrs.clone());
            }
        }
        let not_after = u64::try_from(leaf.validity().not_after.timestamp()).unwrap_or(0);
        Ok(Identity {
            username: Some(username.into()),
            attributes,
            expires_at: Some(UNIX_EPOCH + Duration::from_secs(not_after)),
        })
    }
}

fn username(cert: &X509Certificate<'_>, from: UsernameFrom) -> Option<String> {
    let cn = cert
        .subject()
        .iter_common_name()
        .find_map(|a| a.as_str().ok())
        .map(str::to_owned);
    let san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|ext| {
            ext.value.general_names.iter().find_map(|name| match name {
                GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                    Some((*s).to_owned())
                }
                _ => None,
            })
        });
    match from {
        UsernameFrom::Cn => cn.or(san),
        UsernameFrom::San => san.or(cn),
    }
}

fn dn(name: &X509Name<'_>) -> Dn {
    let mut pairs: Dn = name
        .iter()
        .flat_map(|rdn| rdn.iter())
        .filter_map(|attr| {
            let kind = oid2abbrev(attr.attr_type(), oid_registry()).ok()?;
            Some((
                kind.to_ascii_uppercase(),
                attr.as_str().ok()?.trim().to_owned(),
            ))
        })
        .collect();
    pairs.sort();
    pairs
}

/// `CN = a, O = b` (also `/CN=a/O=b`) → sorted pairs; `None` if malformed.
fn parse_dn(text: &str) -> Option<Dn> {
    let text = text.trim();
    let parts: Vec<&str> = match text.strip_prefix('/') {
        Some(rest) => rest.split('/').collect(),
        None => text.split(',').collect(),
    };
    let mut pairs = parts
        .into_iter()
        .map(|part| {
            let (kind, value) = part.split_once('=')?;
            let kind = kind.trim().to_ascii_uppercase();
            let kind = if kind == "EMAILADDRESS" {
                "EMAIL".to_owned()
            } else {
                kind
            };
            (!kind.is_empty()).then(|| (kind, value.trim().to_owned()))
        })
        .collect::<Option<Dn>>()?;
    pairs.sort();
    (!pairs.is_empty()).then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_compare_as_sets() {
        assert_eq!(
            parse_dn("CN = smart-fan, O=Contoso"),
            parse_dn("o = Contoso , cn=smart-fan")
        );
        assert_eq!(parse_dn("/CN=a/O=b"), parse_dn("O=b, CN=a"));
        assert_eq!(parse_dn("no equals sign"), None);
        assert_eq!(parse_dn(""), None);
    }
}
