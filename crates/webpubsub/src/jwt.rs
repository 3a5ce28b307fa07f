//! The one validator of the service's JWTs: HS256, signed with the UTF-8 bytes of one
//! of the access keys, the way the server SDKs mint them from a connection string.
//! Client tokens (`token.rs`) and REST tokens (`rest/auth.rs`) each check their
//! own audience on the claims it returns.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
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
    /// Before its `nbf`.
    #[error("token not valid yet (nbf is in the future)")]
    NotYetValid,
    /// Its `iat` is in the future: minted by a clock far ahead, or forged to outlive
    /// a key rotation.
    #[error("token issued in the future (iat)")]
    IssuedInFuture,
    /// Malformed, wrong algorithm, or a claim missing or of the wrong type.
    #[error("invalid token: {0}")]
    Malformed(String),
}

/// Checks `token` against each key in turn (primary, secondary…) and returns its
/// claims: HS256 only, `exp` required and not past, `nbf` (if any) not in the future,
/// `iat` (if any) not in the future; each with [`LEEWAY_SECS`] of clock skew.
pub(crate) fn verify<C: DeserializeOwned>(keys: &[String], token: &str) -> Result<C, JwtError> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.validate_aud = false;
    validation.validate_nbf = true;
    validation.leeway = LEEWAY_SECS;
    for key in keys {
        let key = DecodingKey::from_secret(key.as_bytes());
        match jsonwebtoken::decode::<Map<String, Value>>(token, &key, &validation) {
            Ok(data) => return claims(data.claims),
            Err(e) => match e.kind() {
                ErrorKind::InvalidSignature => {}
                ErrorKind::ExpiredSignature => return Err(JwtError::Expired),
                ErrorKind::ImmatureSignature => return Err(JwtError::NotYetValid),
                _ => return Err(JwtError::Malformed(e.to_string())),
            },
        }
    }
    Err(JwtError::BadSignature)
}

/// Checks `iat` (jsonwebtoken does not), then reads the claims as `C`.
fn claims<C: DeserializeOwned>(claims: Map<String, Value>) -> Result<C, JwtError> {
    match claims.get("iat") {
        None | Some(Value::Null) => {}
        Some(Value::Number(iat)) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            let iat = iat.as_f64().unwrap_or(f64::INFINITY);
            if iat > now + LEEWAY_SECS as f64 {
                return Err(JwtError::IssuedInFuture);
            }
        }
        Some(_) => return Err(JwtError::Malformed("iat must be a number".into())),
    }
    serde_json::from_value(Value::Object(claims)).map_err(|e| JwtError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    const KEY: &str = "a-key-of-enough-bytes";

    #[derive(Debug, Deserialize)]
    struct Claims {
        sub: String,
    }

    fn sign(claims: Value) -> String {
        let key = EncodingKey::from_secret(KEY.as_bytes());
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap()
    }

    fn now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn check(claims: Value) -> Result<Claims, JwtError> {
        verify(
            &["other-key-of-enough-bytes".into(), KEY.into()],
            &sign(claims),
        )
    }

    #[test]
    fn times_within_the_leeway_pass() {
        let t = now();
        let ok = check(json!({"sub": "u", "exp": t + 60, "nbf": t + 2, "iat": t + 2})).unwrap();
        assert_eq!(ok.sub, "u");
        assert!(check(json!({"sub": "u", "exp": t + 60, "nbf": t - 600, "iat": t - 600})).is_ok());
        assert!(check(json!({"sub": "u", "exp": t + 60, "iat": t as f64 + 0.5})).is_ok());
        assert!(
            check(json!({"sub": "u", "exp": t + 60})).is_ok(),
            "nbf and iat are optional"
        );
    }

    #[test]
    fn a_token_not_valid_yet_is_refused() {
        let t = now();
        assert_eq!(
            check(json!({"sub": "u", "exp": t + 600, "nbf": t + 60})).unwrap_err(),
            JwtError::NotYetValid
        );
    }

    #[test]
    fn a_token_issued_in_the_future_is_refused() {
        let t = now();
        assert_eq!(
            check(json!({"sub": "u", "exp": t + 600, "iat": t + 60})).unwrap_err(),
            JwtError::IssuedInFuture
        );
        assert_eq!(
            check(json!({"sub": "u", "exp": t + 600, "iat": 1e300})).unwrap_err(),
            JwtError::IssuedInFuture
        );
        assert!(matches!(
            check(json!({"sub": "u", "exp": t + 600, "iat": "now"})),
            Err(JwtError::Malformed(_))
        ));
    }

    #[test]
    fn signature_expiry_and_shape() {
        let t = now();
        let wrong = {
            let key = EncodingKey::from_secret(b"not-one-of-the-configured-keys");
            jsonwebtoken::encode(
                &Header::new(Algorithm::HS256),
                &json!({"exp": t + 60}),
                &key,
            )
            .unwrap()
        };
        assert_eq!(
            verify::<Value>(&[KEY.into()], &wrong).unwrap_err(),
            JwtError::BadSignature
        );
        assert_eq!(
            check(json!({"sub": "u", "exp": t - 600})).unwrap_err(),
            JwtError::Expired
        );
        assert!(
            matches!(check(json!({"sub": "u"})), Err(JwtError::Malformed(_))),
            "exp is required"
        );
        assert!(
            matches!(check(json!({"exp": t + 60})), Err(JwtError::Malformed(_))),
            "claims shape"
        );
    }
}
