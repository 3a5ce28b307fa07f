//! The one validator of the service's JWTs: HS256, signed with the UTF-8 bytes of one
//! of the access keys, the way the server SDKs mint them from a connection string.
//! Client tokens (`token.rs`) and REST tokens (`rest/auth.rs`) each check their
//! own audience on the claims it returns.

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::de::DeserializeOwned;

/// Clock skew tolerated on `exp`, in seconds.
pub(crate) const LEEWAY_SECS: u64 = 5;

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum JwtError {
    /// Not signed by any configured key.
    #[error("signature does not match any access key")]
    BadSignature,
    /// Past its `exp`.
    #[error("token expired")]
    Expired,
    /// Malformed, wrong algorithm, or a claim missing or of the wrong type.
    #[error("invalid token: {0}")]
    Malformed(String),
}

/// Checks `token` against each key in turn (primary, secondary…) and returns its
/// claims: HS256 only, `exp` required and not past.
pub(crate) fn verify<C: DeserializeOwned>(keys: &[String], token: &str) -> Result<C, JwtError> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.validate_aud = false;
    validation.leeway = LEEWAY_SECS;
    for key in keys {
        let key = DecodingKey::from_secret(key.as_bytes());
        match jsonwebtoken::decode::<C>(token, &key, &validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) => match e.kind() {
                ErrorKind::InvalidSignature => {}
                ErrorKind::ExpiredSignature => return Err(JwtError::Expired),
                _ => return Err(JwtError::Malformed(e.to_string())),
            },
        }
    }
    Err(JwtError::BadSignature)
}
