//! The HTTP listener: MQTT over WebSocket on `/mqtt` ([`mqtt_ws`]), the Web PubSub
//! client endpoint and REST API when access keys are configured (and, merged in by
//! `main`, the metrics, health and dashboard routes).
//!
//! Served by hyper's HTTP/1 connection with our own accept loop rather than
//! `axum::serve`, which has no timeouts nor connection cap: a client that opens
//! connections and sends nothing, or one byte at a time, would hold a descriptor each
//! until the process can accept nothing, MQTT included. Here:
//! - at most `max_connections` at once (WebSockets included, until they close); past it
//!   a connection is answered 503 and closed, counted and logged (rate-limited);
//! - a request's head must arrive within `header_timeout` (from the connection opening
//!   or the previous response: idle keep-alive connections are closed the same way);
//! - its body and response within `request_timeout` (else 408);
//! - a connection that moves no byte for `idle_timeout` before any upgrade is closed;
//! - request heads are bounded by [`MAX_HEAD_BYTES`] (hyper answers 431 past it).
//!
//! Every connection ends with a lingering close (see [`conn`]). With TLS (HTTPS and
//! WSS), the handshake must finish within the header timeout, and uses the
//! certificate in force when it starts (a reload affects new connections only).

mod conn;
pub mod mqtt_ws;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use statehub_broker::TlsSource;
use statehub_webpubsub::{Config, WebPubSub};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use crate::config::HttpConfig;
use conn::Conn;

/// Largest request head (request line and headers) read; the access token rides in
/// the query, so this leaves room for long ones.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Connections past the cap being answered 503 at once; past it they are closed
/// without an answer.
const MAX_REFUSING: usize = 64;
/// At most one log line per this interval for refused connections and accept errors.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The HTTP listener's limits, resolved.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// From the `[http]` table; an unset connection cap is `default_max_connections`.
    pub fn new(http: &HttpConfig, default_max_connections: usize) -> Limits {
        Limits {
            max_connections: http.max_connections.unwrap_or(default_max_connections),
            header_timeout: Duration::from_secs(http.header_timeout_secs),
            request_timeout: Duration::from_secs(http.request_timeout_secs),
            idle_timeout: Duration::from_secs(http.idle_timeout_secs),
        }
    }
}

/// The router for the HTTP listener and the Web PubSub service behind it, if any: it
/// is mounted when access keys are configured (without keys no token can be valid).
/// Upstream requests name us `localhost:<port>` unless `webhook_origin` is set.
pub fn router(mut config: Config, local: SocketAddr) -> (Router, Option<WebPubSub>) {
    let health = Router::new();
    if config.access_keys.is_empty() {
        return (health.merge(crate::first_use::webpubsub_off()), None);
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

/// Serves until `shutdown` is cancelled, then lets every connection finish its
/// request (idle ones close at once) and waits for them. Upgraded WebSockets are not
/// waited for: the Web PubSub service closes them.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    tls: Option<Arc<dyn TlsSource>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let connections = TaskTracker::new();
    let closes = Arc::new(Closes::default());
    let refusals = RateLimitedLog::default();
    let accept_errors = RateLimitedLog::default();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors (EMFILE) or a connection reset before it was
                    // accepted: pause so a persistent error does not spin the loop.
                    accept_errors.note(|n| tracing::warn!("http accept failed {n} times: {e}"));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            refusals.note(|n| {
                tracing::warn!(
                    "{n} http connections refused with 503: {} open, the [http] \
                     max_connections cap",
                    limits.max_connections
                )
            });
            if let Ok(slot) = Arc::clone(&refusing).try_acquire_owned() {
                tokio::spawn(conn::refuse(stream, slot));
            }
            continue;
        };
        let conn = Conn::new(stream, slot);
        let activity = conn.activity();
        let router = router.clone().layer(axum::Extension(ConnectInfo(peer)));
        let (closes, shutdown) = (Arc::clone(&closes), shutdown.clone());
        let Some(tls) = &tls else {
            connections.spawn(serve_connection(
                conn, activity, router, limits, closes, shutdown,
            ));
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
        connections.spawn(async move {
            // The handshake is part of the request head's time.
            match tokio::time::timeout(limits.header_timeout, acceptor.accept(conn)).await {
                Ok(Ok(stream)) => {
                    serve_connection(stream, activity, router, limits, closes, shutdown).await
                }
                Ok(Err(e)) => tracing::debug!("https handshake failed: {e}"),
                Err(_) => closes
                    .header
                    .note(|n| tracing::info!("{n} http connections closed by the header timeout")),
            }
        });
    }
    connections.close();
    connections.wait().await;
    Ok(())
}

/// Connections closed by a limit, each counted and logged (rate-limited).
#[derive(Debug, Default)]
struct Closes {
    header: RateLimitedLog,
    request: RateLimitedLog,
    idle: RateLimitedLog,
}

async fn serve_connection<I>(
    io: I,
    activity: Arc<AtomicU64>,
    router: Router,
    limits: Limits,
    closes: Arc<Closes>,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let timeouts = Arc::clone(&closes);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        let timeouts = Arc::clone(&timeouts);
        async move {
            let response = router.oneshot(req.map(Body::new));
            Ok::<_, Infallible>(
                match tokio::time::timeout(limits.request_timeout, response).await {
                    Ok(Ok(response)) => response,
                    Ok(Err(never)) => match never {},
                    Err(_) => {
                        timeouts.request.note(|n| {
                            tracing::info!("{n} http requests answered 408 (request timeout)")
                        });
                        request_timeout(limits.request_timeout)
                    }
                },
            )
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let mut connection = pin!(builder
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades());
    let mut watch = IdleWatch::new(activity, limits.idle_timeout);
    let mut draining = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                match result {
                    Err(e) if e.is_timeout() => closes.header.note(|n| {
                        tracing::info!("{n} http connections closed by the header timeout")
                    }),
                    Err(e) => tracing::debug!("http connection ended: {e}"),
                    Ok(()) => {}
                }
                return;
            }
            idle = watch.tick() => if idle {
                closes.idle.note(|n| {
                    tracing::info!("{n} http connections closed by the idle timeout")
                });
                return;
            },
            () = shutdown.cancelled(), if !draining => {
                draining = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

fn request_timeout(limit: Duration) -> Response<Body> {
    let mut response = (
        StatusCode::REQUEST_TIMEOUT,
        format!("the request took more than {} s\n", limit.as_secs()),
    )
        .into_response();
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    response
}

/// Tells when a connection has moved no byte for its idle timeout: samples the
/// connection's byte counter a few times per timeout.
struct IdleWatch {
    activity: Arc<AtomicU64>,
    seen: u64,
    since: tokio::time::Instant,
    idle: Duration,
    tick: tokio::time::Interval,
}

impl IdleWatch {
    fn new(activity: Arc<AtomicU64>, idle: Duration) -> IdleWatch {
        let mut tick = tokio::time::interval(idle / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        IdleWatch {
            seen: activity.load(Ordering::Relaxed),
            activity,
            since: tokio::time::Instant::now(),
            idle,
            tick,
        }
    }

    /// Waits for the next sample; true once the connection has been idle too long.
    async fn tick(&mut self) -> bool {
        self.tick.tick().await;
        let now = self.activity.load(Ordering::Relaxed);
        if now != self.seen {
            self.seen = now;
            self.since = tokio::time::Instant::now();
            return false;
        }
        self.since.elapsed() >= self.idle
    }
}

/// Counts occurrences and logs at most once per [`LOG_EVERY`], with the count since
/// the last line.
#[derive(Debug, Default)]
struct RateLimitedLog {
    count: AtomicU64,
    last: Mutex<Option<Instant>>,
}

impl RateLimitedLog {
    fn note(&self, log: impl FnOnce(u64)) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            log(self.count.swap(0, Ordering::Relaxed));
        }
    }
}

/// Logs where Web PubSub is served (or why it is off) and closes its sessions, within
/// `grace`, once `shutdown` is cancelled.
pub fn shut_down_with(
    wps: Option<WebPubSub>,
    shutdown: CancellationToken,
    grace: Duration,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(wps) = wps else {
        tracing::info!("web pubsub is off: no access key configured (--access-key, STATEHUB_ACCESS_KEYS or [webpubsub] access_keys); without a key no token can be valid");
        return None;
    };
    tracing::info!(
        "web pubsub client endpoint on /client/hubs/{{hub}}, REST API on /api/hubs/{{hub}}"
    );
    Some(tokio::spawn(async move {
        shutdown.cancelled().await;
        wps.shutdown(grace).await;
    }))
}
