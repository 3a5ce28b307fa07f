//! The client endpoint: `/client/hubs/{hub}` and `/client?hub={hub}`, with the JSON and
//! protobuf subprotocols (reliable or not) or none (raw).
//!
//! The handshake decides everything before the upgrade that can be answered with an
//! HTTP status (bad hub name, unsupported subprotocol, bad token → 401). Recovery is the
//! exception: the official clients keep retrying a refused upgrade for 30 s, so a
//! recovery that names a missing session or a wrong reconnection token is accepted and
//! then closed with 1008, which tells them the session is gone. The access token is not
//! re-validated on recovery: it may have expired while the client was away.

use std::collections::HashMap;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

use crate::connection::{refuse, serve};
use crate::hub::{Gone, CLOSE_POLICY};
use crate::protocol::Subprotocol;
use crate::token::{validate_client_token, TokenError};
use crate::WebPubSub;

/// Why a handshake was refused before the upgrade.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The hub name is not valid.
    #[error("invalid hub name {0:?}")]
    BadHub(String),
    /// `/client` without `hub`.
    #[error("missing hub")]
    MissingHub,
    /// The client offered only subprotocols this service does not speak.
    #[error("unsupported subprotocol {0:?}")]
    Subprotocol(String),
    /// The access token was refused.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// Not a WebSocket upgrade request.
    #[error(transparent)]
    NotWebSocket(#[from] WebSocketUpgradeRejection),
}

impl IntoResponse for HandshakeError {
    fn into_response(self) -> Response {
        match self {
            Self::NotWebSocket(rejection) => rejection.into_response(),
            Self::Token(e) => (StatusCode::UNAUTHORIZED, e.to_string()).into_response(),
            other => (StatusCode::BAD_REQUEST, other.to_string()).into_response(),
        }
    }
}

/// The client WebSocket routes.
pub fn router(state: WebPubSub) -> Router {
    Router::new()
        .route("/client/hubs/{hub}", any(client_by_path))
        .route("/client", any(client_by_query))
        .with_state(state)
}

type Upgrade = Result<WebSocketUpgrade, WebSocketUpgradeRejection>;

async fn client_by_path(
    State(state): State<WebPubSub>,
    Path(hub): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    handshake(&state, &hub, &query, &headers, ws)
}

async fn client_by_query(
    State(state): State<WebPubSub>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    let hub = query.get("hub").ok_or(HandshakeError::MissingHub)?;
    handshake(&state, hub, &query, &headers, ws)
}

/// Hub names start with a letter, at most 128 of letters, digits and `_`,.[]`.
fn valid_hub(name: &str) -> bool {
    crate::hub::valid_hub_name(name)
}

/// The subprotocol to echo: the first offered one this service speaks; raw when none
/// is offered.
fn negotiate(headers: &HeaderMap) -> Result<Subprotocol, HandshakeError> {
    let offered: Vec<&str> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if offered.is_empty() {
        return Ok(Subprotocol::Raw);
    }
    offered
        .iter()
        .find_map(|name| Subprotocol::from_name(name))
        .ok_or_else(|| HandshakeError::Subprotocol(offered.join(",")))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn handshake(
    state: &WebPubSub,
    hub_name: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    if !valid_hub(hub_name) {
        return Err(HandshakeError::BadHub(hub_name.to_owned()));
    }
    let protocol = negotiate(headers)?;
    let recovery = query
        .get("awps_connection_id")
        .zip(query.get("awps_reconnection_token"));
    let claims = match recovery {
        Some(_) => None,
        None => {
            let token = query
                .get("access_token")
                .map(String::as_str)
                .or_else(|| bearer(headers))
                .ok_or(TokenError::Missing)?;
            Some(validate_client_token(
                &state.config().access_keys,
                token,
                hub_name,
            )?)
        }
    };
    let limits = state.config().limits.clone();
    let mut ws = ws?
        .max_frame_size(limits.max_frame_bytes)
        .max_message_size(limits.max_frame_bytes);
    if let Some(name) = protocol.name() {
        ws = ws.protocols([name]);
    }
    let hub = state.hub(hub_name);
    let response = match (claims, recovery) {
        (Some(claims), _) => ws.on_upgrade(move |socket| async move {
            let session = hub.create_session(&claims, protocol);
            serve(socket, hub, session, limits).await;
        }),
        (None, Some((id, token))) => {
            // The session keeps the subprotocol it was created with; a client offering
            // another one could not read its frames.
            let found = hub.recover(id, token).and_then(|s| {
                if s.protocol() == protocol {
                    Ok(s)
                } else {
                    Err(Gone)
                }
            });
            ws.on_upgrade(move |socket| async move {
                match found {
                    Ok(session) => serve(socket, hub, session, limits).await,
                    Err(gone) => refuse(socket, CLOSE_POLICY, &gone.to_string()).await,
                }
            })
        }
        (None, None) => return Err(TokenError::Missing.into()),
    };
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn offered(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(v).unwrap(),
        );
        h
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(&HeaderMap::new()).unwrap(), Subprotocol::Raw);
        assert_eq!(
            negotiate(&offered("json.reliable.webpubsub.azure.v1")).unwrap(),
            Subprotocol::JsonReliable
        );
        assert_eq!(
            negotiate(&offered("x, json.webpubsub.azure.v1")).unwrap(),
            Subprotocol::Json
        );
        assert_eq!(
            negotiate(&offered("protobuf.reliable.webpubsub.azure.v1")).unwrap(),
            Subprotocol::ProtobufReliable
        );
        assert!(matches!(
            negotiate(&offered("mqtt, protobuf.webpubsub.azure.v2")),
            Err(HandshakeError::Subprotocol(_))
        ));
    }

    #[test]
    fn hub_names() {
        assert!(valid_hub("chat_1"));
        assert!(valid_hub("a.b[1],`c`"));
        assert!(!valid_hub("1chat"));
        assert!(!valid_hub(""));
        assert!(!valid_hub("a-b"));
        assert!(!valid_hub(&"a".repeat(129)));
    }
}
