//! `GET /metrics` (OpenMetrics text), `/healthz` and `/readyz` on the HTTP listener.
//!
//! Nothing here counts: each layer keeps its own counters (the broker's `Metrics` and
//! `Gauges`, the state store service's `Snapshot`, the storage's `StorageStats`, Web
//! PubSub's `Counters`) and this module reads them at scrape time, through one
//! `prometheus-client` collector, so a scrape costs the hot paths nothing. The names
//! and their meanings are in docs/metrics.md, which a test holds to the real output.
//!
//! Access: `/healthz` and `/readyz` are open (probes carry no credentials). `/metrics`
//! is open to loopback peers, like an MQTT listener without authentication (see
//! docs/security.md); from elsewhere it needs `Authorization: Bearer <[http]
//! metrics_token>`, and without a configured token it is refused (403).

mod cluster;
mod enc;
mod encode;

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::Router;
use prometheus_client::registry::Registry;
use statehub_broker::Broker;
use statehub_state_store_service::{Authorizer, Engine, Snapshot, StateStoreService};
use statehub_storage::Store;
use statehub_webpubsub::WebPubSub;
use subtle::ConstantTimeEq;

pub use cluster::ClusterSources;
use encode::Collect;

/// The state store service, whatever its engine: what the collector reads of it.
pub trait StateStoreSource: Debug + Send + Sync {
    fn snapshot(&self) -> Snapshot;
}

impl<E, A> StateStoreSource for StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    fn snapshot(&self) -> Snapshot {
        StateStoreService::snapshot(self)
    }
}

/// What the endpoints read: the layers' counters and whether the server is ready.
#[derive(Debug, Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    ready: AtomicBool,
    token: Option<String>,
}

impl Telemetry {
    /// Registers every layer's counters. `storage` is there with `--data-dir`, `wps`
    /// when Web PubSub is on, `cluster`'s layers with `--redis`; their metrics are
    /// absent otherwise.
    pub fn new(
        broker: Broker,
        state_store: Arc<dyn StateStoreSource>,
        storage: Option<Store>,
        wps: Option<WebPubSub>,
        token: Option<String>,
        cluster: ClusterSources,
    ) -> Telemetry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Collect {
            broker,
            state_store,
            storage,
            wps,
            cluster,
        }));
        Telemetry {
            inner: Arc::new(Inner {
                registry,
                ready: AtomicBool::new(false),
                token,
            }),
        }
    }

    /// `/readyz` answers 200 from now on (until [`Telemetry::set_ready`] `false`).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }

    /// The routes: `/metrics`, `/healthz`, `/readyz`.
    pub fn routes(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics))
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .with_state(self.clone())
    }
}

async fn readyz(State(t): State<Telemetry>) -> Response {
    match t.inner.ready.load(Ordering::Relaxed) {
        true => "ready\n".into_response(),
        false => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting or shutting down\n",
        )
            .into_response(),
    }
}

async fn metrics(
    State(t): State<Telemetry>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
) -> Response {
    let loopback = peer.is_some_and(|Extension(ConnectInfo(p))| p.ip().is_loopback());
    if !loopback {
        if let Err(refusal) = authorize(t.inner.token.as_deref(), &headers) {
            return refusal.into_response();
        }
    }
    // Reading some sources makes a blocking call (with `--redis`, the state store's size
    // is read from Redis): never on a runtime worker.
    let encoded = tokio::task::spawn_blocking(move || {
        let mut body = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut body, &t.inner.registry).map(|()| body)
    })
    .await;
    let encoded = match encoded {
        Ok(encoded) => encoded.map_err(|e| e.to_string()),
        Err(join) => Err(join.to_string()),
    };
    let body = match encoded {
        Ok(body) => body,
        Err(e) => {
            tracing::error!("encoding the metrics failed: {e}");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Why a non-loopback scrape is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No `metrics_token` is configured: loopback only.
    NoToken,
    /// The bearer token is missing or wrong.
    BadToken,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            Refusal::NoToken => (
                StatusCode::FORBIDDEN,
                "metrics are served to loopback clients only; set [http] metrics_token to allow bearer-token scrapes from elsewhere",
            ),
            Refusal::BadToken => (
                StatusCode::UNAUTHORIZED,
                "a valid Authorization: Bearer <metrics_token> header is required",
            ),
        };
        let body = format!("{{\"error\":\"{message}\"}}\n");
        (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

/// A non-loopback scrape: the bearer token, compared in constant time.
fn authorize(token: Option<&str>, headers: &HeaderMap) -> Result<(), Refusal> {
    let token = token.ok_or(Refusal::NoToken)?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
        _ => Err(Refusal::BadToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    async fn status(router: &Router, path: &str) -> StatusCode {
        use tower::ServiceExt as _;
        let req = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        router.clone().oneshot(req).await.unwrap().status()
    }

    #[tokio::test]
    async fn readyz_is_503_until_ready_and_again_once_unready() {
        let broker = Broker::new(statehub_broker::BrokerConfig::default());
        let settings = statehub_state_store_service::Settings::default();
        let service = StateStoreService::in_memory(&settings).unwrap();
        let t = Telemetry::new(
            broker,
            Arc::new(service),
            None,
            None,
            None,
            ClusterSources::default(),
        );
        let routes = t.routes();
        assert_eq!(
            status(&routes, "/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status(&routes, "/healthz").await, StatusCode::OK);
        t.set_ready(true);
        assert_eq!(status(&routes, "/readyz").await, StatusCode::OK);
        t.set_ready(false);
        assert_eq!(
            status(&routes, "/readyz").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        // No peer address known (not served from the listener): treated as remote.
        assert_eq!(status(&routes, "/metrics").await, StatusCode::FORBIDDEN);
    }

    #[test]
    fn a_remote_scrape_needs_the_configured_token() {
        let none = HeaderMap::new();
        assert_eq!(authorize(None, &bearer("Bearer t")), Err(Refusal::NoToken));
        assert_eq!(authorize(Some("secret"), &none), Err(Refusal::BadToken));
        assert_eq!(
            authorize(Some("secret"), &bearer("Bearer secreT")),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            authorize(Some("secret"), &bearer("Bearer secret2")),
            Err(Refusal::BadToken)
        );
        assert_eq!(
            authorize(Some("secret"), &bearer("Basic secret")),
            Err(Refusal::BadToken)
        );
        assert_eq!(authorize(Some("secret"), &bearer("Bearer secret")), Ok(()));
    }
}
