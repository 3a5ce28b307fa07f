//! One WebSocket: a reader (this task) and a writer task joined by the session's
//! bounded [`Outbox`].
//!
//! Only the writer touches the socket's sending half: replies, published messages,
//! ping frames and the closing `disconnected` + close frame all go through it, in
//! queue order, so a reliable client sees the replayed messages before anything new.
//! A close request (protocol error, unacked overflow, slow consumer, replaced by a
//! recovered socket) stops both halves; when the socket ends the hub decides whether
//! the session is kept for recovery.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};

use crate::config::Limits;
use crate::dispatch::{handle_binary, handle_text, Effects};
use crate::hub::{Hub, Session, CLOSE_POLICY};
use crate::outbox::{outbox, CloseRequest, Next, Outbox, OutboxReceiver, PushError};
use crate::protocol::codec::encode_reply;
use crate::protocol::json::{Downstream, SystemEvent};
use crate::protocol::Subprotocol;

/// Close code: a frame larger than the limit.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// Close code: a frame of a kind the subprotocol does not use.
pub const CLOSE_UNSUPPORTED: u16 = 1003;

/// How long the writer gets to flush a close frame after the reader stopped.
const CLOSE_FLUSH: Duration = Duration::from_secs(2);

/// Accepts a socket and closes it at once, e.g. a failed recovery (1008).
pub async fn refuse(mut socket: WebSocket, code: u16, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(reason),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// Runs a socket for `session` until either side closes it.
pub async fn serve(socket: WebSocket, hub: Arc<Hub>, session: Arc<Session>, limits: Limits) {
    let (out, outrx) = outbox(limits.outbound_queue_messages, limits.outbound_queue_bytes);
    let Ok((generation, replay)) = session.attach(out.clone()) else {
        return refuse(socket, CLOSE_POLICY, "Session is gone").await;
    };
    let protocol = session.protocol();
    let mut first = Vec::with_capacity(replay.len() + 1);
    if protocol != Subprotocol::Raw {
        let connected = Downstream::System(SystemEvent::Connected {
            connection_id: session.id().to_owned(),
            user_id: session.user_id().map(str::to_owned),
            reconnection_token: session.reconnection_token().map(str::to_owned),
        });
        first.push(encode_reply(protocol, &connected));
    }
    first.extend(replay);

    let (sink, stream) = socket.split();
    let mut writer = tokio::spawn(write_loop(
        sink,
        outrx,
        first,
        protocol,
        limits.ping_interval,
    ));
    let close_requested = read_loop(stream, &hub, &session, &out).await;
    if close_requested {
        if tokio::time::timeout(CLOSE_FLUSH, &mut writer)
            .await
            .is_err()
        {
            writer.abort();
        }
    } else {
        writer.abort();
    }
    hub.socket_closed(&session, generation);
}

/// Reads frames until the peer goes or a close is requested; returns whether a close
/// was requested (the writer then sends it).
async fn read_loop(
    mut stream: SplitStream<WebSocket>,
    hub: &Hub,
    session: &Session,
    out: &Outbox,
) -> bool {
    let mut close_watch = out.close_watch();
    if close_watch.borrow_and_update().is_some() {
        return true;
    }
    loop {
        let frame = tokio::select! {
            biased;
            _ = close_watch.changed() => return true,
            frame = stream.next() => frame,
        };
        match frame {
            None | Some(Ok(Message::Close(_))) => return false,
            Some(Err(e)) => {
                // axum hides tungstenite's error type; its capacity errors say "too long"
                // (message) or "too big"/"limit" (frame), anything else is a broken socket.
                let text = e.to_string();
                if text.contains("too long") || text.contains("too big") || text.contains("limit") {
                    out.close(CLOSE_TOO_BIG, "Frame too large");
                    return true;
                }
                return false;
            }
            Some(Ok(Message::Text(text))) if is_json(session) => {
                apply(hub, session, out, handle_text(hub, session, text.as_str()));
            }
            Some(Ok(Message::Binary(bytes))) if session.protocol().is_protobuf() => {
                apply(hub, session, out, handle_binary(hub, session, &bytes));
            }
            Some(Ok(Message::Text(_) | Message::Binary(_)))
                if session.protocol() != Subprotocol::Raw =>
            {
                hub.remove(session.id());
                out.close(
                    CLOSE_UNSUPPORTED,
                    "This frame type is not used by the subprotocol",
                );
            }
            // Raw clients' frames are upstream `message` events, not wired yet; pings
            // and pongs are answered by the WebSocket layer.
            Some(Ok(_)) => {}
        }
    }
}

fn is_json(session: &Session) -> bool {
    matches!(
        session.protocol(),
        Subprotocol::Json | Subprotocol::JsonReliable
    )
}

/// Queues the replies of one request and carries out its close.
fn apply(hub: &Hub, session: &Session, out: &Outbox, fx: Effects) {
    for reply in fx.replies {
        if let Err(PushError::Full) = out.push(encode_reply(session.protocol(), &reply)) {
            out.close(CLOSE_POLICY, "Slow consumer");
        }
    }
    if let Some(close) = fx.close {
        hub.remove(session.id());
        out.close(close.code, close.reason);
    }
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: OutboxReceiver,
    first: Vec<Message>,
    protocol: Subprotocol,
    ping_interval: Duration,
) {
    for msg in first {
        if sink.send(msg).await.is_err() {
            return;
        }
    }
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + ping_interval, ping_interval);
    loop {
        tokio::select! {
            biased;
            next = rx.next() => match next {
                Next::Close(req) => return send_close(&mut sink, protocol, req).await,
                Next::Frame(msg) => {
                    if sink.send(msg).await.is_err() {
                        return;
                    }
                }
                Next::Ended => return,
            },
            _ = ping.tick() => {
                if sink.send(Message::Ping(Default::default())).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn send_close(
    sink: &mut SplitSink<WebSocket, Message>,
    protocol: Subprotocol,
    req: CloseRequest,
) {
    if protocol != Subprotocol::Raw {
        let msg = Downstream::System(SystemEvent::Disconnected {
            message: req.reason.clone(),
        });
        let _ = sink.send(encode_reply(protocol, &msg)).await;
    }
    let frame = CloseFrame {
        code: req.code,
        reason: Utf8Bytes::from(truncate(&req.reason, 120)),
    };
    let _ = sink.send(Message::Close(Some(frame))).await;
    let _ = sink.close().await;
}

/// Close reasons are limited to 123 bytes; cut on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
