//! The client endpoint: `/client/hubs/{hub}` and `/client?hub={hub}`, with the JSON and
//! protobuf subprotocols (reliable or not) or none (raw).
//!
//! The handshake decides everything before the upgrade that can be answered with an
//! HTTP status (bad hub name, unsupported subprotocol, bad token → 401). Recovery is the
//! exception: the official clients keep retrying a refused upgrade for 30 s, so a
//! recovery that names a missing session or a wrong reconnection token is accepted and
//! then closed with 1008, which tells them the session is gone. The access token is not
//! re-validated on recovery: it may have expired while the client was away.
//!
//! When the hub has a `connect` handler, the blocking `connect` event runs before the
//! upgrade (a new connection only, not a recovery): its answer may change the user id,
//! add groups and roles, choose the subprotocol (then also one this service does not
//! speak, served as raw), or refuse the handshake with its status. A hub that allows
//! anonymous clients accepts a handshake without a token.

use std::collections::{BTreeMap, HashMap, HashSet};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;

use crate::connection::{refuse, serve};
use crate::hub::{
    new_connection_id, HubFull, NewSession, Unrecoverable, CLOSE_POLICY, CLOSE_TRY_AGAIN,
};
use crate::mirror::Elsewhere;
use crate::protocol::Subprotocol;
use crate::token::{claims_map, validate_client_token, ClientClaims, TokenError};
use crate::upstream::cloudevents::{ConnectRequest, UpstreamError};
use crate::upstream::events::{Connecting, HubEvents};
use crate::WebPubSub;

/// Why a handshake was refused before the upgrade.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
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
    /// The `connect` handler refused or failed.
    #[error("the connect event handler refused the connection: {0}")]
    Upstream(#[from] UpstreamError),
    /// The `connect` handler chose a subprotocol the client did not offer.
    #[error("the connect event handler chose subprotocol {0:?}, which the client did not offer")]
    UpstreamSubprotocol(String),
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The hub holds `max_connections_per_hub` sessions.
    #[error(transparent)]
    HubFull(#[from] HubFull),
    /// The token (with the `connect` handler's answer) lists more groups than a
    /// connection may be in.
    #[error("the connection would be in {0} groups, more than the {1} a connection may be in")]
    TooManyGroups(usize, usize),
}

impl IntoResponse for HandshakeError {
    fn into_response(self) -> Response {
        let status = match &self {
            Self::NotWebSocket(_) => StatusCode::BAD_REQUEST,
            Self::Token(_) => StatusCode::UNAUTHORIZED,
            Self::Upstream(e) => StatusCode::from_u16(e.handshake_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Self::UpstreamSubprotocol(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            Self::HubFull(_) => StatusCode::TOO_MANY_REQUESTS,
            Self::BadHub(_) | Self::MissingHub | Self::Subprotocol(_) | Self::TooManyGroups(..) => {
                StatusCode::BAD_REQUEST
            }
        };
        // As the REST API's: `{code, message}` in JSON, for a client to show.
        let code = match self {
            Self::NotWebSocket(rejection) => return rejection.into_response(),
            Self::Token(_) => "Unauthorized",
            Self::HubFull(_) => "TooManyConnections",
            Self::TooManyGroups(..) => "BadRequest",
            other => return (status, other.to_string()).into_response(),
        };
        let body = serde_json::json!({"code": code, "message": self.to_string()});
        (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            body.to_string(),
        )
            .into_response()
    }
}

/// The client WebSocket routes.
pub(crate) fn router(state: WebPubSub) -> Router {
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
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    let req = Handshake {
        query: &query,
        raw_query: raw.as_deref(),
        headers: &headers,
    };
    handshake(&state, &hub, req, ws).await
}

async fn client_by_query(
    State(state): State<WebPubSub>,
    Query(query): Query<HashMap<String, String>>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    let hub = query.get("hub").ok_or(HandshakeError::MissingHub)?.clone();
    let req = Handshake {
        query: &query,
        raw_query: raw.as_deref(),
        headers: &headers,
    };
    handshake(&state, &hub, req, ws).await
}

/// What the client sent with its upgrade request.
#[derive(Debug, Clone, Copy)]
struct Handshake<'a> {
    query: &'a HashMap<String, String>,
    raw_query: Option<&'a str>,
    headers: &'a HeaderMap,
}

/// Hub names start with a letter, at most 128 of letters, digits and `_`,.[]`.
fn valid_hub(name: &str) -> bool {
    crate::protocol::valid_hub_name(name)
}

/// The subprotocol to echo: the first offered one this service speaks; raw when none
/// is offered.
fn negotiate(headers: &HeaderMap) -> Result<Subprotocol, HandshakeError> {
    let offered = offered(headers);
    if offered.is_empty() {
        return Ok(Subprotocol::Raw);
    }
    offered
        .iter()
        .find_map(|name| Subprotocol::from_name(name))
        .ok_or_else(|| HandshakeError::Subprotocol(offered.join(",")))
}

/// The subprotocols the client offered, in its order.
fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The `connect` event's body: the token's claims, the query without the token, the
/// headers without `Authorization`, the offered subprotocols.
fn connect_request(req: Handshake<'_>, token: Option<&str>, offered: &[String]) -> ConnectRequest {
    let mut query: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let pairs: Vec<(String, String)> = req
        .raw_query
        .and_then(|q| serde_urlencoded::from_str(q).ok())
        .unwrap_or_default();
    for (k, v) in pairs {
        if k != "access_token" {
            query.entry(k).or_default().push(v);
        }
    }
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in req.headers {
        if name != header::AUTHORIZATION {
            if let Ok(v) = value.to_str() {
                headers
                    .entry(name.as_str().to_owned())
                    .or_default()
                    .push(v.to_owned());
            }
        }
    }
    ConnectRequest {
        claims: token.map(claims_map).unwrap_or_default(),
        query,
        headers,
        subprotocols: offered.to_vec(),
        client_certificates: Vec::new(),
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

async fn handshake(
    state: &WebPubSub,
    hub_name: &str,
    req: Handshake<'_>,
    ws: Upgrade,
) -> Result<Response, HandshakeError> {
    if state.is_shutting_down() {
        return Err(HandshakeError::ShuttingDown);
    }
    if !valid_hub(hub_name) {
        return Err(HandshakeError::BadHub(hub_name.to_owned()));
    }
    let offered = offered(req.headers);
    let events = state.hub_events(hub_name);
    let takes_connect = events.as_ref().is_some_and(|e| e.takes_connect());
    let protocol = if takes_connect {
        offered
            .iter()
            .find_map(|name| Subprotocol::from_name(name))
            .unwrap_or(Subprotocol::Raw)
    } else {
        negotiate(req.headers)?
    };
    let recovery = req
        .query
        .get("awps_connection_id")
        .zip(req.query.get("awps_reconnection_token"));
    if let Some(names) = recovery {
        return Ok(recover(state, hub_name, names, protocol, ws?));
    }

    let token = req
        .query
        .get("access_token")
        .map(String::as_str)
        .or_else(|| bearer(req.headers));
    let claims = match token {
        Some(t) => validate_client_token(&state.config().access_keys, t, hub_name)?,
        None if state.hub_settings(hub_name).allow_anonymous => ClientClaims {
            user_id: None,
            roles: Vec::new(),
            groups: Vec::new(),
        },
        None => return Err(TokenError::Missing.into()),
    };
    let ws = ws?;
    let hub = state.hub(hub_name);
    let slot = hub.reserve()?;
    let mut new = NewSession {
        connection_id: Some(new_connection_id()),
        claims,
        protocol,
        subprotocol: protocol.name().map(str::to_owned),
        connection_state: None,
    };
    if let Some(events) = events.filter(|_| takes_connect) {
        let request = connect_request(req, token, &offered);
        connect_event(&events, hub.name(), &request, &offered, &mut new).await?;
    }
    check_groups(&hub, &new)?;
    if new.subprotocol.is_none() && !offered.is_empty() {
        // A client that offered subprotocols fails an upgrade that echoes none.
        return Err(HandshakeError::Subprotocol(offered.join(",")));
    }
    let limits = state.config().limits.clone();
    let mut ws = upgrade(ws, &limits);
    if let Some(name) = &new.subprotocol {
        ws = ws.protocols([name.clone()]);
    }
    let tracked = state.clone();
    Ok(ws.on_upgrade(move |socket| {
        tracked.track(async move {
            let session = hub.open(new);
            drop(slot);
            serve(socket, hub, session, limits).await;
        })
    }))
}

/// Refuses a connection whose initial groups (the token's and the `connect` answer's,
/// each counted once) exceed `max_groups_per_connection`.
fn check_groups(hub: &crate::hub::Hub, new: &NewSession) -> Result<(), HandshakeError> {
    let max = hub.limits().max_groups_per_connection;
    let n = new.claims.groups.iter().collect::<HashSet<_>>().len();
    if n > max {
        let id = new.connection_id.as_deref().unwrap_or_default();
        hub.stats().group_limit(hub.name(), id, max);
        return Err(HandshakeError::TooManyGroups(n, max));
    }
    Ok(())
}

/// A recovering socket is accepted either way: a missing session, a wrong token or
/// another subprotocol than the session's (whose frames the client could not read)
/// closes it with 1008, which tells the official clients to stop retrying. A hub is
/// not created for a recovery (nothing is authenticated yet).
fn recover(
    state: &WebPubSub,
    hub_name: &str,
    (id, token): (&String, &String),
    protocol: Subprotocol,
    ws: WebSocketUpgrade,
) -> Response {
    let found = state
        .existing_hub(hub_name)
        .ok_or(Unrecoverable::Gone)
        .and_then(|hub| Ok((hub.recover(id, token)?, hub)))
        .and_then(|(s, hub)| {
            if s.protocol() == protocol {
                Ok((s, hub))
            } else {
                Err(Unrecoverable::Gone)
            }
        });
    let limits = state.config().limits.clone();
    let mut ws = upgrade(ws, &limits);
    if let Some(name) = protocol.name() {
        ws = ws.protocols([name]);
    }
    let tracked = state.clone();
    let (hub_name, id, token) = (hub_name.to_owned(), id.clone(), token.clone());
    ws.on_upgrade(move |socket| {
        let service = tracked.clone();
        tracked.track(async move {
            let found = match found {
                Err(Unrecoverable::Gone) if service.in_cluster() => service
                    .recover_elsewhere(&hub_name, &id, &token, protocol)
                    .await
                    .map(|(hub, session)| {
                        crate::hub::stream::watch_restored(&hub, &session);
                        (session, hub)
                    }),
                other => other.map_err(Elsewhere::Refused),
            };
            service.inner.stats.recovery(found.is_ok());
            match found {
                Ok((session, hub)) => serve(socket, hub, session, limits).await,
                Err(Elsewhere::Refused(why)) => {
                    refuse(socket, protocol, CLOSE_POLICY, &why.to_string()).await;
                }
                Err(Elsewhere::Later(why)) => {
                    let why = format!("The session cannot be recovered now: {why}");
                    refuse(socket, protocol, CLOSE_TRY_AGAIN, &why).await;
                }
            }
        })
    })
}

/// Runs the blocking `connect` event and applies the handler's answer to the new
/// session: user id, extra groups and roles, connection state, and the subprotocol
/// (one the client offered; one this service does not speak is served as raw).
async fn connect_event(
    events: &HubEvents,
    hub: &str,
    request: &ConnectRequest,
    offered: &[String],
    new: &mut NewSession,
) -> Result<(), HandshakeError> {
    let who = Connecting {
        hub,
        connection_id: new.connection_id.as_deref().unwrap_or_default(),
        user_id: new.claims.user_id.as_deref(),
    };
    let Some((answer, state)) = events.connect(who, request).await? else {
        return Ok(());
    };
    if let Some(user) = answer.user_id.filter(|u| !u.is_empty()) {
        new.claims.user_id = Some(user);
    }
    new.claims.groups.extend(answer.groups);
    new.claims.roles.extend(answer.roles);
    new.connection_state = state;
    if let Some(chosen) = answer.subprotocol.filter(|p| !p.is_empty()) {
        if !offered.contains(&chosen) {
            return Err(HandshakeError::UpstreamSubprotocol(chosen));
        }
        new.protocol = Subprotocol::from_name(&chosen).unwrap_or(Subprotocol::Raw);
        new.subprotocol = Some(chosen);
    }
    Ok(())
}

fn upgrade(ws: WebSocketUpgrade, limits: &crate::Limits) -> WebSocketUpgrade {
    ws.max_frame_size(limits.max_frame_bytes)
        .max_message_size(limits.max_frame_bytes)
        .read_buffer_size(limits.read_buffer_bytes)
        .write_buffer_size(limits.write_buffer_bytes)
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
