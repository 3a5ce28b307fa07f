//! The HTTP listener: `GET /healthz`, and the Web PubSub client endpoint and REST API
//! when access keys are configured.

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use statehub_webpubsub::{Config, WebPubSub};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The router for the HTTP listener and the Web PubSub service behind it, if any: it
/// is mounted when access keys are configured (without keys no token can be valid).
/// Upstream requests name us `localhost:<port>` unless `webhook_origin` is set.
pub fn router(mut config: Config, local: SocketAddr) -> (Router, Option<WebPubSub>) {
    let health = Router::new().route("/healthz", get(|| async { "ok\n" }));
    if config.access_keys.is_empty() {
        return (health, None);
    }
    config
        .webhook_origin
        .get_or_insert_with(|| format!("localhost:{}", local.port()));
    let wps = WebPubSub::new(config);
    (
        health.merge(statehub_webpubsub::router(wps.clone())),
        Some(wps),
    )
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
