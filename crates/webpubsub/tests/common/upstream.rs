//! An application server for upstream tests: an axum server on port 0 that records
//! every request and answers with a test-chosen function. Abuse-protection `OPTIONS`
//! requests are answered `WebHook-Allowed-Origin: *` unless the function says otherwise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use statehub_webpubsub::{router, Config, WebPubSub};
use statehub_webpubsub::{EventHandler, HubSettings, SystemEvent};
use tokio::sync::mpsc;

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

pub type Answer = Arc<dyn Fn(&Recorded) -> Response + Send + Sync>;

pub struct Upstream {
    pub addr: SocketAddr,
    rx: mpsc::UnboundedReceiver<Recorded>,
}

impl Upstream {
    /// The next request (skipping none), or panics after 5 s.
    pub async fn next(&mut self) -> Recorded {
        tokio::time::timeout(Duration::from_secs(5), self.rx.recv())
            .await
            .expect("timed out waiting for an upstream request")
            .expect("upstream gone")
    }

    /// The next POST (abuse-protection OPTIONS skipped).
    pub async fn next_post(&mut self) -> Recorded {
        loop {
            let r = self.next().await;
            if r.method == Method::POST {
                return r;
            }
        }
    }

    /// Nothing arrives within `wait`.
    pub async fn nothing_for(&mut self, wait: Duration) {
        if let Ok(Some(r)) = tokio::time::timeout(wait, self.rx.recv()).await {
            panic!("unexpected upstream request {r:?}");
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/upstream/{{hub}}/{{event}}", self.addr)
    }
}

pub fn allow_all() -> Response {
    (StatusCode::OK, [("WebHook-Allowed-Origin", "*")]).into_response()
}

pub async fn fake_upstream(answer: Answer) -> Upstream {
    let (tx, rx) = mpsc::unbounded_channel();
    let app = axum::Router::new().fallback(move |req: Request| {
        let tx = tx.clone();
        let answer = answer.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = to_bytes(body, 1 << 20).await.unwrap_or_default().to_vec();
            let rec = Recorded {
                method: parts.method,
                path: parts.uri.path().to_owned(),
                headers: parts.headers,
                body,
            };
            let resp = answer(&rec);
            let _ = tx.send(rec);
            resp
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Upstream { addr, rx }
}

/// Answers OPTIONS with `*` and every POST with `post`.
pub fn posts(post: impl Fn(&Recorded) -> Response + Send + Sync + 'static) -> Answer {
    Arc::new(move |r: &Recorded| {
        if r.method == Method::OPTIONS {
            allow_all()
        } else {
            post(r)
        }
    })
}

pub fn handler(url: String, user: &str, system: &[SystemEvent]) -> EventHandler {
    EventHandler {
        url_template: url,
        user_event_pattern: user.into(),
        system_events: system.to_vec(),
    }
}

/// A service whose hub `chat` has these handlers; returns its address and the service.
pub async fn start_hub(settings: HubSettings) -> (SocketAddr, WebPubSub) {
    let mut config = Config::new(["secondary-key", super::KEY]);
    config.webhook_origin = Some("statehub.test".into());
    config.hubs.insert("chat".into(), settings);
    let wps = WebPubSub::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router(wps.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, wps)
}

pub fn empty() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

pub fn body_of(status: u16, content_type: &str, body: &'static [u8]) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap()
}
