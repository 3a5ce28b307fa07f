//! The HTTP listener. Today it serves `GET /healthz`; the WebSocket, REST and
//! metrics endpoints of later layers are merged into this router.

use axum::routing::get;
use axum::Router;
use statehub_webpubsub::{Config, WebPubSub};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The router for the HTTP listener. The Web PubSub client endpoint and REST API
/// are mounted when access keys are configured (without keys no token can be valid).
pub fn router(access_keys: &[String]) -> Router {
    let health = Router::new().route("/healthz", get(|| async { "ok\n" }));
    if access_keys.is_empty() {
        return health;
    }
    let wps = WebPubSub::new(Config::new(access_keys.iter().cloned()));
    health.merge(statehub_webpubsub::router(wps))
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}
