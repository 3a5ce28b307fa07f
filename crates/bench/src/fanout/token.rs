//! Client access tokens for statehub's Web PubSub endpoint: HS256 JWTs signed with
//! the access key, as `@azure/web-pubsub`'s `getClientAccessToken` makes them.
//! Subscribers get the group in `webpubsub.group`, so they are in it on connect.

use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

use super::wire::GROUP;

pub fn client_token(key: &str, audience: &str, role: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("--access-key is required for --target statehub".into());
    }
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs()
        + 3600;
    let claims = if role == "sub" {
        json!({"aud": audience, "exp": exp, "sub": "bench-sub", "webpubsub.group": [GROUP]})
    } else {
        json!({"aud": audience, "exp": exp, "sub": "bench-pub", "role": [format!("webpubsub.sendToGroup.{GROUP}")]})
    };
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(key.as_bytes()),
    )
    .map_err(|e| format!("token: {e}"))
}
