//! The HTTP listener. Today it serves `GET /healthz`; the WebSocket, REST and
//! metrics endpoints of later layers are merged into this router.

use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The router for the HTTP listener.
pub fn router() -> Router {
    Router::new().route("/healthz", get(|| async { "ok\n" }))
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(listener: TcpListener, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router()).with_graceful_shutdown(async move { shutdown.cancelled().await }).await
}
