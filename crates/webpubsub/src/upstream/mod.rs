//! Upstream events: the service posts CloudEvents to the application's webhooks
//! ([`cloudevents`] has the wire format; the per-hub handlers are configured in
//! [`crate::config::hubs`]).
//!
//! - `connect` is blocking and runs before the WebSocket is accepted (`ws.rs`): its
//!   answer may set the user id, groups, roles and subprotocol, or refuse the handshake
//!   with its status.
//! - User events (`event` messages, raw clients' frames as `message`) are blocking for
//!   the connection that sent them: its reader waits for the answer, whose body goes
//!   back to the client as a message from the server.
//! - `connected` and `disconnected` are fire-and-forget: queued on one of a few bounded
//!   queues (chosen by connection id, so one connection's events stay in order), posted
//!   by worker tasks, failures logged. A full queue drops the event and logs it; a
//!   socket never waits for them.
//!
//! Before the first request to a URL the abuse-protection handshake runs: `OPTIONS`
//! with `WebHook-Request-Origin` (and `ce-awpsversion`, without which the Node handler
//! ignores it), whose answer must allow our origin in
//! `WebHook-Allowed-Origin`. The result is remembered per scheme and authority (a
//! success for the process's life, a failure for a few seconds), so event names chosen
//! by clients cannot make it grow. Every request has the configured timeout, and answers are read up
//! to the frame limit.

pub(crate) mod cloudevents;
pub(crate) mod events;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderName, HeaderValue};
use statehub_stats::Histogram;
use tokio::sync::{mpsc, Notify};

use crate::config::Config;
use cloudevents::{headers, EventContext, UpstreamError};

/// Fire-and-forget worker queues.
const WORKERS: usize = 4;
/// How long a failed abuse-protection check is remembered.
const FAILED_CHECK_TTL: Duration = Duration::from_secs(5);
/// Origins whose check is remembered; past it the memory starts over.
const MAX_CHECKED: usize = 1024;

/// The part of a URL the abuse-protection check is remembered for: scheme and
/// authority, so client-chosen event names in a path cannot grow the memory.
fn origin_of(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url, |end| &url[..after_scheme + end])
}

/// A posted event's answer.
#[derive(Debug)]
pub(crate) struct Answer {
    /// HTTP status.
    pub status: u16,
    /// `Content-Type`, if any.
    pub content_type: Option<String>,
    /// `ce-connectionState`, if the upstream set it.
    pub connection_state: Option<String>,
    /// The body (at most the frame limit).
    pub body: Vec<u8>,
}

#[derive(Debug)]
struct Job {
    url: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Vec<u8>,
}

/// The upstream poster shared by every hub; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Result<reqwest::Client, String>,
    keys: Vec<String>,
    origin: String,
    max_body: usize,
    queue_bound: usize,
    checked: Mutex<HashMap<String, (bool, Instant)>>,
    queues: OnceLock<Vec<mpsc::Sender<Job>>>,
    pending: AtomicUsize,
    idle: Notify,
    stats: UpstreamStats,
}

/// Upstream calls by result, and their latency.
#[derive(Debug, Default)]
struct UpstreamStats {
    ok: AtomicU64,
    rejected: AtomicU64,
    failed: AtomicU64,
    dropped: AtomicU64,
    latency: Histogram,
}

fn random_hex(bytes: usize) -> String {
    (0..bytes)
        .map(|_| format!("{:02x}", rand::random::<u8>()))
        .collect()
}

impl Upstream {
    /// A poster with the configuration's keys, origin, timeout and limits.
    pub(crate) fn new(config: &Config) -> Self {
        let timeout = config.limits.upstream_timeout;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("statehub/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                tracing::error!(
                    "upstream HTTP client unavailable, every upstream event will fail: {e}"
                );
                e.to_string()
            });
        Self {
            inner: Arc::new(Inner {
                client,
                keys: config.access_keys.clone(),
                origin: config
                    .webhook_origin
                    .clone()
                    .unwrap_or_else(|| "localhost".to_owned()),
                max_body: config.limits.max_frame_bytes,
                queue_bound: (config.limits.upstream_queue / WORKERS).max(1),
                checked: Mutex::new(HashMap::new()),
                queues: OnceLock::new(),
                pending: AtomicUsize::new(0),
                idle: Notify::new(),
                stats: UpstreamStats::default(),
            }),
        }
    }

    fn client(&self) -> Result<&reqwest::Client, UpstreamError> {
        self.inner
            .client
            .as_ref()
            .map_err(|e| UpstreamError::Failed(format!("no HTTP client: {e}")))
    }

    /// The headers of an event, with a fresh id and the current time.
    pub(crate) fn event_headers(&self, ctx: &EventContext<'_>) -> Vec<(HeaderName, HeaderValue)> {
        let time = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        headers(
            ctx,
            &self.inner.origin,
            &self.inner.keys,
            &random_hex(16),
            &time,
        )
    }

    /// Runs the abuse-protection handshake for `url` unless it already passed.
    async fn ensure_allowed(&self, url: &str) -> Result<(), UpstreamError> {
        let key = origin_of(url);
        let known = self
            .inner
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .copied();
        match known {
            Some((true, _)) => return Ok(()),
            Some((false, at)) if at.elapsed() < FAILED_CHECK_TTL => {
                return Err(UpstreamError::Failed(format!(
                    "{url} did not allow origin {} (abuse protection)",
                    self.inner.origin
                )))
            }
            _ => {}
        }
        let result = self
            .client()?
            .request(reqwest::Method::OPTIONS, url)
            .header("WebHook-Request-Origin", &self.inner.origin)
            // @azure/web-pubsub-express answers only requests that carry it.
            .header("ce-awpsversion", "1.0")
            .send()
            .await;
        let allowed = match &result {
            Ok(resp) => cloudevents::origin_allowed(
                resp.headers()
                    .get_all("webhook-allowed-origin")
                    .iter()
                    .filter_map(|v| v.to_str().ok()),
                &self.inner.origin,
            ),
            Err(_) => false,
        };
        {
            let mut checked = self
                .inner
                .checked
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if checked.len() >= MAX_CHECKED {
                checked.clear();
            }
            checked.insert(key.to_owned(), (allowed, Instant::now()));
        }
        match result {
            Ok(_) if allowed => Ok(()),
            Ok(resp) => Err(UpstreamError::Failed(format!(
                "{url} answered the abuse-protection request with {} and did not allow origin {}",
                resp.status().as_u16(),
                self.inner.origin
            ))),
            Err(e) => Err(UpstreamError::Failed(format!(
                "abuse-protection request to {url} failed: {e}"
            ))),
        }
    }

    /// Adds the upstream's counts to `c`.
    pub(crate) fn count_into(&self, c: &mut crate::Counters) {
        let s = &self.inner.stats;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        c.upstream_ok = load(&s.ok);
        c.upstream_rejected = load(&s.rejected);
        c.upstream_failed = load(&s.failed);
        c.upstream_dropped = load(&s.dropped);
        c.upstream_latency = s.latency.snapshot();
    }

    /// Posts one event and reads its answer; counted by result and timed.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: Vec<(HeaderName, HeaderValue)>,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Answer, UpstreamError> {
        let start = Instant::now();
        let answer = self.post_once(url, headers, content_type, body).await;
        let s = &self.inner.stats;
        s.latency.record(start.elapsed());
        let counter = match &answer {
            Ok(a) if (200..300).contains(&a.status) => &s.ok,
            Ok(_) => &s.rejected,
            Err(_) => &s.failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        answer
    }

    async fn post_once(
        &self,
        url: &str,
        headers: Vec<(HeaderName, HeaderValue)>,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Answer, UpstreamError> {
        self.ensure_allowed(url).await?;
        let mut req = self
            .client()?
            .post(url)
            .header(header::CONTENT_TYPE, content_type)
            .body(body);
        for (name, value) in headers {
            req = req.header(name, value);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| UpstreamError::Failed(format!("POST {url}: {e}")))?;
        let get = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = resp.status().as_u16();
        let content_type = get("content-type");
        let connection_state = get("ce-connectionstate");
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| UpstreamError::Failed(format!("reading the answer of {url}: {e}")))?
        {
            if body.len() + chunk.len() > self.inner.max_body {
                return Err(UpstreamError::Failed(format!(
                    "the answer of {url} is larger than {} bytes",
                    self.inner.max_body
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            content_type,
            connection_state,
            body,
        })
    }

    /// Queues a fire-and-forget event; never waits. Events of one connection are posted
    /// in the order queued.
    pub(crate) fn fire(
        &self,
        connection_id: &str,
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: Vec<u8>,
    ) {
        let Some(queues) = self.queues() else {
            tracing::warn!("upstream event to {url} dropped: no runtime to post it");
            return;
        };
        let mut hasher = DefaultHasher::new();
        connection_id.hash(&mut hasher);
        let queue = &queues[(hasher.finish() as usize) % queues.len()];
        self.inner.pending.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = queue.try_send(Job { url, headers, body }) {
            self.done();
            self.inner.stats.dropped.fetch_add(1, Ordering::Relaxed);
            let (job, why) = match e {
                mpsc::error::TrySendError::Full(j) => (j, "the queue is full"),
                mpsc::error::TrySendError::Closed(j) => (j, "its worker stopped"),
            };
            tracing::warn!(
                "upstream event to {} for connection {connection_id} dropped: {why} ({} events at most)",
                job.url,
                self.inner.queue_bound * WORKERS
            );
        }
    }

    fn done(&self) {
        if self.inner.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.inner.idle.notify_waiters();
        }
    }

    /// The worker queues, started on first use (they need a runtime).
    fn queues(&self) -> Option<&Vec<mpsc::Sender<Job>>> {
        if let Some(q) = self.inner.queues.get() {
            return Some(q);
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(self.inner.queues.get_or_init(|| {
            (0..WORKERS)
                .map(|_| {
                    let (tx, rx) = mpsc::channel(self.inner.queue_bound);
                    runtime.spawn(worker(Arc::downgrade(&self.inner), rx));
                    tx
                })
                .collect()
        }))
    }

    /// Waits until every queued event is posted, or `timeout`.
    pub(crate) async fn drain(&self, timeout: Duration) {
        let wait = async {
            loop {
                let idle = self.inner.idle.notified();
                if self.inner.pending.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        };
        if tokio::time::timeout(timeout, wait).await.is_err() {
            tracing::warn!(
                "{} upstream events not posted before shutdown",
                self.inner.pending.load(Ordering::SeqCst)
            );
        }
    }
}

async fn worker(inner: std::sync::Weak<Inner>, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let upstream = Upstream { inner };
        let url = job.url.clone();
        match upstream
            .post(
                &job.url,
                job.headers,
                "application/json; charset=utf-8",
                job.body,
            )
            .await
        {
            Ok(a) if (200..300).contains(&a.status) => {}
            Ok(a) => tracing::warn!(
                "upstream {url} answered {} to a fire-and-forget event",
                a.status
            ),
            Err(e) => tracing::warn!("upstream event not delivered: {e}"),
        }
        upstream.done();
    }
}

#[cfg(test)]
mod tests {
    use super::origin_of;

    #[test]
    fn checks_are_remembered_per_origin() {
        assert_eq!(origin_of("http://h:1/a/b?c"), "http://h:1");
        assert_eq!(origin_of("https://h"), "https://h");
        assert_eq!(origin_of("http://h?x"), "http://h");
    }
}
