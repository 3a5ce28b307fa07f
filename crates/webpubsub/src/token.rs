//! Client access tokens: JWTs checked by [`crate::jwt`], bound to a hub by their audience.
//!
//! The audience is `http(s)://host[:port]/client/hubs/{hub}`. Only the path is compared
//! (hub case-insensitively): one server answers under several host names (localhost,
//! 127.0.0.1, a proxy's name) and the SDK puts whatever endpoint it was configured with;
//! the signature already proves the key holder issued it, the path binds it to the hub.
//! `exp` is checked at connect only; recovery never re-validates the token.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};

use crate::jwt::JwtError;
use crate::permissions::Permissions;

/// Why a token was refused. Every variant becomes HTTP 401.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    /// No `access_token` query parameter nor bearer header.
    #[error("no access token")]
    Missing,
    /// Not a valid token signed by one of the keys.
    #[error(transparent)]
    Invalid(#[from] JwtError),
    /// `aud` is not this hub's client endpoint.
    #[error("audience {0:?} is not this hub's client endpoint")]
    Audience(String),
}

/// A claim that may be one string or an array of strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::None => Vec::new(),
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct RawClaims {
    #[serde(default)]
    aud: OneOrMany,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sub: Option<String>,
    exp: u64,
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default)]
    role: OneOrMany,
    #[serde(default, rename = "webpubsub.group")]
    group: OneOrMany,
}

/// What a valid client token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientClaims {
    /// `sub`, when present and not empty.
    pub user_id: Option<String>,
    /// The `role` claims.
    pub roles: Vec<String>,
    /// The `webpubsub.group` claims: groups joined on connect.
    pub groups: Vec<String>,
}

impl ClientClaims {
    /// The permissions the roles grant.
    pub fn permissions(&self) -> Permissions {
        Permissions::from_roles(&self.roles)
    }
}

/// Validates a client token for `hub` against each key in turn (primary, secondary).
pub(crate) fn validate_client_token(
    keys: &[String],
    token: &str,
    hub: &str,
) -> Result<ClientClaims, TokenError> {
    claims_for_hub(crate::jwt::verify(keys, token)?, hub)
}

fn claims_for_hub(raw: RawClaims, hub: &str) -> Result<ClientClaims, TokenError> {
    let auds = raw.aud.into_vec();
    if !auds.iter().any(|a| audience_matches(a, hub)) {
        return Err(TokenError::Audience(auds.join(",")));
    }
    Ok(ClientClaims {
        user_id: raw.sub.filter(|s| !s.is_empty()),
        roles: raw.role.into_vec(),
        groups: raw.group.into_vec(),
    })
}

/// `scheme://authority/client/hubs/{hub}` with any scheme and authority, extra slashes
/// and a trailing slash tolerated.
fn audience_matches(aud: &str, hub: &str) -> bool {
    let Some((_, rest)) = aud.split_once("://") else {
        return false;
    };
    let Some((_, path)) = rest.split_once('/') else {
        return false;
    };
    let path = path.trim_matches('/');
    let Some(rest) = path.strip_prefix("client/hubs/") else {
        return false;
    };
    rest.eq_ignore_ascii_case(hub)
}

/// The claims of a token already validated, each as a list of strings (arrays as their
/// elements, other values as their JSON text), for the upstream `connect` event.
pub(crate) fn claims_map(token: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    let payload = token
        .split('.')
        .nth(1)
        .and_then(|p| URL_SAFE_NO_PAD.decode(p.trim_end_matches('=')).ok())
        .and_then(|b| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&b).ok())
        .unwrap_or_default();
    let text = |v: serde_json::Value| match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    payload
        .into_iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            let values = match v {
                serde_json::Value::Array(items) => items.into_iter().map(text).collect(),
                other => vec![text(other)],
            };
            (k, values)
        })
        .collect()
}

/// Mints a client token as the server SDKs do, for `{endpoint}/client/hubs/{hub}`.
pub fn issue_client_token(
    key: &str,
    endpoint: &str,
    hub: &str,
    claims: &ClientClaims,
    ttl: Duration,
) -> String {
    let audience = format!("{}/client/hubs/{hub}", endpoint.trim_end_matches('/'));
    issue_token(key, &audience, claims, ttl)
}

/// Mints a token for any audience (the REST API's `:generateToken` also serves MQTT
/// client audiences).
pub fn issue_token(key: &str, audience: &str, claims: &ClientClaims, ttl: Duration) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let raw = RawClaims {
        aud: OneOrMany::One(audience.to_owned()),
        sub: claims.user_id.clone(),
        exp: now + ttl.as_secs(),
        iat: Some(now),
        role: OneOrMany::Many(claims.roles.clone()),
        group: OneOrMany::Many(claims.groups.clone()),
    };
    // HS256 with an in-memory key and serializable claims cannot fail.
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &raw,
        &EncodingKey::from_secret(key.as_bytes()),
    )
    .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "secret-key";

    /// `claims` as an HS256 token signed with `key`.
    pub(crate) fn sign(claims: serde_json::Value, key: &str) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(key.as_bytes()),
        )
        .unwrap()
    }

    fn now() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    fn keys() -> Vec<String> {
        vec!["other".into(), KEY.into()]
    }

    #[test]
    fn valid_token_with_single_role_and_group_strings() {
        let t = sign(
            json!({"aud":"http://localhost:8080/client/hubs/Chat","sub":"u1","exp":now()+60,
                   "role":"webpubsub.sendToGroup","webpubsub.group":"g1"}),
            KEY,
        );
        let c = validate_client_token(&keys(), &t, "chat").unwrap();
        assert_eq!(c.user_id.as_deref(), Some("u1"));
        assert_eq!(c.roles, ["webpubsub.sendToGroup"]);
        assert_eq!(c.groups, ["g1"]);
        assert!(c.permissions().can_send("x"));
    }

    #[test]
    fn arrays_and_anonymous() {
        let t = sign(
            json!({"aud":"https://h/client/hubs/chat/","exp":now()+60,"role":["a","b"],"webpubsub.group":["g1","g2"]}),
            KEY,
        );
        let c = validate_client_token(&keys(), &t, "chat").unwrap();
        assert_eq!(
            c,
            ClientClaims {
                user_id: None,
                roles: vec!["a".into(), "b".into()],
                groups: vec!["g1".into(), "g2".into()]
            }
        );
    }

    #[test]
    fn refusals() {
        let aud = "http://h/client/hubs/chat";
        let wrong_key = sign(json!({"aud":aud,"exp":now()+60}), "nope");
        assert_eq!(
            validate_client_token(&keys(), &wrong_key, "chat"),
            Err(TokenError::Invalid(JwtError::BadSignature))
        );
        let expired = sign(json!({"aud":aud,"exp":now()-3600}), KEY);
        assert_eq!(
            validate_client_token(&keys(), &expired, "chat"),
            Err(TokenError::Invalid(JwtError::Expired))
        );
        let other_hub = sign(json!({"aud":aud,"exp":now()+60}), KEY);
        assert!(matches!(
            validate_client_token(&keys(), &other_hub, "news"),
            Err(TokenError::Audience(_))
        ));
        let no_exp = sign(json!({"aud":aud}), KEY);
        assert!(matches!(
            validate_client_token(&keys(), &no_exp, "chat"),
            Err(TokenError::Invalid(JwtError::Malformed(_)))
        ));
        let not_yet = sign(json!({"aud":aud,"exp":now()+600,"nbf":now()+60}), KEY);
        assert_eq!(
            validate_client_token(&keys(), &not_yet, "chat"),
            Err(TokenError::Invalid(JwtError::NotYetValid))
        );
        let future = sign(json!({"aud":aud,"exp":now()+600,"iat":now()+60}), KEY);
        assert_eq!(
            validate_client_token(&keys(), &future, "chat"),
            Err(TokenError::Invalid(JwtError::IssuedInFuture))
        );
        assert!(matches!(
            validate_client_token(&keys(), "garbage", "chat"),
            Err(TokenError::Invalid(JwtError::Malformed(_)))
        ));
    }

    #[test]
    fn audience_forms() {
        assert!(audience_matches(
            "http://localhost:8080/client/hubs/chat",
            "chat"
        ));
        assert!(audience_matches(
            "https://x.example//client/hubs/CHAT",
            "chat"
        ));
        assert!(!audience_matches("http://h/client/hubs/chat/extra", "chat"));
        assert!(!audience_matches("http://h/api/hubs/chat", "chat"));
        assert!(!audience_matches("chat", "chat"));
    }

    #[test]
    fn claims_for_the_connect_event() {
        let t = sign(
            json!({"aud":"http://h/client/hubs/chat","sub":"u","exp":5,"role":["a","b"],"x":null}),
            KEY,
        );
        let m = claims_map(&t);
        assert_eq!(m["sub"], ["u"]);
        assert_eq!(m["role"], ["a", "b"]);
        assert_eq!(m["exp"], ["5"]);
        assert!(!m.contains_key("x"));
        assert!(claims_map("garbage").is_empty());
    }

    #[test]
    fn issued_tokens_validate() {
        let claims = ClientClaims {
            user_id: Some("u".into()),
            roles: vec!["webpubsub.joinLeaveGroup".into()],
            groups: vec![],
        };
        let t = issue_client_token(
            KEY,
            "http://localhost:1/",
            "chat",
            &claims,
            Duration::from_secs(60),
        );
        assert_eq!(validate_client_token(&keys(), &t, "chat").unwrap(), claims);
    }
}
