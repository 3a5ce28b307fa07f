//! Client streams to a group: `streamStart` (or a `sendToGroup` with a `stream`
//! property), `streamData` and `streamEnd` on the JSON subprotocols, as the service's
//! reliable JSON protocol reference describes them and `@azure/web-pubsub-client`'s
//! streaming preview sends them.
//!
//! A stream lives on its publisher's session, keyed by `streamId`. Each fragment must
//! carry the next `streamSequenceId` (1, 2, ...): it is published to the group as a
//! `message` with a `stream` property and answered `streamAck` with the next id
//! expected; an id already seen is answered `streamAck` again without publishing (a
//! retry), one ahead of the expected id `streamNack` `InvalidSequenceId`. `streamData`
//! without a sequence id and data is a keepalive. The end (`streamEnd`, the idle
//! timeout, a revoked permission, the publisher's session ending) publishes a terminal
//! message (`endOfStream: true`, empty text data, the error if any) and, except when
//! the session ended, answers the publisher `streamClosed`.
//!
//! In a cluster, a reliable session's open streams move with it (`mirror.rs`): each
//! opening (group, `noEcho`, idle timeout), each accepted fragment (the next expected
//! id and the idle deadline, handed to the cluster with the fragment's broadcast as
//! one) and each end is a write to its copy, and the reply it answers waits in the
//! socket's queue until that write is stored (`Effects::held`), so the publisher is
//! never acked past what a node taking the session over would expect; a keepalive,
//! repeat or nack writes the moved deadline alone, waited on by nothing. That node
//! goes on from there, with the same idle deadline: a fragment the client sends again
//! (its ack was lost with the old node) is answered `streamAck` without being
//! published again, so members get it once. This node's own members get a fragment
//! only once the store took it (`hub/lane.rs`).
//!
//! Locking: a session's stream table is taken alone, never while publishing (a
//! publisher may be in its own group) nor with its permissions held.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::effects::{check_group, Effects, StreamTimer};
use crate::hub::{Hub, Session};
use crate::mirror::{instant, unix_ms, MirroredStream, SessionWrite};
use crate::protocol::codec::Request;
use crate::protocol::json::{AckError, Downstream, StreamEndError, StreamError, StreamInfo};
use crate::protocol::{Payload, ProtocolError};

/// The idle timeout of a stream whose start names none.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_millis(300_000);
/// Streams one connection may have open at once.
pub(crate) const MAX_STREAMS_PER_CONNECTION: usize = 100;
/// Longest `streamId` accepted: the id is written to a reliable session's copy with
/// every fragment, so it must stay small whatever the frame size.
pub(crate) const MAX_STREAM_ID: usize = 256;

/// A session's open streams.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    active: HashMap<String, OutStream>,
    /// Tells a stream from an earlier one of the same id, for its idle timer.
    next_epoch: u64,
}

#[derive(Debug)]
struct OutStream {
    group: String,
    no_echo: bool,
    /// The next `streamSequenceId` expected.
    expected: u64,
    idle: Duration,
    deadline: Instant,
    epoch: u64,
}

/// Handles a stream request of a session (other requests are ignored).
pub(crate) fn handle(hub: &Hub, session: &Session, fx: &mut Effects, request: Request) {
    match request {
        Request::StreamStart {
            stream_id,
            group,
            idle_timeout_ms,
            no_echo,
        } => start(session, fx, stream_id, group, idle_timeout_ms, no_echo),
        Request::StreamData {
            stream_id,
            fragment,
        } => data(hub, session, fx, stream_id, fragment),
        Request::StreamEnd { stream_id, error } => end(hub, session, fx, stream_id, error),
        _ => {}
    }
}

fn closed(stream_id: String, name: &str, message: impl Into<String>) -> Downstream {
    Downstream::StreamClosed {
        stream_id,
        error: Some(AckError {
            name: name.to_owned(),
            message: message.into(),
        }),
    }
}

fn not_found(stream_id: String) -> Downstream {
    let message = format!("Stream '{stream_id}' is not open on this connection");
    closed(stream_id, "StreamNotFound", message)
}

fn start(
    session: &Session,
    fx: &mut Effects,
    stream_id: String,
    group: String,
    idle_timeout_ms: Option<u64>,
    no_echo: bool,
) {
    if stream_id.is_empty() || stream_id.len() > MAX_STREAM_ID {
        let message = format!("streamId must be 1 to {MAX_STREAM_ID} bytes");
        fx.replies.push(closed(stream_id, "BadRequest", message));
        return;
    }
    if idle_timeout_ms == Some(0) {
        fx.replies.push(closed(
            stream_id,
            "BadRequest",
            "idleTimeoutMs must be greater than 0",
        ));
        return;
    }
    let allowed = session.permissions().can_send(&group);
    if let Err(e) = check_group(&group, allowed, "stream to") {
        fx.replies.push(closed(stream_id, e.name(), e.to_string()));
        return;
    }
    let idle = idle_timeout_ms.map_or(DEFAULT_IDLE_TIMEOUT, Duration::from_millis);
    let mut streams = session.streams();
    if streams.active.contains_key(&stream_id) {
        let message = format!("Stream '{stream_id}' is already open on this connection");
        drop(streams);
        fx.replies.push(closed(stream_id, "BadRequest", message));
        return;
    }
    if streams.active.len() >= MAX_STREAMS_PER_CONNECTION {
        drop(streams);
        let message = format!("At most {MAX_STREAMS_PER_CONNECTION} streams may be open at once");
        fx.replies.push(closed(stream_id, "BadRequest", message));
        return;
    }
    streams.next_epoch += 1;
    let epoch = streams.next_epoch;
    let deadline = Instant::now() + idle;
    streams.active.insert(
        stream_id.clone(),
        OutStream {
            group: group.clone(),
            no_echo,
            expected: 1,
            idle,
            deadline,
            epoch,
        },
    );
    drop(streams);
    fx.held = session.mirror_stream(|| {
        SessionWrite::StreamOpened(MirroredStream {
            id: stream_id.clone(),
            group,
            no_echo,
            idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
            expected: 1,
            deadline_ms: unix_ms(Some(deadline)),
        })
    });
    fx.stream_timer = Some(StreamTimer {
        stream_id: stream_id.clone(),
        epoch,
    });
    fx.replies.push(Downstream::StreamAck {
        stream_id,
        expected_sequence_id: 1,
    });
}

fn data(
    hub: &Hub,
    session: &Session,
    fx: &mut Effects,
    stream_id: String,
    fragment: Option<(u64, Result<Payload, ProtocolError>)>,
) {
    let (group, deadline) = match session.streams().active.get_mut(&stream_id) {
        Some(s) => {
            s.deadline = Instant::now() + s.idle;
            (s.group.clone(), unix_ms(Some(s.deadline)))
        }
        None => return fx.replies.push(not_found(stream_id)),
    };
    let Some((seq, payload)) = fragment else {
        return keepalive(session, fx, stream_id, deadline);
    };
    let failure = data_failure(&payload, session.permissions().can_send(&group), &group);
    let mut streams = session.streams();
    let Some(s) = streams.active.get_mut(&stream_id) else {
        drop(streams);
        return fx.replies.push(not_found(stream_id));
    };
    if seq != s.expected {
        let expected = s.expected;
        drop(streams);
        touch(session, &stream_id, expected, deadline);
        return fx.replies.push(out_of_order(stream_id, seq, expected));
    }
    if let Some(failure) = failure {
        let s = streams.active.remove(&stream_id);
        drop(streams);
        return end_failed(hub, session, fx, (stream_id, s), failure);
    }
    s.expected += 1;
    let no_echo = s.no_echo;
    drop(streams);
    if let Ok(payload) = payload {
        let target = (group.as_str(), no_echo);
        let fragment = (seq, &payload, deadline);
        let Some(ticket) = publish_fragment(hub, session, &stream_id, target, fragment) else {
            return fx.replies.push(unsent(session, stream_id, seq));
        };
        fx.held = ticket;
    }
    fx.replies.push(Downstream::StreamAck {
        stream_id,
        expected_sequence_id: seq + 1,
    });
}

/// A `streamData` without a fragment: the idle deadline moved, answered with the id
/// expected.
fn keepalive(session: &Session, fx: &mut Effects, stream_id: String, deadline: u64) {
    let expected = session
        .streams()
        .active
        .get(&stream_id)
        .map_or(1, |s| s.expected);
    touch(session, &stream_id, expected, deadline);
    fx.replies.push(Downstream::StreamAck {
        stream_id,
        expected_sequence_id: expected,
    });
}

/// A fragment that ends its stream (see [`data_failure`]): its members get the
/// terminal message with the group's error, the publisher `streamClosed`.
fn end_failed(
    hub: &Hub,
    session: &Session,
    fx: &mut Effects,
    (stream_id, removed): (String, Option<OutStream>),
    (name, group_error, message): (&'static str, &'static str, String),
) {
    if let Some(s) = removed {
        let error = StreamError {
            name: group_error.into(),
            message: Some(message.clone()),
            user_error_code: None,
        };
        fx.held = publish_end_closing(hub, session, &stream_id, &s, Some(error));
    }
    fx.replies.push(closed(stream_id, name, message));
}

/// Publishes an accepted fragment `(seq, payload, idle deadline)` to the stream's
/// group, its new state for the session's copy with it: the mirror ticket, `None`
/// when it reached no node.
fn publish_fragment(
    hub: &Hub,
    session: &Session,
    stream_id: &str,
    target: (&str, bool),
    (seq, payload, deadline_ms): (u64, &Payload, u64),
) -> Option<u64> {
    let info = StreamInfo {
        stream_id: stream_id.to_owned(),
        stream_sequence_id: seq,
        end_of_stream: false,
        error: None,
    };
    // With the broadcast as one: stored, it says the fragment went out.
    let state = SessionWrite::StreamAccepted {
        id: stream_id.to_owned(),
        expected: seq + 1,
        deadline_ms,
    };
    publish(hub, session, target, &info, payload, Some(state))
}

/// A fragment delivered nowhere: the publisher may send it again, so the id expected
/// goes back to it.
fn unsent(session: &Session, stream_id: String, seq: u64) -> Downstream {
    if let Some(s) = session.streams().active.get_mut(&stream_id) {
        s.expected = s.expected.min(seq);
    }
    Downstream::StreamNack {
        stream_id,
        expected_sequence_id: seq,
        name: "InternalServerError".into(),
        message: "The message could not reach every node; send it again".into(),
    }
}

/// A stream's idle deadline moved without a fragment accepted (a keepalive, a repeat,
/// a nack): the session's copy gets it (a small write, waited on by nothing), so a
/// node that takes the session over keeps the same deadline.
fn touch(session: &Session, stream_id: &str, expected: u64, deadline_ms: u64) {
    session.mirror_stream(|| SessionWrite::StreamAccepted {
        id: stream_id.to_owned(),
        expected,
        deadline_ms,
    });
}

/// Why a fragment ends its stream: (the reply's error name, the group's error name, the
/// message), or `None` when it is delivered.
fn data_failure(
    payload: &Result<Payload, ProtocolError>,
    allowed: bool,
    group: &str,
) -> Option<(&'static str, &'static str, String)> {
    match (payload, allowed) {
        (Err(e), _) => Some(("BadRequest", "Cancelled", e.to_string())),
        (Ok(_), false) => Some((
            "Forbidden",
            "Forbidden",
            format!("The connection has no permission to send to group '{group}'"),
        )),
        (Ok(_), true) => None,
    }
}

/// The reply to a fragment that is not the one expected: an ack of what was already
/// received for a repeat, a nack for one that skips ahead.
fn out_of_order(stream_id: String, seq: u64, expected: u64) -> Downstream {
    if seq < expected {
        Downstream::StreamAck {
            stream_id,
            expected_sequence_id: expected,
        }
    } else {
        Downstream::StreamNack {
            stream_id,
            expected_sequence_id: expected,
            name: "InvalidSequenceId".into(),
            message: format!("Expected streamSequenceId {expected}, got {seq}"),
        }
    }
}

fn end(
    hub: &Hub,
    session: &Session,
    fx: &mut Effects,
    stream_id: String,
    error: Option<StreamEndError>,
) {
    let Some(s) = session.streams().active.remove(&stream_id) else {
        return fx.replies.push(not_found(stream_id));
    };
    let error = error.map(|e| StreamError {
        name: "UserError".into(),
        message: e.message,
        user_error_code: e.user_error_code,
    });
    fx.held = publish_end_closing(hub, session, &stream_id, &s, error);
    fx.replies.push(Downstream::StreamClosed {
        stream_id,
        error: None,
    });
}

/// Publishes a fragment to the stream's group on every node, with `state` for the
/// session's copy: the state's mirror ticket (0: none), `None` when the cluster
/// refused it (nothing was delivered).
fn publish(
    hub: &Hub,
    session: &Session,
    (group, no_echo): (&str, bool),
    info: &StreamInfo,
    payload: &Payload,
    state: Option<SessionWrite>,
) -> Option<u64> {
    match hub.publish_to_group(session, group, no_echo, payload, (Some(info), state)) {
        Ok((_, ticket)) => Some(ticket),
        Err(error) => {
            tracing::warn!(%error, stream = info.stream_id, "web pubsub: a stream fragment could not reach the other nodes");
            None
        }
    }
}

/// Publishes the terminal message of a stream (see [`publish_end_with`]) with the
/// stream's removal from the session's copy, as one with the terminal message's
/// broadcast (written alone if the cluster refused that): the removal's mirror
/// ticket, for the reply to wait on.
fn publish_end_closing(
    hub: &Hub,
    session: &Session,
    stream_id: &str,
    s: &OutStream,
    error: Option<StreamError>,
) -> u64 {
    let closed = SessionWrite::StreamClosed(stream_id.to_owned());
    match publish_end_with(hub, session, stream_id, s, error, Some(closed)) {
        Some(ticket) => ticket,
        None => session.mirror_stream(|| SessionWrite::StreamClosed(stream_id.to_owned())),
    }
}

/// Publishes the terminal message of a stream: no data (empty text), the next
/// sequence id, `endOfStream`, and the error if it did not end normally; with `state`
/// for the session's copy (see [`publish`]).
fn publish_end_with(
    hub: &Hub,
    session: &Session,
    stream_id: &str,
    s: &OutStream,
    error: Option<StreamError>,
    state: Option<SessionWrite>,
) -> Option<u64> {
    let info = StreamInfo {
        stream_id: stream_id.to_owned(),
        stream_sequence_id: s.expected,
        end_of_stream: true,
        error,
    };
    publish(
        hub,
        session,
        (&s.group, s.no_echo),
        &info,
        &Payload::Text(String::new()),
        state,
    )
}

/// Ends every stream of a session that ended: subscribers get a terminal message
/// with the error `Cancelled`. Each one with the stream's removal from the session's
/// copy, like any end: if another node claimed the session meanwhile, it is fenced
/// out and not published (the stream goes on there).
pub(crate) fn cancel_all(hub: &Hub, session: &Session) {
    let open: Vec<(String, OutStream)> = session.streams().active.drain().collect();
    for (stream_id, s) in open {
        let error = StreamError {
            name: "Cancelled".into(),
            message: Some("The publisher's connection ended".into()),
            user_error_code: None,
        };
        let closed = SessionWrite::StreamClosed(stream_id.clone());
        let _ = publish_end_with(hub, session, &stream_id, &s, Some(error), Some(closed));
    }
}

/// Forgets every stream of a session another node took over, publishing nothing:
/// they go on there.
pub(crate) fn forget_all(session: &Session) {
    session.streams().active.clear();
}

/// Watches the idle deadline of every stream of a session taken over from another node.
pub(crate) fn watch_restored(hub: &Arc<Hub>, session: &Arc<Session>) {
    let timers: Vec<StreamTimer> = (session.streams().active.iter())
        .map(|(id, s)| StreamTimer {
            stream_id: id.clone(),
            epoch: s.epoch,
        })
        .collect();
    for timer in timers {
        spawn_idle_timer(Arc::clone(hub), Arc::clone(session), timer);
    }
}

impl Streams {
    /// The streams of a session taken over from another node, from its copy, each
    /// with the idle deadline it had there (by the wall clock: the nodes' clocks are
    /// assumed close; one not recorded starts again at `now`). No more than one
    /// connection may open.
    pub(crate) fn restore(&mut self, streams: &[MirroredStream], now: Instant) {
        for m in streams.iter().take(MAX_STREAMS_PER_CONNECTION) {
            self.next_epoch += 1;
            let idle = Duration::from_millis(m.idle_ms.max(1));
            let deadline = instant(m.deadline_ms).map_or(now + idle, |d| d.min(now + idle));
            self.active.insert(
                m.id.clone(),
                OutStream {
                    group: m.group.clone(),
                    no_echo: m.no_echo,
                    expected: m.expected.max(1),
                    idle,
                    deadline,
                    epoch: self.next_epoch,
                },
            );
        }
    }
}

/// Watches a stream's idle deadline: once it passes with no fragment or keepalive, the
/// stream ends with `IdleTimeout` for the publisher (`streamClosed`) and subscribers.
pub(crate) fn spawn_idle_timer(hub: Arc<Hub>, session: Arc<Session>, timer: StreamTimer) {
    let StreamTimer { stream_id, epoch } = timer;
    tokio::spawn(async move {
        loop {
            let deadline = match session.streams().active.get(&stream_id) {
                Some(s) if s.epoch == epoch => s.deadline,
                _ => return,
            };
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = hub.shutdown_token().cancelled() => return,
            }
            let expired = {
                let mut streams = session.streams();
                match streams.active.get(&stream_id) {
                    Some(s) if s.epoch == epoch && Instant::now() >= s.deadline => {
                        streams.active.remove(&stream_id)
                    }
                    Some(s) if s.epoch == epoch => continue,
                    _ => return,
                }
            };
            if let Some(s) = expired {
                let message = format!("The stream was idle for {} ms", s.idle.as_millis());
                let error = StreamError {
                    name: "IdleTimeout".into(),
                    message: Some(message.clone()),
                    user_error_code: None,
                };
                let held = publish_end_closing(&hub, &session, &stream_id, &s, Some(error));
                if session.send_reply(&closed(stream_id, "IdleTimeout", message), held) {
                    hub.remove(session.id());
                }
            }
            return;
        }
    });
}

#[cfg(test)]
#[path = "stream_test.rs"]
mod tests;
