//! MQTT over WebSocket on the HTTP listener: `GET /mqtt` with subprotocol `mqtt`
//! (MQTT 5.0 and 3.1.1, section 6; `mqttv3.1`, which older clients offer, is
//! accepted too), as `ws://` or, on an HTTPS listener, `wss://`.
//!
//! The handshake is answered here; the upgraded socket (with its TLS session on an
//! HTTPS listener) is then taken back from hyper (with what the client sent after its
//! handshake) and handed, as the TCP listener does, to one of the MQTT worker
//! runtimes, where the broker serves it as an MQTT connection
//! (`statehub_broker::WebSocketEndpoint`): same sessions, takeover and limits as over
//! TCP. The socket keeps its slot under the HTTP connection cap until
//! it is closed (after its lingering close).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use rustls::ServerConnection;
use statehub_broker::{Authenticator, Broker, WebSocketEndpoint};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::server::TlsStream;

use super::conn::Conn;

/// Where MQTT over WebSocket is served.
pub const PATH: &str = "/mqtt";
/// The subprotocols accepted, in the client's order of preference.
const SUBPROTOCOLS: [&str; 2] = ["mqtt", "mqttv3.1"];

#[derive(Debug)]
struct Endpoint {
    broker: WebSocketEndpoint,
    workers: Vec<Handle>,
    next: AtomicUsize,
}

/// `router` with MQTT over WebSocket on [`PATH`], served on `workers` (the caller's
/// runtime if empty); clients authenticate with `auth` (the broker's authenticator if
/// `None`).
pub fn mount(
    router: Router,
    broker: &Broker,
    workers: Vec<Handle>,
    auth: Option<Arc<dyn Authenticator>>,
) -> Router {
    let mut ws = WebSocketEndpoint::new(broker.clone());
    if let Some(auth) = auth {
        ws = ws.with_authenticator(auth);
    }
    let endpoint = Arc::new(Endpoint {
        broker: ws,
        workers,
        next: AtomicUsize::new(0),
    });
    tracing::info!(
        "mqtt over websocket on {PATH} (subprotocol mqtt, messages up to {} bytes)",
        endpoint.broker.max_message_size()
    );
    router.merge(Router::new().route(PATH, get(upgrade).with_state(endpoint)))
}

async fn upgrade(State(endpoint): State<Arc<Endpoint>>, mut req: Request) -> Response<Body> {
    let headers = req.headers();
    if !has_token(headers, header::UPGRADE, "websocket")
        || !has_token(headers, header::CONNECTION, "upgrade")
    {
        return refuse(
            StatusCode::UPGRADE_REQUIRED,
            "MQTT over WebSocket: connect with a WebSocket client (subprotocol mqtt)\n",
        );
    }
    if headers.get(header::SEC_WEBSOCKET_VERSION) != Some(&HeaderValue::from_static("13")) {
        return refuse(
            StatusCode::UPGRADE_REQUIRED,
            "only WebSocket version 13 is supported\n",
        );
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return refuse(StatusCode::BAD_REQUEST, "Sec-WebSocket-Key is missing\n");
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let protocol = match subprotocol(headers) {
        Ok(protocol) => protocol,
        Err(()) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                "the WebSocket subprotocol must be mqtt (or mqttv3.1)\n",
            )
        }
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<OnUpgrade>() else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded\n",
        );
    };
    tokio::spawn(take_over(endpoint, on_upgrade));
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    if let Some(protocol) = protocol {
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(protocol),
        );
    }
    response
}

/// Waits for hyper to hand the socket over and starts the MQTT connection on a worker.
async fn take_over(endpoint: Arc<Endpoint>, on_upgrade: OnUpgrade) {
    let upgraded = match on_upgrade.await {
        Ok(upgraded) => upgraded,
        Err(e) => return tracing::debug!("mqtt websocket upgrade failed: {e}"),
    };
    let (conn, tls, read) = match upgraded.downcast::<TokioIo<Conn>>() {
        Ok(parts) => (parts.io.into_inner(), None, parts.read_buf),
        Err(upgraded) => match upgraded.downcast::<TokioIo<TlsStream<Conn>>>() {
            Ok(parts) => {
                let (conn, tls) = parts.io.into_inner().into_inner();
                (conn, Some(tls), parts.read_buf)
            }
            Err(_) => {
                return tracing::warn!("mqtt websocket: the upgraded connection is not a socket")
            }
        },
    };
    let Some((tcp, slot)) = conn.into_parts() else {
        return;
    };
    let workers = &endpoint.workers;
    if workers.is_empty() {
        return serve(endpoint.broker.clone(), tcp, tls, read, slot).await;
    }
    // A tokio stream belongs to the reactor it was accepted on; hand it over as a std
    // stream so the worker's own reactor drives it.
    let Ok(std_stream) = tcp.into_std() else {
        return;
    };
    let worker = &workers[endpoint.next.fetch_add(1, Ordering::Relaxed) % workers.len()];
    let broker = endpoint.broker.clone();
    worker.spawn(async move {
        match tokio::net::TcpStream::from_std(std_stream) {
            Ok(tcp) => serve(broker, tcp, tls, read, slot).await,
            Err(e) => tracing::warn!(error = %e, "cannot register connection"),
        }
    });
}

/// Serves the socket as `ws://`, or as `wss://` in the TLS session `tls`.
async fn serve(
    broker: WebSocketEndpoint,
    tcp: TcpStream,
    tls: Option<ServerConnection>,
    read: Bytes,
    slot: OwnedSemaphorePermit,
) {
    match tls {
        None => broker.serve(tcp, read, slot).await,
        Some(tls) => broker.serve_tls(tcp, tls, read, slot).await,
    }
}

/// Whether a comma-separated header holds `token` (case-insensitive).
fn has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// The subprotocol to answer: the client's first of [`SUBPROTOCOLS`]; `None` if it
/// offered none (accepted without one); `Err` if it offered only others.
fn subprotocol(headers: &HeaderMap) -> Result<Option<&'static str>, ()> {
    let mut offered = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .peekable();
    if offered.peek().is_none() {
        return Ok(None);
    }
    offered
        .find_map(|t| SUBPROTOCOLS.into_iter().find(|p| t.eq_ignore_ascii_case(p)))
        .map(Some)
        .ok_or(())
}

fn refuse(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = (status, text).into_response();
    if status == StatusCode::UPGRADE_REQUIRED {
        let h = response.headers_mut();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
    }
    response
}
