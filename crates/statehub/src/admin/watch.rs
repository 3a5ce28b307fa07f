//! A watched key, live: `GET /admin/api/store/watch?key=` observes the key with a
//! KEYNOTIFY of its own and streams every change as a Server-Sent Event.
//!
//! Each watch is a state store client of its own (`$statehub-admin-watch-<random>`),
//! with no session: the state store sends its notifications to that client id, and
//! the broker shows them to the taps on their topic, where the watch reads them (a
//! bounded channel). So every change comes, with its version, however quickly they
//! follow one another, deletions (and expiries) included. A viewer that falls
//! `watch_buffer_events` behind is told (`overflow`) and its stream ends, as a topic
//! tail's does; the observation ends (KEYNOTIFY STOP) when the stream does. At most
//! `max_watches` watches are open at once (and they count among `max_streams`).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use futures_util::stream;
use futures_util::StreamExt as _;
use serde_json::{json, Value};
use statehub_broker::{Message, Tap, Tapped};
use statehub_state_store::notify_topic;
use tokio_util::sync::CancellationToken;

use super::live::{event, sse, Events};
use super::store::{self, Resp};
use super::{Admin, ApiError, WatchSlot};

pub(super) fn routes() -> Router<Admin> {
    Router::new().route("/admin/api/store/watch", get(watch))
}

/// The key's observation, ended (KEYNOTIFY STOP) when dropped.
struct Observer {
    admin: Admin,
    client_id: String,
    key: String,
}

impl Drop for Observer {
    fn drop(&mut self) {
        let (admin, client_id) = (self.admin.clone(), std::mem::take(&mut self.client_id));
        let key = std::mem::take(&mut self.key);
        // Outside a runtime (the process is exiting) the state store goes too.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let stop: [&[u8]; 3] = [b"KEYNOTIFY", key.as_bytes(), b"STOP"];
                if let Err(e) = store::call_as(&admin, &client_id, &stop).await {
                    tracing::debug!(key, "admin watch: KEYNOTIFY STOP failed: {}", e.message());
                }
            });
        }
    }
}

/// A watch's state between events.
struct Watch {
    tap: Tap,
    shutdown: CancellationToken,
    key: String,
    value_bytes: usize,
    /// The version last sent: a notification of the same version (the change the
    /// first GET already showed) is not sent again.
    last: Option<String>,
    ended: bool,
    _observer: Observer,
    _slot: WatchSlot,
}

/// `GET /admin/api/store/watch?key=`: the key's value now, then one `value` event per
/// change (`value` and `version`, or `deleted: true` and the deletion's `version`);
/// `overflow` once, and the end, if the viewer falls behind.
async fn watch(
    State(admin): State<Admin>,
    Query(q): Query<store::KeyQuery>,
) -> Result<Events, ApiError> {
    let slot = admin.open_watch()?;
    let client_id = format!("$statehub-admin-watch-{:016x}", rand::random::<u64>());
    let topic = notify_topic(client_id.as_bytes(), q.key.as_bytes());
    // Tapped before the observation starts: no change can fall in between.
    let tap = admin
        .broker()
        .tap(&topic, admin.config().watch_buffer_events)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{e}: {}", q.key)))?;
    let start: [&[u8]; 2] = [b"KEYNOTIFY", q.key.as_bytes()];
    let answer = store::call_as(&admin, &client_id, &start).await?;
    let observer = Observer {
        admin: admin.clone(),
        client_id,
        key: q.key.clone(),
    };
    match answer.reply {
        Resp::Simple(ok) if ok == "OK" => {}
        Resp::Error(text) => return Err(ApiError::new(StatusCode::BAD_REQUEST, text)),
        _ => return Err(ApiError::new(StatusCode::BAD_GATEWAY, "unexpected answer")),
    }
    let now = store::call(&admin, &[b"GET", q.key.as_bytes()]).await?;
    let value_bytes = admin.config().value_bytes;
    let (first, last) = match &now.reply {
        Resp::Bulk(v) => (
            json!({"key": q.key, "value": store::show(v, value_bytes), "version": now.version}),
            now.version.clone(),
        ),
        _ => (json!({"key": q.key, "deleted": true}), None),
    };
    let state = Watch {
        tap,
        shutdown: admin.broker().shutdown_token(),
        key: q.key,
        value_bytes,
        last,
        ended: false,
        _observer: observer,
        _slot: slot,
    };
    let first = stream::iter([event("value", first)]);
    Ok(sse(first.chain(stream::unfold(state, next_change))))
}

async fn next_change(
    mut st: Watch,
) -> Option<(
    Result<axum::response::sse::Event, std::convert::Infallible>,
    Watch,
)> {
    loop {
        if st.ended {
            return None;
        }
        let next = tokio::select! {
            () = st.shutdown.cancelled() => None,
            next = st.tap.recv() => next,
        };
        let msg = match next? {
            Tapped::Message(msg) => msg,
            Tapped::Overflowed => {
                st.ended = true;
                let error = "this viewer fell behind and was dropped; watch the key again";
                return Some((event("overflow", json!({"error": error})), st));
            }
        };
        let Some(data) = change(&st, &msg) else {
            continue;
        };
        st.last = data["version"].as_str().map(str::to_owned);
        return Some((event("value", data), st));
    }
}

/// A notification as the page shows it; `None` for one already shown or unreadable.
fn change(st: &Watch, msg: &Message) -> Option<Value> {
    let version = msg
        .properties
        .user_properties
        .iter()
        .find(|(k, _)| k == "__ts")
        .map(|(_, v)| v.to_string());
    if version.is_some() && version == st.last {
        return None;
    }
    let Some(Resp::Array(parts)) = store::parse(&msg.payload) else {
        return None;
    };
    match parts.as_slice() {
        [Resp::Bulk(_), Resp::Bulk(op), Resp::Bulk(_), Resp::Bulk(value)] if &op[..] == b"SET" => {
            Some(json!({
                "key": st.key,
                "value": store::show(value, st.value_bytes),
                "version": version,
            }))
        }
        [Resp::Bulk(_), Resp::Bulk(op)] if &op[..] == b"DELETE" => {
            Some(json!({"key": st.key, "deleted": true, "version": version}))
        }
        _ => None,
    }
}
