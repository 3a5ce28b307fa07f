//! REST authentication: `Authorization: Bearer <JWT>`, checked by [`crate::jwt`], with
//! the request's URL as audience — exactly what both server SDKs sign (`aud` = the full
//! request URL, query included).
//!
//! The audience's path must equal the request's path, and its query the request's query
//! when it has one (the service accepts an audience without the query); both compared
//! case-insensitively after percent-decoding, since HTTP stacks differ in which
//! characters they escape (`'` or `%27`) between signing and sending. As for client
//! tokens, scheme and authority are not compared: one server answers under several
//! names and behind proxies, the key proves the issuer, and the path and query bind the
//! token to this one operation.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use percent_encoding::percent_decode_str;
use serde::Deserialize;

use super::ApiError;
use crate::jwt::JwtError;
use crate::WebPubSub;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct Claims {
    aud: Option<Audience>,
}

/// Middleware: refuses the request with 401 unless it carries a valid token for its URL.
pub(super) async fn require_token(
    State(state): State<WebPubSub>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .ok_or_else(|| ApiError::Unauthorized("A bearer token is required".into()))?;
    let uri = req.uri();
    validate(&state.config().access_keys, token, uri.path(), uri.query())?;
    Ok(next.run(req).await)
}

/// Checks a token for a request to `path?query`.
pub(crate) fn validate(
    keys: &[String],
    token: &str,
    path: &str,
    query: Option<&str>,
) -> Result<(), ApiError> {
    let claims: Claims = crate::jwt::verify(keys, token).map_err(|e| {
        ApiError::Unauthorized(match e {
            JwtError::BadSignature => "The token is not signed by any access key".into(),
            JwtError::Expired => "The token has expired".into(),
            JwtError::NotYetValid => "The token is not valid yet (nbf)".into(),
            JwtError::IssuedInFuture => "The token was issued in the future (iat)".into(),
            JwtError::Malformed(e) => format!("Invalid token: {e}"),
        })
    })?;
    let auds = match claims.aud {
        None => Vec::new(),
        Some(Audience::One(a)) => vec![a],
        Some(Audience::Many(v)) => v,
    };
    if auds.iter().any(|a| audience_matches(a, path, query)) {
        return Ok(());
    }
    Err(ApiError::Unauthorized(format!(
        "The token's audience {auds:?} is not this request's URL"
    )))
}

/// Does `aud` (an absolute URL) name `path?query`?
fn audience_matches(aud: &str, path: &str, query: Option<&str>) -> bool {
    let Some((_, rest)) = aud.split_once("://") else {
        return false;
    };
    let target = rest.find('/').map_or("/", |i| &rest[i..]);
    let target = target.split('#').next().unwrap_or_default();
    let (aud_path, aud_query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    if !same(aud_path, path) {
        return false;
    }
    match aud_query {
        None | Some("") => true,
        Some(q) => query.is_some_and(|r| same(r, q)),
    }
}

fn same(a: &str, b: &str) -> bool {
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().to_lowercase();
    a.eq_ignore_ascii_case(b) || decode(a) == decode(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::tests::sign;
    use serde_json::json;

    fn exp() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 60
    }

    const PATH: &str = "/api/hubs/chat/:send";
    const QUERY: &str = "api-version=2024-12-01";

    fn check(claims: serde_json::Value, key: &str) -> Result<(), ApiError> {
        validate(
            &["k1".into(), "k2".into()],
            &sign(claims, key),
            PATH,
            Some(QUERY),
        )
    }

    #[test]
    fn audiences() {
        let url = "http://localhost:8080/api/hubs/chat/:send?api-version=2024-12-01";
        assert!(check(json!({"aud": url, "exp": exp()}), "k2").is_ok());
        let no_query = "https://proxy.example/api/hubs/chat/:send";
        assert!(check(json!({"aud": no_query, "exp": exp()}), "k1").is_ok());
        let upper = "HTTP://H/API/HUBS/CHAT/%3ASEND?API-VERSION=2024-12-01";
        assert!(check(json!({"aud": [upper], "exp": exp()}), "k1").is_ok());
        for bad in [
            "http://h/api/hubs/other/:send?api-version=2024-12-01",
            "http://h/api/hubs/chat/:send?api-version=2021-10-01",
            "http://h/api/hubs/chat/:send/x",
            "/api/hubs/chat/:send",
        ] {
            assert!(
                matches!(
                    check(json!({"aud": bad, "exp": exp()}), "k1"),
                    Err(ApiError::Unauthorized(_))
                ),
                "{bad}"
            );
        }
        assert!(check(json!({"exp": exp()}), "k1").is_err(), "no audience");
    }

    #[test]
    fn signature_and_expiry() {
        let url = "http://h/api/hubs/chat/:send";
        assert!(check(json!({"aud": url, "exp": exp()}), "other").is_err());
        assert!(check(json!({"aud": url, "exp": 1000}), "k1").is_err());
        assert!(check(json!({"aud": url}), "k1").is_err(), "exp is required");
        assert!(validate(&[], "garbage", PATH, None).is_err());
    }

    #[test]
    fn future_nbf_and_iat_are_refused() {
        let url = "http://h/api/hubs/chat/:send";
        let later = exp();
        assert!(check(json!({"aud": url, "exp": later + 60, "nbf": later}), "k1").is_err());
        assert!(check(json!({"aud": url, "exp": later + 60, "iat": later}), "k1").is_err());
        assert!(check(
            json!({"aud": url, "exp": later, "nbf": 1000, "iat": 1000}),
            "k1"
        )
        .is_ok());
    }
}
