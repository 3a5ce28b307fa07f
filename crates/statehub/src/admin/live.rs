//! Live streams as Server-Sent Events: a topic tail (a broker tap on a filter) here,
//! and a watched key (`watch.rs`).
//!
//! Each stream holds one of `max_streams` places, sends a comment every 15 s so the
//! HTTP idle timeout leaves it open, and ends at shutdown. A tail viewer that falls
//! `tail_buffer_messages` behind gets an `overflow` event and its stream ends: the
//! broker never waits for a browser.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use axum::Router;
use futures_util::stream::{self, Stream};
use futures_util::StreamExt as _;
use serde::Deserialize;
use serde_json::json;
use statehub_broker::{Tap, Tapped};
use tokio_util::sync::CancellationToken;

use super::store;
use super::{Admin, ApiError, StreamSlot};

const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub(super) fn routes() -> Router<Admin> {
    Router::new().route("/admin/api/tail", get(tail))
}

pub(super) type Events = Response;

pub(super) fn sse(s: impl Stream<Item = Result<Event, Infallible>> + Send + 'static) -> Events {
    Sse::new(s)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

pub(super) fn event(kind: &str, data: serde_json::Value) -> Result<Event, Infallible> {
    Ok(Event::default().event(kind).data(data.to_string()))
}

#[derive(Debug, Deserialize)]
struct TailQuery {
    filter: String,
}

/// A tail's state between events.
struct Tail {
    tap: Tap,
    shutdown: CancellationToken,
    payload_bytes: usize,
    _slot: StreamSlot,
    ended: bool,
}

/// `GET /admin/api/tail?filter=`: every message routed on `filter` from now on, as
/// `message` events (`topic`, `qos`, `retain`, `payload` cut at
/// `tail_payload_bytes`); `overflow` once if the viewer falls behind.
async fn tail(State(admin): State<Admin>, Query(q): Query<TailQuery>) -> Result<Events, ApiError> {
    let slot = admin.open_stream()?;
    let capacity = admin.config().tail_buffer_messages;
    let tap = admin
        .broker()
        .tap(&q.filter, capacity)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{e}: {}", q.filter)))?;
    let state = Tail {
        tap,
        shutdown: admin.broker().shutdown_token(),
        payload_bytes: admin.config().tail_payload_bytes,
        _slot: slot,
        ended: false,
    };
    let ready = stream::iter([event("ready", json!({ "filter": q.filter }))]);
    let messages = stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let next = tokio::select! {
            () = st.shutdown.cancelled() => None,
            next = st.tap.recv() => next,
        };
        let item = match next? {
            Tapped::Message(m) => event(
                "message",
                json!({
                    "topic": &*m.topic,
                    "qos": m.qos as u8,
                    "retain": m.retain,
                    "payload": store::show(&m.payload, st.payload_bytes),
                }),
            ),
            Tapped::Overflowed => {
                // The broker counted and logged the drop when it happened.
                st.ended = true;
                event(
                    "overflow",
                    json!({"error": "this viewer fell behind and was dropped; reopen the tail"}),
                )
            }
        };
        Some((item, st))
    });
    Ok(sse(ready.chain(messages)))
}
