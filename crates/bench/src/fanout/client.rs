//! One WebSocket connection of the fan-out scenario, subscriber or publisher: the
//! handshake for either target and the two loops.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::wire::{self, Incoming, Target};
use crate::common::now_ns;
use crate::report::new_histogram;

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// State shared by every connection of a run.
#[derive(Debug, Default)]
pub struct Shared {
    /// Messages delivered to subscribers (all of them).
    pub delivered: AtomicU64,
    /// Record latencies (the measured window).
    pub measuring: AtomicBool,
    /// Subscribers and publisher stop reading.
    pub stop: AtomicBool,
}

/// What one subscriber saw.
#[derive(Debug)]
pub struct SubResult {
    pub received: u64,
    /// Messages whose publish number was not the previous one plus one.
    pub out_of_order: u64,
    pub latency: Histogram<u64>,
    pub error: Option<String>,
}

/// Connects and waits for the handshake to complete. `role` is `sub` or `pub`.
pub async fn connect(target: Target, url: &str, role: &str) -> Result<Ws, String> {
    let mut request = url
        .into_client_request()
        .map_err(|e| format!("bad url {url}: {e}"))?;
    if target == Target::Statehub {
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static(wire::WPS_SUBPROTOCOL),
        );
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| format!("connect {url}: {e}"))?;
    if target == Target::Socketio {
        ws.send(Message::text(format!(r#"40{{"role":"{role}"}}"#)))
            .await
            .map_err(|e| format!("socket.io connect: {e}"))?;
    }
    loop {
        let frame = ws
            .next()
            .await
            .ok_or("closed during the handshake")?
            .map_err(|e| format!("handshake: {e}"))?;
        let Message::Text(text) = frame else { continue };
        match wire::classify(target, &text) {
            Incoming::Connected => return Ok(ws),
            Incoming::Ping => ws
                .send(Message::text("3"))
                .await
                .map_err(|e| format!("pong: {e}"))?,
            _ => {}
        }
    }
}

/// Reads until told to stop; reliable subscribers acknowledge every `ack_every`.
pub async fn subscribe(
    target: Target,
    mut ws: Ws,
    shared: Arc<Shared>,
    ack_every: Duration,
) -> SubResult {
    let mut out = SubResult {
        received: 0,
        out_of_order: 0,
        latency: new_histogram(),
        error: None,
    };
    let (mut last_i, mut max_seq, mut acked_seq) = (None::<u64>, 0u64, 0u64);
    let mut tick = tokio::time::interval(ack_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop_check = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            frame = ws.next() => {
                let text = match frame {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(c))) => {
                        out.error = Some(format!("closed by the server: {c:?}"));
                        break;
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        out.error = Some(format!("read: {e}"));
                        break;
                    }
                    None => {
                        out.error = Some("connection ended".into());
                        break;
                    }
                };
                match wire::classify(target, &text) {
                    Incoming::Data { i, t, seq } => {
                        out.received += 1;
                        shared.delivered.fetch_add(1, Ordering::Relaxed);
                        if last_i.is_some_and(|l| i != l + 1) {
                            out.out_of_order += 1;
                        }
                        last_i = Some(i);
                        max_seq = max_seq.max(seq);
                        if shared.measuring.load(Ordering::Relaxed) {
                            let _ = out.latency.record(now_ns().saturating_sub(t).max(1));
                        }
                    }
                    Incoming::Ping if ws.send(Message::text("3")).await.is_err() => break,
                    _ => {}
                }
            }
            _ = tick.tick(), if target == Target::Statehub => {
                if max_seq > acked_seq {
                    acked_seq = max_seq;
                    if ws.send(Message::text(wire::sequence_ack(max_seq))).await.is_err() {
                        break;
                    }
                }
            }
            _ = stop_check.tick() => {
                if shared.stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
    if shared.stop.load(Ordering::Relaxed) && out.error.as_deref() == Some("connection ended") {
        out.error = None;
    }
    out
}

/// What the publisher did.
#[derive(Debug, Default)]
pub struct PubResult {
    pub published: u64,
    pub acked: u64,
    pub error: Option<String>,
}

/// Publishes as fast as acknowledgements allow, `window` unacknowledged at most,
/// until `until_publishing` is set; then waits (up to 5 s) for the last acks.
pub async fn publish(
    target: Target,
    mut ws: Ws,
    window: u64,
    padding: String,
    until_publishing: Arc<AtomicBool>,
) -> PubResult {
    let mut out = PubResult::default();
    let mut drain_deadline = None;
    loop {
        let publishing = !until_publishing.load(Ordering::Relaxed);
        if !publishing && drain_deadline.is_none() {
            drain_deadline = Some(tokio::time::Instant::now() + Duration::from_secs(5));
        }
        if publishing && out.published - out.acked < window {
            let mut batch = 0;
            while out.published - out.acked < window && batch < 64 {
                out.published += 1;
                let frame = wire::publish_frame(
                    target,
                    out.published,
                    &wire::payload(out.published, now_ns(), &padding),
                );
                if let Err(e) = ws.feed(Message::text(frame)).await {
                    out.error = Some(format!("send: {e}"));
                    return out;
                }
                batch += 1;
            }
            if let Err(e) = ws.flush().await {
                out.error = Some(format!("flush: {e}"));
                return out;
            }
        }
        if out.acked == out.published && !publishing {
            return out;
        }
        let deadline =
            drain_deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(30));
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) => t,
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => {
                out.error = Some(format!("read: {e}"));
                return out;
            }
            Ok(None) => {
                out.error = Some("connection ended".into());
                return out;
            }
            Err(_) => {
                out.error = Some(format!(
                    "{} publishes never acknowledged",
                    out.published - out.acked
                ));
                return out;
            }
        };
        match wire::classify(target, &frame) {
            Incoming::Ack { .. } => out.acked += 1,
            Incoming::Ping => {
                let _ = ws.send(Message::text("3")).await;
            }
            _ => {}
        }
    }
}
