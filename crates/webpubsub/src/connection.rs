//! One WebSocket: a reader (this task) and a writer task joined by the session's
//! bounded [`Outbox`].
//!
//! Only the writer touches the socket's sending half: replies, published messages,
//! ping frames and the closing `disconnected` + close frame all go through it, in
//! queue order, so a reliable client sees the replayed messages before anything new.
//! After each flush the writer raises the outbox's written watermark to the last
//! sequence id it wrote, which the session's replay buffer reads (see `reliable`).
//!
//! A close request (protocol error, slow consumer, replaced by a recovered socket, a
//! replay buffer that can no longer serve a recovery, REST close, shutdown, idle
//! timeout) stops both halves; when the socket ends the hub decides whether the
//! session is kept for recovery. Every close the server starts is preceded by a
//! `disconnected` message on the JSON and protobuf subprotocols.
//!
//! A user event with an upstream handler blocks this connection's reader until the
//! upstream answers (events are handled in order, as the service does); the writer,
//! close requests and shutdown are not blocked meanwhile.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::watch;

use crate::config::Limits;
use crate::dispatch::{handle_binary, handle_raw, handle_text};
use crate::effects::{AckFailure, Effects, UserEvent};
use crate::hub::admin::{Selection, Target};
use crate::hub::{Hub, Session, CLOSE_GOING_AWAY, CLOSE_POLICY};
use crate::outbox::{outbox, CloseRequest, Frame, Next, Outbox, OutboxReceiver, PushError};
use crate::protocol::codec::encode_reply;
use crate::protocol::json::{Downstream, SystemEvent};
use crate::protocol::Payload;
use crate::protocol::Subprotocol;

/// Close code: a frame larger than the limit.
pub(crate) const CLOSE_TOO_BIG: u16 = 1009;
/// Close code: a frame of a kind the subprotocol does not use.
pub(crate) const CLOSE_UNSUPPORTED: u16 = 1003;
/// Close code: the server failed (an upstream event without `ackId` failed).
pub(crate) const CLOSE_INTERNAL: u16 = 1011;

/// How long the writer gets to flush a close frame after the reader stopped.
const CLOSE_FLUSH: Duration = Duration::from_secs(2);

/// Accepts a socket and closes it at once, e.g. a failed recovery (1008), after a
/// `disconnected` message unless the client is raw.
pub(crate) async fn refuse(mut socket: WebSocket, protocol: Subprotocol, code: u16, reason: &str) {
    if protocol != Subprotocol::Raw {
        let msg = Downstream::System(SystemEvent::Disconnected {
            message: reason.to_owned(),
        });
        if let Some(frame) = encode_reply(protocol, &msg) {
            let _ = socket.send(frame).await;
        }
    }
    let frame = CloseFrame {
        code,
        reason: Utf8Bytes::from(truncate(reason, 120)),
    };
    let _ = socket.send(Message::Close(Some(frame))).await;
}

/// Runs a socket for `session` until either side closes it.
pub(crate) async fn serve(socket: WebSocket, hub: Arc<Hub>, session: Arc<Session>, limits: Limits) {
    let protocol = session.protocol();
    let (out, mut outrx) = outbox(limits.outbound_queue_messages, limits.outbound_queue_bytes);
    if let Some(gate) = session.gate() {
        outrx.set_gate(gate);
    }
    let (generation, replay, replay_gate) = match session.attach(out.clone()) {
        Ok(attached) => attached,
        Err(e) => {
            tracing::debug!(id = session.id(), %e, "web pubsub: attach failed");
            hub.remove(session.id());
            return refuse(socket, protocol, CLOSE_POLICY, &e.to_string()).await;
        }
    };
    let mut connected = None;
    if protocol != Subprotocol::Raw {
        let msg = Downstream::System(SystemEvent::Connected {
            connection_id: session.id().to_owned(),
            user_id: session.user_id().map(str::to_owned),
            reconnection_token: session.reconnection_token().map(str::to_owned),
        });
        connected = encode_reply(protocol, &msg);
    }
    let replay = Replay {
        frames: replay
            .into_iter()
            .map(|(seq, msg)| Frame {
                msg,
                seq: Some(seq),
            })
            .collect(),
        gate: replay_gate,
    };

    let (sink, stream) = socket.split();
    let mut writer = tokio::spawn(write_loop(
        sink,
        outrx,
        (connected, replay),
        protocol,
        limits.ping_interval,
    ));
    if generation == 1 {
        hub.connected(&session);
    }
    if hub.shutdown_token().is_cancelled() {
        let code = session.close_code(CLOSE_GOING_AWAY);
        hub.close(session.id(), code, "The server is shutting down");
    }
    let idle = limits.effective_idle_timeout();
    let close_requested = read_loop(stream, &hub, &session, &out, idle).await;
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
/// was requested (the writer then sends it). A socket silent for `idle` (no frame, not
/// even a pong to our pings) is taken for dead and closed; a reliable session stays
/// recoverable.
async fn read_loop(
    mut stream: SplitStream<WebSocket>,
    hub: &Arc<Hub>,
    session: &Arc<Session>,
    out: &Outbox,
    idle: Duration,
) -> bool {
    let mut close_watch = out.close_watch();
    if close_watch.borrow_and_update().is_some() {
        return true;
    }
    loop {
        let frame = tokio::select! {
            biased;
            _ = close_watch.changed() => return true,
            frame = tokio::time::timeout(idle, stream.next()) => match frame {
                Ok(frame) => frame,
                Err(_) => {
                    out.close(
                        CLOSE_GOING_AWAY,
                        format!("No frame from the client for {} s", idle.as_secs()),
                    );
                    return true;
                }
            },
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
                let fx = handle_text(hub, session, text.as_str());
                apply(hub, session, out, fx, &mut close_watch).await;
            }
            Some(Ok(Message::Binary(bytes))) if session.protocol().is_protobuf() => {
                let fx = handle_binary(hub, session, &bytes);
                apply(hub, session, out, fx, &mut close_watch).await;
            }
            Some(Ok(Message::Text(text))) if session.protocol() == Subprotocol::Raw => {
                let fx = handle_raw(hub, Payload::Text(text.as_str().to_owned()));
                apply(hub, session, out, fx, &mut close_watch).await;
            }
            Some(Ok(Message::Binary(bytes))) if session.protocol() == Subprotocol::Raw => {
                let fx = handle_raw(hub, Payload::Binary(bytes.to_vec()));
                apply(hub, session, out, fx, &mut close_watch).await;
            }
            Some(Ok(Message::Text(_) | Message::Binary(_)))
                if session.protocol() != Subprotocol::Raw =>
            {
                hub.close(
                    session.id(),
                    CLOSE_UNSUPPORTED,
                    "This frame type is not used by the subprotocol",
                );
            }
            // Pings and pongs are answered by the WebSocket layer; they only count as
            // signs of life.
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

fn reply(hub: &Hub, session: &Session, out: &Outbox, msg: &Downstream) {
    reply_held(hub, session, out, msg, 0);
}

/// [`reply`], reaching the socket only once the mirror write `held` is stored.
fn reply_held(hub: &Hub, session: &Session, out: &Outbox, msg: &Downstream, held: u64) {
    if let Downstream::Ack { success, .. } = msg {
        hub.stats().ack(*success);
    }
    let Some(frame) = encode_reply(session.protocol(), msg) else {
        return;
    };
    if let Err(PushError::Full) = out.push_held(frame, held) {
        if session.slow_consumer(out) {
            hub.remove(session.id());
        }
    }
}

/// Queues the replies of one request, carries out its close, and posts its user event.
async fn apply(
    hub: &Arc<Hub>,
    session: &Arc<Session>,
    out: &Outbox,
    fx: Effects,
    close_watch: &mut watch::Receiver<Option<CloseRequest>>,
) {
    hub.stats().message_in();
    for msg in &fx.replies {
        reply_held(hub, session, out, msg, fx.held);
    }
    if let Some(timer) = fx.stream_timer {
        crate::hub::stream::spawn_idle_timer(Arc::clone(hub), Arc::clone(session), timer);
    }
    if let Some(close) = fx.close {
        hub.close(session.id(), close.code, &close.reason);
    }
    if let Some(waiting) = fx.ack_when_written {
        let written = tokio::select! {
            biased;
            _ = close_watch.changed() => return,
            written = hub.written(waiting.seq) => written,
        };
        let id = waiting.ack_id;
        let ack = match written {
            Ok(()) => {
                session.processed(id, waiting.recorded);
                Downstream::ack_ok(id)
            }
            Err(e) => {
                let e = AckFailure::Unavailable(e.to_string());
                Downstream::ack_err(id, e.name(), e.to_string())
            }
        };
        reply(hub, session, out, &ack);
    }
    if let Some(event) = fx.upstream {
        user_event(hub, session, out, event, close_watch).await;
    }
}

/// Posts a user event and answers by the upstream's answer: its data goes back as a
/// message from the server, then the ack. A failure is an error ack, or, for a message
/// without `ackId` (raw frames included), closes the connection as the service does.
async fn user_event(
    hub: &Arc<Hub>,
    session: &Arc<Session>,
    out: &Outbox,
    event: UserEvent,
    close_watch: &mut watch::Receiver<Option<CloseRequest>>,
) {
    let Some(events) = hub.events() else {
        return;
    };
    if event.ack_id.is_some() && !still_held(hub, session, close_watch).await {
        return;
    }
    let call = events.user_event(hub, session, &event.event, &event.payload);
    let result = tokio::select! {
        biased;
        _ = close_watch.changed() => return,
        result = call => result,
    };
    if let Some(invocation_id) = event.invocation_id {
        let response = match result {
            Ok(answer) => Downstream::InvokeResponse {
                invocation_id,
                success: true,
                data_type: answer.as_ref().map(Payload::data_type),
                data: answer.as_ref().map(Payload::to_json_value),
                error: None,
            },
            Err(e) => {
                tracing::warn!("invoke {:?} of {}: {e}", event.event, session.id());
                Downstream::invoke_err(invocation_id, e.name(), e.to_string())
            }
        };
        reply(hub, session, out, &response);
        return;
    }
    match (result, event.ack_id) {
        (Ok(answer), ack_id) => {
            if let Some(payload) = answer {
                let target = Target::Connection(session.id());
                hub.send(target, &Selection::default(), &payload, None);
            }
            if let Some(id) = ack_id {
                session.processed(id, false);
                reply(hub, session, out, &Downstream::ack_ok(id));
            }
        }
        (Err(e), Some(id)) => {
            tracing::warn!("user event {:?} of {}: {e}", event.event, session.id());
            reply(
                hub,
                session,
                out,
                &Downstream::ack_err(id, e.name(), e.to_string()),
            );
        }
        (Err(e), None) => {
            tracing::warn!(
                "user event {:?} of {}: {e}; closing",
                event.event,
                session.id()
            );
            let reason = format!("The event handler failed: {e}");
            hub.close(session.id(), session.close_code(CLOSE_INTERNAL), &reason);
        }
    }
}

/// Whether a mirrored session is still this node's in the store (no other node claimed
/// it), before an event with an `ackId` is posted; `true` for any other session. A
/// client sends such an event again, on its next socket, until it is acked: one this
/// node took after another node claimed the session would reach the upstream twice.
/// When the store says no, the session is handed over here (its socket closes) and the
/// event is neither posted nor acked. A claim between the answer and the post can
/// still let both nodes post it, as when a socket drops between a post and its ack.
async fn still_held(
    hub: &Hub,
    session: &Session,
    close_watch: &mut watch::Receiver<Option<CloseRequest>>,
) -> bool {
    let Some(cluster) = hub.cluster().filter(|_| session.is_mirrored()) else {
        return true;
    };
    let held = cluster.still_held(hub.name(), session.id());
    tokio::select! {
        biased;
        _ = close_watch.changed() => false,
        held = held => held,
    }
}

/// Frames written to a socket before flushing, at most: bounds how long a busy
/// socket's writer keeps its worker thread.
const WRITE_BATCH: usize = 256;

/// A recovery's replay: its frames, written once the mirror write `gate` is stored.
struct Replay {
    frames: Vec<Frame>,
    gate: u64,
}

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: OutboxReceiver,
    (connected, replay): (Option<Message>, Replay),
    protocol: Subprotocol,
    ping_interval: Duration,
) {
    if let Some(msg) = connected {
        if sink.send(msg).await.is_err() {
            return;
        }
    }
    if !replay.frames.is_empty() {
        if let Some(req) = rx.hold(replay.gate).await {
            return send_close(&mut sink, protocol, req).await;
        }
        let mut written = None;
        for frame in replay.frames {
            written = frame.seq.or(written);
            if sink.feed(frame.msg).await.is_err() {
                return;
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
        if let Some(seq) = written {
            rx.mark_written(seq);
        }
    }
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + ping_interval, ping_interval);
    loop {
        tokio::select! {
            biased;
            next = rx.next() => match next {
                Next::Close(req) => return send_close(&mut sink, protocol, req).await,
                Next::Frame(frame) => {
                    if write_batch(&mut sink, &mut rx, frame).await.is_err() {
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

/// Writes `frame` and everything queued behind it (up to [`WRITE_BATCH`]) in one
/// flush, then raises the written watermark to the batch's last sequence id.
async fn write_batch(
    sink: &mut SplitSink<WebSocket, Message>,
    rx: &mut OutboxReceiver,
    frame: Frame,
) -> Result<(), axum::Error> {
    let mut written = frame.seq;
    sink.feed(frame.msg).await?;
    for _ in 1..WRITE_BATCH {
        let Some(frame) = rx.try_frame() else { break };
        written = frame.seq.or(written);
        sink.feed(frame.msg).await?;
    }
    sink.flush().await?;
    if let Some(seq) = written {
        rx.mark_written(seq);
    }
    Ok(())
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
        if let Some(frame) = encode_reply(protocol, &msg) {
            let _ = sink.send(frame).await;
        }
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
