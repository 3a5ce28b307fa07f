//! What the REST API does to a target (all, a group, a user, a connection): send it a
//! message from the application server (`:send`), or close its connections
//! (`:closeConnections`).
//!
//! Sends: to all, to a group, to a user and to a connection. The body's `Content-Type` decides the `dataType` subscribers see:
//! `text/plain` is text (must be UTF-8), `application/json` is JSON (must parse),
//! `application/octet-stream` or none is binary; anything else is 415. All answer 202:
//! delivery is fire-and-forget, a missing target is not an error. `messageTtlSeconds`
//! (1–300; 0 is none) drops the message for connections that were not sent it in time.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};

use super::{ApiError, ApiResult, Params};
use crate::cluster::{Operation, SentSelection, To};
use crate::hub::admin::{Selection, Target};
use crate::hub::{Delivery, Hub};
use crate::mirror::Provenance;
use crate::protocol::Payload;
use crate::WebPubSub;

/// Reads a body of at most `limit` bytes (413 past it).
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> ApiResult<axum::body::Bytes> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::TooLarge(limit));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::TooLarge(limit))
}

/// The payload of a send, from its content type.
pub(super) fn payload(headers: &HeaderMap, body: axum::body::Bytes) -> ApiResult<Payload> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream");
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "text/plain" => String::from_utf8(body.to_vec())
            .map(Payload::Text)
            .map_err(|_| ApiError::BadRequest("A text/plain body must be UTF-8".into())),
        "application/json" | "text/json" => serde_json::from_slice(&body)
            .map(Payload::Json)
            .map_err(|e| ApiError::BadRequest(format!("The body is not valid JSON: {e}"))),
        "application/octet-stream" | "" => Ok(Payload::Binary(body.to_vec())),
        _ => Err(ApiError::UnsupportedMediaType(content_type.to_owned())),
    }
}

/// `:closeConnections` of a target: `excluded` ids are spared, `reason` goes to the
/// clients' `disconnected` message. 204; 503 when other nodes cannot be told.
pub(super) async fn close(
    state: &WebPubSub,
    hub: &str,
    target: Target<'_>,
    params: &Params,
) -> ApiResult {
    let excluded = params.all("excluded");
    let sel = Selection {
        excluded: &excluded,
        filter: None,
    };
    let reason = params.get("reason").unwrap_or_default();
    let hub = state.hub(hub);
    if !is_local(&hub, target) {
        hub.broadcast_written(&Operation::Close {
            hub: hub.name().to_owned(),
            to: To::from(target),
            excluded: excluded.clone(),
            reason: reason.to_owned(),
        })
        .await?;
    }
    hub.close_connections(target, &sel, reason);
    Ok(StatusCode::NO_CONTENT)
}

/// Whether the target is one connection of this node (no other node need hear of it).
pub(super) fn is_local(hub: &crate::hub::Hub, target: Target<'_>) -> bool {
    matches!(target, Target::Connection(id) if hub.has_connection(id))
}

/// One send: validates the parameters that target allows, then delivers.
pub(super) async fn send(
    state: &WebPubSub,
    hub: &str,
    target: Target<'_>,
    params: &Params,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult {
    let ttl = params
        .int("messageTtlSeconds", 0, 300)?
        .filter(|s| *s > 0)
        .map(|s| Duration::from_secs(s.unsigned_abs()));
    let filter = match target {
        Target::Connection(_) => None,
        _ => params.filter()?,
    };
    let excluded = match target {
        Target::All | Target::Group(_) => params.all("excluded"),
        Target::User(_) | Target::Connection(_) => Vec::new(),
    };
    let limit = state.config().limits.max_frame_bytes;
    let payload = payload(headers, read_body(headers, body, limit).await?)?;
    let sel = Selection {
        excluded: &excluded,
        filter: filter.as_ref(),
    };
    let hub = state.hub(hub);
    let seq = {
        let _order = hub.sending();
        let number = || {
            if is_local(&hub, target) {
                return Ok((0, Provenance::Unknown, None));
            }
            let sent = SentSelection {
                excluded: &excluded,
                filter: filter.is_some().then(|| params.get("filter")).flatten(),
            };
            let seq = hub.broadcast(&Operation::send(&hub, target, &sent, &payload, ttl, None))?;
            Ok((seq, Provenance::Own(seq), None))
        };
        let now = || {
            hub.send(target, &sel, &payload, ttl);
        };
        let later = || -> Delivery {
            let (to, excluded, filter) = (To::from(target), excluded.clone(), filter.clone());
            let payload = payload.clone();
            Box::new(move |hub: &Hub| {
                let sel = Selection {
                    excluded: &excluded,
                    filter: filter.as_ref(),
                };
                hub.send(to.target(), &sel, &payload, ttl);
            })
        };
        hub.send_own(number, now, later)?
    };
    // 202 promises the other nodes get it even if this node dies now.
    hub.written(seq).await?;
    Ok(StatusCode::ACCEPTED)
}
