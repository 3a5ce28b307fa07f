//! `POST /api/hubs/{hub}/:generateToken` and `HEAD /api/health`.
//!
//! A generated token is what the SDKs mint locally: HS256 with the primary access key,
//! `aud` = this server's client URL as the caller reached it, `sub`, `role`,
//! `webpubsub.group`, and `exp` after `minutesToExpire` (default 60). `clientType=MQTT`
//! gets the service's MQTT client audience (`/clients/mqtt/hubs/{hub}`); statehub does
//! not serve MQTT-over-WebSocket Web PubSub clients, so such a token is only useful
//! against a real service.

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::{check_group, origin, ApiError, ApiResult, Params};
use crate::token::{issue_token, ClientClaims};
use crate::WebPubSub;

#[derive(Debug, Serialize)]
struct TokenResponse {
    token: String,
}

/// Handles `:generateToken`.
pub(super) fn generate(
    state: &WebPubSub,
    hub: &str,
    params: &Params,
    headers: &HeaderMap,
) -> ApiResult<Response> {
    let minutes = params
        .int("minutesToExpire", 1, i64::from(i32::MAX))?
        .unwrap_or(60);
    let path = match params.get("clientType") {
        None => "client",
        Some(t) if t.eq_ignore_ascii_case("default") => "client",
        Some(t) if t.eq_ignore_ascii_case("mqtt") => "clients/mqtt",
        Some(t) => {
            return Err(ApiError::BadRequest(format!(
                "Unknown clientType {t:?}; use Default or MQTT"
            )))
        }
    };
    let groups = params.all("group");
    for g in &groups {
        check_group(g)?;
    }
    let claims = ClientClaims {
        user_id: params
            .get("userId")
            .filter(|u| !u.is_empty())
            .map(str::to_owned),
        roles: params.all("role"),
        groups,
    };
    // The router is only mounted when at least one key is configured.
    let key = state
        .config()
        .access_keys
        .first()
        .cloned()
        .unwrap_or_default();
    let audience = format!("{}/{path}/hubs/{hub}", origin(headers));
    let ttl = Duration::from_secs(u64::try_from(minutes).unwrap_or(60) * 60);
    let token = issue_token(&key, &audience, &claims, ttl);
    Ok(Json(TokenResponse { token }).into_response())
}

/// `HEAD /api/health` (and `GET`): 200 while the server runs; no token needed.
pub(super) async fn health() -> StatusCode {
    StatusCode::OK
}
