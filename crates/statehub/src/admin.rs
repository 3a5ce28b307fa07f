//! The web dashboard at `/` and the admin JSON API under `/admin/api/` it calls.
//!
//! Both are off unless an admin key is configured (`[admin] key`, `--admin-key`,
//! `STATEHUB_ADMIN_KEY`): then every route answers 404 with a JSON body saying how to
//! turn them on. With a key, the static pages are served to anyone (they hold no
//! data) and every API call must carry `Authorization: Bearer <key>`, compared in
//! constant time; the browser keeps the key in `sessionStorage`.
//!
//! - `api`: overview, MQTT clients (and an administrative disconnect), Web PubSub;
//! - `store`: the state store browser, which runs requests through the state store
//!   service in-process, its answers read back from a broker tap;
//! - `live`: Server-Sent Events streams (a topic tail, a watched key), each bounded
//!   and counted against `max_streams`.
//!
//! Every list is a page of at most `page_limit` items.

mod api;
mod live;
mod store;
mod watch;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use statehub_broker::{Broker, LogLimit};
use statehub_webpubsub::WebPubSub;
use subtle::ConstantTimeEq as _;

/// Shortest admin key accepted, as for Web PubSub access keys.
pub const MIN_ADMIN_KEY_BYTES: usize = 16;
/// Largest request body the admin API reads (a value to set, a message to send).
const MAX_BODY_BYTES: usize = 1 << 20;

/// The `[admin]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// The key the dashboard and the admin API ask for. None: both are off.
    pub key: Option<String>,
    /// Live streams (topic tails and watched keys) open at once, all viewers
    /// together; past it a new one is answered 429.
    pub max_streams: usize,
    /// Messages a topic tail holds for a viewer that has not read them; past it the
    /// viewer is told and its stream ends.
    pub tail_buffer_messages: usize,
    /// Bytes of each message's payload a topic tail shows (the rest is cut, and said
    /// so).
    pub tail_payload_bytes: usize,
    /// Largest page of any list (clients, hubs, groups, connections); a request for
    /// more gets this many.
    pub page_limit: usize,
    /// Bytes of a state store value shown (the rest is cut, and said so).
    pub value_bytes: usize,
    /// Watched keys open at once, all viewers together (each also takes one of
    /// `max_streams`); past it a new one is answered 429.
    pub max_watches: usize,
    /// Changes a watch holds for a viewer that has not read them; past it the viewer
    /// is told and its stream ends.
    pub watch_buffer_events: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            key: None,
            max_streams: 16,
            tail_buffer_messages: 256,
            tail_payload_bytes: 4096,
            page_limit: 200,
            value_bytes: 64 * 1024,
            max_watches: 8,
            watch_buffer_events: 256,
        }
    }
}

/// The `[admin]` table cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AdminConfigError {
    #[error(
        "the admin key from {origin} is {len} bytes; at least {MIN_ADMIN_KEY_BYTES} are required"
    )]
    ShortKey { origin: &'static str, len: usize },
    #[error("[admin] {0} must be at least 1")]
    Zero(&'static str),
}

impl AdminConfig {
    /// The table with the key from the flag or environment (which wins), checked.
    pub fn resolve(mut self, flag: Option<String>) -> Result<AdminConfig, AdminConfigError> {
        let origin = if flag.is_some() {
            self.key = flag;
            "--admin-key or STATEHUB_ADMIN_KEY"
        } else {
            "[admin] key"
        };
        if let Some(key) = &self.key {
            if key.len() < MIN_ADMIN_KEY_BYTES {
                let len = key.len();
                return Err(AdminConfigError::ShortKey { origin, len });
            }
        }
        for (name, value) in [
            ("max_streams", self.max_streams),
            ("tail_buffer_messages", self.tail_buffer_messages),
            ("page_limit", self.page_limit),
            ("max_watches", self.max_watches),
            ("watch_buffer_events", self.watch_buffer_events),
        ] {
            if value == 0 {
                return Err(AdminConfigError::Zero(name));
            }
        }
        Ok(self)
    }
}

/// What the admin routes share.
#[derive(Debug, Clone)]
pub struct Admin {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// SHA-256 of the key: compared in constant time whatever the lengths.
    key_digest: [u8; 32],
    config: AdminConfig,
    broker: Broker,
    wps: Option<WebPubSub>,
    started: Instant,
    streams: AtomicUsize,
    watches: AtomicUsize,
}

/// An admin API error: a status and a JSON `{"error": ...}` body.
#[derive(Debug)]
pub(crate) struct ApiError(StatusCode, String);

impl ApiError {
    pub(crate) fn new(status: StatusCode, text: impl Into<String>) -> ApiError {
        ApiError(status, text.into())
    }

    pub(crate) fn message(&self) -> &str {
        &self.1
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_error(self.0, &self.1)
    }
}

fn json_error(status: StatusCode, text: &str) -> Response {
    (status, Json(serde_json::json!({ "error": text }))).into_response()
}

/// The dashboard's and admin API's routes: off (404 JSON on each) without a key.
pub fn router(config: &AdminConfig, broker: Broker, wps: Option<WebPubSub>) -> Router {
    let Some(key) = &config.key else {
        let off = || async {
            json_error(
                StatusCode::NOT_FOUND,
                "the dashboard and admin API are off: no admin key is configured; set \
                 [admin] key in the config file, --admin-key or STATEHUB_ADMIN_KEY \
                 (at least 16 bytes)",
            )
        };
        return Router::new()
            .route("/", get(off))
            .route("/dashboard/{*path}", get(off))
            .route("/admin/{*path}", get(off).post(off).put(off).delete(off));
    };
    let admin = Admin::new(config, key, broker, wps);
    let api = Router::new()
        .route("/admin/api/overview", get(api::overview))
        .route("/admin/api/clients", get(api::clients))
        .route("/admin/api/clients/disconnect", post(api::disconnect))
        .route("/admin/api/wps/hubs", get(api::hubs))
        .route("/admin/api/wps/hub", get(api::hub))
        .route("/admin/api/wps/send", post(api::send))
        .merge(store::routes())
        .merge(live::routes())
        .merge(watch::routes())
        .route(
            "/admin/api/{*rest}",
            get(no_route).post(no_route).put(no_route).delete(no_route),
        )
        .layer(middleware::from_fn_with_state(admin.clone(), authorize))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(admin);
    Router::new()
        .route("/", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/dashboard/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route(
            "/dashboard/app.css",
            get(|| asset("text/css; charset=utf-8", APP_CSS)),
        )
        .merge(api)
}

async fn no_route() -> Response {
    json_error(StatusCode::NOT_FOUND, "no such admin API route")
}

const INDEX_HTML: &str = include_str!("admin/assets/index.html");
const APP_JS: &str = include_str!("admin/assets/app.js");
const APP_CSS: &str = include_str!("admin/assets/app.css");

/// A static file, with headers that keep it to itself: no framing, no other origin's
/// scripts.
async fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Lets a request through only with `Authorization: Bearer <the admin key>`.
async fn authorize(State(admin): State<Admin>, request: Request, next: Next) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let ok = presented.is_some_and(|key| {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        bool::from(digest.ct_eq(&admin.inner.key_digest))
    });
    if !ok {
        // Anyone can send these as often as they like: one line per 10 s at most.
        static LOG: LogLimit = LogLimit::per_secs(10);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                path = %request.uri().path(),
                left_out,
                "admin API request refused with 401: missing or wrong admin key"
            );
        }
        let mut response = json_error(
            StatusCode::UNAUTHORIZED,
            "a valid admin key is required: Authorization: Bearer <key>",
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    let mut response = next.run(request).await;
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

impl Admin {
    fn new(config: &AdminConfig, key: &str, broker: Broker, wps: Option<WebPubSub>) -> Admin {
        Admin {
            inner: Arc::new(Inner {
                key_digest: Sha256::digest(key.as_bytes()).into(),
                config: config.clone(),
                broker,
                wps,
                started: Instant::now(),
                streams: AtomicUsize::new(0),
                watches: AtomicUsize::new(0),
            }),
        }
    }

    #[cfg(test)]
    fn for_test(config: AdminConfig, broker: Broker) -> Admin {
        Admin::new(&config, "test-key-0123456789", broker, None)
    }

    pub(crate) fn broker(&self) -> &Broker {
        &self.inner.broker
    }

    pub(crate) fn wps(&self) -> Option<&WebPubSub> {
        self.inner.wps.as_ref()
    }

    pub(crate) fn config(&self) -> &AdminConfig {
        &self.inner.config
    }

    pub(crate) fn uptime_secs(&self) -> u64 {
        self.inner.started.elapsed().as_secs()
    }

    /// A page size: what was asked for, 1 to `page_limit` (50 if nothing was).
    pub(crate) fn page(&self, asked: Option<usize>) -> usize {
        asked.unwrap_or(50).clamp(1, self.inner.config.page_limit)
    }

    /// A place among the live streams, held until the guard drops; 429 past
    /// `max_streams`.
    pub(crate) fn open_stream(&self) -> Result<StreamSlot, ApiError> {
        let streams = &self.inner.streams;
        let max = self.inner.config.max_streams;
        streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| {
                tracing::info!(
                    "admin live stream refused with 429: {max} open ([admin] max_streams)"
                );
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("{max} live streams are open already ([admin] max_streams)"),
                )
            })?;
        Ok(StreamSlot(self.clone()))
    }

    /// A place among the watched keys (and the live streams), held until the guard
    /// drops; 429 past `max_watches`.
    pub(crate) fn open_watch(&self) -> Result<WatchSlot, ApiError> {
        let stream = self.open_stream()?;
        let max = self.inner.config.max_watches;
        self.inner
            .watches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| {
                tracing::info!("admin watch refused with 429: {max} open ([admin] max_watches)");
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("{max} keys are watched already ([admin] max_watches)"),
                )
            })?;
        Ok(WatchSlot(stream))
    }

    pub(crate) fn open_streams(&self) -> usize {
        self.inner.streams.load(Ordering::Acquire)
    }
}

/// A live stream's place (see [`Admin::open_stream`]).
#[derive(Debug)]
pub(crate) struct StreamSlot(Admin);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.inner.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A watched key's place (see [`Admin::open_watch`]), with its stream's.
#[derive(Debug)]
pub(crate) struct WatchSlot(StreamSlot);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0 .0.inner.watches.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::{Admin, AdminConfig, AdminConfigError};

    #[test]
    fn key_from_the_flag_wins_and_short_keys_and_zero_bounds_are_refused() {
        let file = AdminConfig {
            key: Some("file-key-0123456789".into()),
            ..AdminConfig::default()
        };
        let flag = Some("flag-key-0123456789".to_owned());
        let resolved = file.clone().resolve(flag).unwrap();
        assert_eq!(resolved.key.as_deref(), Some("flag-key-0123456789"));
        assert_eq!(
            file.clone().resolve(None).unwrap().key.as_deref(),
            Some("file-key-0123456789")
        );
        assert!(matches!(
            file.clone().resolve(Some("short".into())),
            Err(AdminConfigError::ShortKey { len: 5, .. })
        ));
        let zero = AdminConfig {
            max_streams: 0,
            ..AdminConfig::default()
        };
        assert!(matches!(
            zero.resolve(None),
            Err(AdminConfigError::Zero("max_streams"))
        ));
        assert!(AdminConfig::default().resolve(None).unwrap().key.is_none());
    }

    #[test]
    fn pages_are_bounded_by_page_limit() {
        let config = AdminConfig {
            key: Some("k".repeat(16)),
            page_limit: 10,
            ..AdminConfig::default()
        };
        let broker = statehub_broker::Broker::new(Default::default());
        // axum refuses conflicting routes when the router is built: build both kinds.
        drop(super::router(&config, broker.clone(), None));
        drop(super::router(&AdminConfig::default(), broker.clone(), None));
        let admin = Admin::for_test(config, broker);
        assert_eq!(admin.page(None), 10);
        assert_eq!(admin.page(Some(0)), 1);
        assert_eq!(admin.page(Some(5)), 5);
        assert_eq!(admin.page(Some(1_000_000)), 10);
    }
}
