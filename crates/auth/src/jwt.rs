//! JWT validation, for Kubernetes service-account tokens (SATs) and any issuer that
//! signs with RS256/384/512, PS256/384/512, ES256/384 or HS256/384/512.
//!
//! A token passes when its signature verifies with one of the configured keys of its
//! header's algorithm family (and `kid`, when both name one), `exp` is in the future
//! and `nbf` in the past (give or take `leeway_secs`), `aud` names one of the
//! configured audiences (required: a token minted for another service is refused),
//! and `iss` is the configured issuer if one is. Its claims then give the client's
//! user name (`username_claim`, `sub` by default) and attributes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;
use statehub_broker::Identity;

/// The `[authentication.tokens]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// PEM files holding RSA or EC public keys (or certificates carrying them): the
    /// service-account issuer's signing keys.
    #[serde(default)]
    pub keys: Vec<PathBuf>,
    /// A JWKS file (`{"keys": [...]}`, as a cluster's `/openid/v1/jwks` serves it).
    pub jwks: Option<PathBuf>,
    /// A file whose content (trailing newline removed) is an HMAC secret (HS256).
    pub hmac_secret_file: Option<PathBuf>,
    /// Accepted `aud` values; a token must name at least one.
    pub audiences: Vec<String>,
    /// The required `iss`, if set.
    pub issuer: Option<String>,
    /// The claim that becomes the client's user name (`sub` by default; a SAT's is
    /// `system:serviceaccount:<namespace>:<name>`).
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    /// Attribute name → claim: a top-level claim name, or a JSON pointer into the
    /// claims (`/kubernetes.io/namespace`). String, number and boolean claims become
    /// attributes; a missing one is left out.
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
    /// Clock skew tolerated on `exp` and `nbf`, in seconds (30).
    #[serde(default = "default_leeway")]
    pub leeway_secs: u64,
}

fn default_username_claim() -> String {
    "sub".to_owned()
}

fn default_leeway() -> u64 {
    30
}

/// Why the token configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenConfigError {
    #[error("[authentication.tokens]: audiences must name at least one audience")]
    NoAudience,
    #[error("[authentication.tokens]: no keys, jwks or hmac_secret_file")]
    NoKeys,
    #[error("cannot read token key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("token key file {path}: {reason}")]
    Key { path: PathBuf, reason: String },
}

/// Why a token was refused. The text is safe to log: it never holds the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token is not a JWT")]
    Malformed,
    #[error("token algorithm {0:?} has no configured key")]
    NoKey(Algorithm),
    #[error("token signature does not verify")]
    Signature,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet (nbf)")]
    NotYetValid,
    #[error("token audience is not accepted")]
    Audience,
    #[error("token issuer is not accepted")]
    Issuer,
    #[error("token lacks a required claim: {0}")]
    MissingClaim(String),
    #[error("token rejected: {0}")]
    Other(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    Ec,
    Hmac,
}

impl Family {
    fn of(alg: Algorithm) -> Option<Family> {
        use Algorithm::*;
        match alg {
            RS256 | RS384 | RS512 | PS256 | PS384 | PS512 => Some(Family::Rsa),
            ES256 | ES384 => Some(Family::Ec),
            HS256 | HS384 | HS512 => Some(Family::Hmac),
            EdDSA => None,
        }
    }
}

struct Key {
    family: Family,
    kid: Option<String>,
    key: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} key (kid {:?})", self.family, self.kid)
    }
}

/// Validates tokens against the configured keys and claims.
#[derive(Debug)]
pub struct TokenValidator {
    keys: Vec<Key>,
    config: TokenConfig,
}

impl TokenValidator {
    /// Reads the key files the configuration names.
    pub fn load(config: &TokenConfig) -> Result<TokenValidator, TokenConfigError> {
        if config.audiences.is_empty() {
            return Err(TokenConfigError::NoAudience);
        }
        let mut keys = Vec::new();
        for path in &config.keys {
            keys.push(pem_key(path)?);
        }
        if let Some(path) = &config.jwks {
            keys.extend(jwks_keys(path)?);
        }
        if let Some(path) = &config.hmac_secret_file {
            let secret = read(path)?;
            let secret = secret.strip_suffix(b"\n").unwrap_or(&secret);
            if secret.is_empty() {
                return Err(key_error(path, "empty secret"));
            }
            keys.push(Key {
                family: Family::Hmac,
                kid: None,
                key: DecodingKey::from_secret(secret),
            });
        }
        if keys.is_empty() {
            return Err(TokenConfigError::NoKeys);
        }
        Ok(TokenValidator {
            keys,
            config: config.clone(),
        })
    }

    /// The files this validator was read from (watched for changes).
    pub fn files(config: &TokenConfig) -> Vec<PathBuf> {
        let mut files = config.keys.clone();
        files.extend(config.jwks.clone());
        files.extend(config.hmac_secret_file.clone());
        files
    }

    /// Checks `token` and returns who it names.
    pub fn validate(&self, token: &[u8]) -> Result<Identity, TokenError> {
        let token = std::str::from_utf8(token)
            .map_err(|_| TokenError::Malformed)?
            .trim();
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        let family = Family::of(header.alg).ok_or(TokenError::NoKey(header.alg))?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.config.leeway_secs;
        validation.validate_nbf = true;
        validation.set_audience(&self.config.audiences);
        let mut required = vec!["exp", "aud"];
        if let Some(issuer) = &self.config.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        let candidates = self.keys.iter().filter(|k| {
            k.family == family
                && match (&k.kid, &header.kid) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        });
        let mut outcome = Err(TokenError::NoKey(header.alg));
        for key in candidates {
            outcome = jsonwebtoken::decode::<Value>(token, &key.key, &validation)
                .map(|data| data.claims)
                .map_err(|e| token_error(&e));
            if !matches!(outcome, Err(TokenError::Signature)) {
                break;
            }
        }
        self.identity(&outcome?)
    }

    fn identity(&self, claims: &Value) -> Result<Identity, TokenError> {
        let username = claim(claims, &self.config.username_claim)
            .ok_or_else(|| TokenError::MissingClaim(self.config.username_claim.clone()))?;
        let attributes = self
            .config
            .attributes
            .iter()
            .filter_map(|(name, path)| Some((name.clone(), claim(claims, path)?)))
            .collect();
        let expires_at = claims
            .get("exp")
            .and_then(Value::as_u64)
            .map(|exp| UNIX_EPOCH + Duration::from_secs(exp));
        Ok(Identity {
            username: Some(username.into()),
            attributes,
            expires_at,
        })
    }
}

/// A claim as text: a top-level name or a JSON pointer.
fn claim(claims: &Value, path: &str) -> Option<String> {
    let value = match path.starts_with('/') {
        true => claims.pointer(path)?,
        false => claims.get(path)?,
    };
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn token_error(e: &jsonwebtoken::errors::Error) -> TokenError {
    use jsonwebtoken::errors::ErrorKind::*;
    match e.kind() {
        InvalidSignature => TokenError::Signature,
        ExpiredSignature => TokenError::Expired,
        ImmatureSignature => TokenError::NotYetValid,
        InvalidAudience => TokenError::Audience,
        InvalidIssuer => TokenError::Issuer,
        MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
        InvalidToken | Base64(_) | Json(_) | Utf8(_) => TokenError::Malformed,
        other => TokenError::Other(format!("{other:?}")),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TokenConfigError> {
    std::fs::read(path).map_err(|source| TokenConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

fn key_error(path: &Path, reason: impl ToString) -> TokenConfigError {
    TokenConfigError::Key {
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn pem_key(path: &Path) -> Result<Key, TokenConfigError> {
    let pem = read(path)?;
    let (family, key) = match DecodingKey::from_rsa_pem(&pem) {
        Ok(key) => (Family::Rsa, key),
        Err(_) => match DecodingKey::from_ec_pem(&pem) {
            Ok(key) => (Family::Ec, key),
            Err(_) => return Err(key_error(path, "no RSA or EC public key in PEM")),
        },
    };
    Ok(Key {
        family,
        kid: None,
        key,
    })
}

fn jwks_keys(path: &Path) -> Result<Vec<Key>, TokenConfigError> {
    let set: JwkSet = serde_json::from_slice(&read(path)?)
        .map_err(|e| key_error(path, format!("bad JWKS: {e}")))?;
    set.keys
        .iter()
        .map(|jwk| {
            use jsonwebtoken::jwk::AlgorithmParameters as P;
            let family = match &jwk.algorithm {
                P::RSA(_) => Family::Rsa,
                P::EllipticCurve(_) => Family::Ec,
                P::OctetKey(_) => Family::Hmac,
                P::OctetKeyPair(_) => return Err(key_error(path, "OKP keys are not supported")),
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| key_error(path, e))?;
            Ok(Key {
                family,
                kid: jwk.common.key_id.clone(),
                key,
            })
        })
        .collect()
}

/// Seconds since the epoch, for tests and callers that mint tokens.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
