//! The CloudEvents HTTP binding of upstream events, without I/O: the headers of a
//! request, and what the upstream's answers mean. Binary mode: attributes are `ce-*`
//! headers, the data is the body.
//!
//! What `@azure/web-pubsub-express` requires of a request (read from its dispatcher):
//! `ce-awpsversion` present, `WebHook-Request-Origin` present, `ce-type` one of the
//! `azure.webpubsub.*` types, `ce-hub` equal to its hub (case-insensitive), a JSON body
//! for system events (`{}` for `connected`), and `application/json`, `text/plain` or
//! `application/octet-stream` for user events.

use std::collections::BTreeMap;

use axum::http::{HeaderName, HeaderValue};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::config::hubs::{Event, SystemEvent};
use crate::hub::EventError;
use crate::protocol::Payload;

/// Who and what an event is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventContext<'a> {
    /// The hub.
    pub hub: &'a str,
    /// The connection id.
    pub connection_id: &'a str,
    /// The user id, if any.
    pub user_id: Option<&'a str>,
    /// The subprotocol the client was answered with, if any.
    pub subprotocol: Option<&'a str>,
    /// The upstream's opaque state, if it set one.
    pub connection_state: Option<&'a str>,
    /// The event.
    pub event: Event<'a>,
}

/// `sha256=<hex HMAC-SHA256(key, connectionId)>` for each key, comma-separated.
pub(crate) fn signature(keys: &[String], connection_id: &str) -> String {
    keys.iter()
        .map(|key| {
            // HMAC accepts keys of any length.
            let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes())
                .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
            mac.update(connection_id.as_bytes());
            let hex: String = mac
                .finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            format!("sha256={hex}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `ce-type` of an event.
pub(crate) fn event_type(event: &Event<'_>) -> String {
    match event {
        Event::System(s) => format!("azure.webpubsub.sys.{}", s.name()),
        Event::User(name) => format!("azure.webpubsub.user.{name}"),
    }
}

/// The headers of an event request (the caller adds `Content-Type`). Values that cannot
/// travel in a header (control characters in a user id) are left out.
pub(crate) fn headers(
    ctx: &EventContext<'_>,
    origin: &str,
    keys: &[String],
    id: &str,
    time: &str,
) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::with_capacity(14);
    let mut add = |name: &'static str, value: &str| {
        if let Ok(v) = HeaderValue::from_bytes(value.as_bytes()) {
            out.push((HeaderName::from_static(name), v));
        }
    };
    add("webhook-request-origin", origin);
    add("ce-specversion", "1.0");
    add("ce-type", &event_type(&ctx.event));
    add(
        "ce-source",
        &format!("/hubs/{}/client/{}", ctx.hub, ctx.connection_id),
    );
    add("ce-id", id);
    add("ce-time", time);
    add("ce-awpsversion", "1.0");
    add("ce-hub", ctx.hub);
    add("ce-connectionid", ctx.connection_id);
    add("ce-eventname", ctx.event.name());
    add("ce-signature", &signature(keys, ctx.connection_id));
    if let Some(u) = ctx.user_id {
        add("ce-userid", u);
    }
    if let Some(p) = ctx.subprotocol {
        add("ce-subprotocol", p);
    }
    if let Some(s) = ctx.connection_state {
        add("ce-connectionstate", s);
    }
    out
}

/// The `Content-Type` and body a user event's data travels as.
pub(crate) fn user_event_body(payload: &Payload) -> (&'static str, Vec<u8>) {
    match payload {
        Payload::Text(s) => ("text/plain; charset=utf-8", s.as_bytes().to_vec()),
        Payload::Json(v) => ("application/json", v.to_string().into_bytes()),
        Payload::Binary(b) => ("application/octet-stream", b.clone()),
        Payload::Protobuf(b) => ("application/x-protobuf", b.clone()),
    }
}

/// The body of a `connect` event: what the client presented.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConnectRequest {
    /// The access token's claims, each as a list of strings.
    pub claims: BTreeMap<String, Vec<String>>,
    /// The handshake's query parameters (the access token left out).
    pub query: BTreeMap<String, Vec<String>>,
    /// The handshake's headers (`Authorization` left out).
    pub headers: BTreeMap<String, Vec<String>>,
    /// The subprotocols the client offered.
    pub subprotocols: Vec<String>,
    /// Client certificates (none: statehub does not terminate mutual TLS).
    pub client_certificates: Vec<ClientCertificate>,
}

/// A client certificate of the `connect` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ClientCertificate {
    /// SHA-1 thumbprint.
    pub thumbprint: String,
    /// PEM.
    pub content: String,
}

/// What a `connect` handler's success may change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ConnectResponse {
    /// Replaces the token's user id.
    #[serde(default)]
    pub user_id: Option<String>,
    /// Joined besides the token's groups.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Granted besides the token's roles.
    #[serde(default)]
    pub roles: Vec<String>,
    /// The subprotocol to answer the client with (one it offered).
    #[serde(default)]
    pub subprotocol: Option<String>,
}

/// The upstream refused or failed an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// It answered a non-2xx status; the body is its detail.
    #[error("the upstream answered {status}: {detail}")]
    Status { status: u16, detail: String },
    /// No valid answer: transport error, timeout, bad body, failed abuse protection.
    #[error("the upstream failed: {0}")]
    Failed(String),
}

impl UpstreamError {
    /// The HTTP status to refuse a client handshake with.
    pub(crate) fn handshake_status(&self) -> u16 {
        match self {
            Self::Status { status, .. } if (400..600).contains(status) => *status,
            _ => 500,
        }
    }
}

/// A failed user event as the hub tells the client: the handler's 400 is `BadRequest`,
/// 401 and 403 `Forbidden`, anything else `InternalServerError`.
impl From<UpstreamError> for EventError {
    fn from(e: UpstreamError) -> Self {
        let message = e.to_string();
        match e {
            UpstreamError::Status { status: 400, .. } => Self::BadRequest(message),
            UpstreamError::Status {
                status: 401 | 403, ..
            } => Self::Forbidden(message),
            _ => Self::Failed(message),
        }
    }
}

fn detail(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.chars().take(512).collect()
}

fn mime(content_type: Option<&str>) -> String {
    content_type
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Reads a `connect` answer: 2xx with an empty body or 204 changes nothing, 200 with a
/// JSON object may set user, groups, roles and subprotocol; anything else refuses.
pub(crate) fn connect_response(status: u16, body: &[u8]) -> Result<ConnectResponse, UpstreamError> {
    if !(200..300).contains(&status) {
        return Err(UpstreamError::Status {
            status,
            detail: detail(body),
        });
    }
    if status == 204 || body.iter().all(u8::is_ascii_whitespace) {
        return Ok(ConnectResponse::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| UpstreamError::Failed(format!("invalid connect response: {e}")))
}

/// Reads a user event's answer: the data to send back to the client, if any, typed by
/// the response's `Content-Type` (JSON, text, protobuf `Any`, else binary).
pub(crate) fn user_event_response(
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Option<Payload>, UpstreamError> {
    if !(200..300).contains(&status) {
        return Err(UpstreamError::Status {
            status,
            detail: detail(body),
        });
    }
    if status == 204 || body.is_empty() {
        return Ok(None);
    }
    let payload = match mime(content_type).as_str() {
        "application/json" | "text/json" => serde_json::from_slice(body)
            .map(Payload::Json)
            .map_err(|e| UpstreamError::Failed(format!("invalid JSON response: {e}")))?,
        "text/plain" => String::from_utf8(body.to_vec())
            .map(Payload::Text)
            .map_err(|_| UpstreamError::Failed("text/plain response is not UTF-8".into()))?,
        "application/x-protobuf" => Payload::Protobuf(body.to_vec()),
        _ => Payload::Binary(body.to_vec()),
    };
    Ok(Some(payload))
}

/// Does an abuse-protection answer allow `origin`? `WebHook-Allowed-Origin` values
/// (repeated or comma-separated) must hold `*` or the origin.
pub(crate) fn origin_allowed<'a>(values: impl IntoIterator<Item = &'a str>, origin: &str) -> bool {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .any(|v| v == "*" || v.eq_ignore_ascii_case(origin))
}

/// The JSON body of a system event.
pub(crate) fn system_body(event: SystemEvent, reason: Option<&str>) -> serde_json::Value {
    match event {
        SystemEvent::Disconnected => serde_json::json!({ "reason": reason.unwrap_or_default() }),
        _ => serde_json::json!({}),
    }
}

#[cfg(test)]
#[path = "cloudevents_test.rs"]
mod tests;
