//! What a client's upstream messages do, without the socket: each frame (JSON or
//! protobuf, decoded to the same [`Request`]) becomes the [`Effects`]: replies to queue and whether
//! the connection must close. Tested directly in `dispatch_test.rs`.
//!
//! A user event with an upstream handler is not answered here: the effects carry it as
//! [`UserEvent`] and the connection posts it, then acks (or closes) by the answer.
//!
//! Acks: a message with an `ackId` is answered once processed. An `ackId` already
//! processed on this session is answered `Duplicate` and not processed again (a client
//! resends with the same id after a recovery). Failures are not remembered, so a
//! message refused as `Forbidden` may be retried with the same id.

use crate::effects::{check_group, AckFailure, Close, Effects, UserEvent, WrittenAck};
use crate::hub::{Hub, Session, CLOSE_POLICY};
use crate::protocol::codec::{decode_binary, decode_text, Request};
use crate::protocol::json::Downstream;
use crate::protocol::{Payload, ProtocolError};

/// Handles one frame of a raw (no subprotocol) client: the `message` user event when
/// the hub has a handler for it, else nothing.
pub(crate) fn handle_raw(hub: &Hub, payload: Payload) -> Effects {
    let takes = hub.events().is_some_and(|e| e.takes_user_event(RAW_EVENT));
    Effects {
        upstream: takes.then(|| UserEvent {
            event: RAW_EVENT.to_owned(),
            payload,
            ack_id: None,
            invocation_id: None,
        }),
        ..Effects::default()
    }
}

/// The user event a raw client's frames become.
pub(crate) const RAW_EVENT: &str = "message";

/// Handles one text frame from a JSON-subprotocol client.
pub(crate) fn handle_text(hub: &Hub, session: &Session, text: &str) -> Effects {
    handle(hub, session, decode_text(text))
}

/// Handles one binary frame from a protobuf-subprotocol client.
pub(crate) fn handle_binary(hub: &Hub, session: &Session, bytes: &[u8]) -> Effects {
    handle(hub, session, decode_binary(bytes))
}

/// Handles one decoded (or undecodable) request.
pub(crate) fn handle(
    hub: &Hub,
    session: &Session,
    request: Result<Request, ProtocolError>,
) -> Effects {
    let mut fx = Effects::default();
    let msg = match request {
        Ok(msg) => msg,
        Err(ProtocolError::Invalid {
            ack_id: Some(id),
            reason,
        }) => {
            fx.replies
                .push(Downstream::ack_err(id, "BadRequest", reason));
            return fx;
        }
        Err(e) => {
            fx.close = Some(Close {
                code: CLOSE_POLICY,
                reason: format!("Invalid message: {e}"),
            });
            return fx;
        }
    };
    let ack_id = msg.ack_id();
    if let Some(id) = ack_id {
        if session.is_duplicate(id) {
            fx.replies.push(Downstream::ack_err(
                id,
                "Duplicate",
                format!("Message with ack-id: {id} has been processed"),
            ));
            return fx;
        }
    }
    let Some(result) = perform(hub, session, &mut fx, msg) else {
        return fx;
    };
    if let Some(id) = ack_id {
        match (result, fx.ack_when_written.as_mut()) {
            (Ok(()), Some(waiting)) => waiting.ack_id = id,
            (Ok(()), None) => {
                session.processed(id, false);
                fx.replies.push(Downstream::ack_ok(id));
            }
            (Err(e), _) => fx
                .replies
                .push(Downstream::ack_err(id, e.name(), e.to_string())),
        }
    } else {
        fx.ack_when_written = None;
    }
    fx
}

/// Carries out one request; `None` when its ack waits for the upstream's answer. A
/// send to other nodes sets [`Effects::ack_when_written`] (its ack id filled in by
/// the caller).
fn perform(
    hub: &Hub,
    session: &Session,
    fx: &mut Effects,
    msg: Request,
) -> Option<Result<(), AckFailure>> {
    let ack_id = msg.ack_id();
    Some(match msg {
        Request::JoinGroup { group, .. } => {
            check_group(&group, session.permissions().can_join_leave(&group), "join").and_then(
                |()| {
                    hub.join(session, &group)
                        .map_err(|e| AckFailure::BadRequest(e.to_string()))
                },
            )
        }
        Request::LeaveGroup { group, .. } => check_group(
            &group,
            session.permissions().can_join_leave(&group),
            "leave",
        )
        .map(|()| hub.leave(session, &group)),
        Request::SendToGroup {
            group,
            no_echo,
            payload,
            ..
        } => send_to_group(hub, session, (&group, no_echo), payload, ack_id).map(
            |(seq, recorded)| {
                // An acknowledged send must survive this node: the ack waits for Redis.
                let ack = WrittenAck {
                    ack_id: 0,
                    seq,
                    recorded,
                };
                fx.ack_when_written = (seq > 0).then_some(ack);
            },
        ),
        Request::Event { event, payload, .. } => {
            return user_event(hub, fx, event, payload, ack_id)
        }
        Request::SequenceAck { sequence_id } => {
            hub.stats().sequence_ack();
            session.sequence_ack(sequence_id);
            Ok(())
        }
        Request::Ping => {
            fx.replies.push(Downstream::Pong);
            Ok(())
        }
        Request::Invoke {
            invocation_id,
            target,
            event,
            payload,
        } => {
            invoke(hub, fx, invocation_id, &target, event, payload);
            Ok(())
        }
        req @ (Request::StreamStart { .. }
        | Request::StreamData { .. }
        | Request::StreamEnd { .. }) => {
            crate::hub::stream::handle(hub, session, fx, req);
            Ok(())
        }
        Request::Unknown => Ok(()),
    })
}

/// A client's `sendToGroup`: its operation's number, and whether its `ackId` was
/// recorded in the session's copy with it. A mirrored session's send with an `ackId`
/// travels with that record as one, fenced like a stream fragment: once another node
/// claimed the session, neither is written, it reaches no member, and the ack is not
/// sent (the old socket is closed), so a client that sends it again to the new node
/// gets it published there once.
fn send_to_group(
    hub: &Hub,
    session: &Session,
    (group, no_echo): (&str, bool),
    payload: Result<Payload, ProtocolError>,
    ack_id: Option<u64>,
) -> Result<(u64, bool), AckFailure> {
    check_group(group, session.permissions().can_send(group), "send to")?;
    let payload = payload.map_err(|e| AckFailure::BadRequest(e.to_string()))?;
    let record = ack_id.and_then(|id| session.ack_record(id));
    let recorded = record.is_some() && hub.cluster().is_some();
    hub.publish_to_group(session, group, no_echo, &payload, (None, record))
        .map(|(seq, _)| (seq, recorded))
        .map_err(|e| AckFailure::Unavailable(e.to_string()))
}

/// An `event`: without a handler for it, validated and acked, as the service does;
/// with one, handed to the connection to post (`None`: it answers by the result).
fn user_event(
    hub: &Hub,
    fx: &mut Effects,
    event: String,
    payload: Result<Payload, ProtocolError>,
    ack_id: Option<u64>,
) -> Option<Result<(), AckFailure>> {
    if event.is_empty() || event.chars().any(char::is_control) {
        return Some(Err(AckFailure::BadRequest(
            "event name must be non-empty, without control characters".into(),
        )));
    }
    let payload = match payload {
        Ok(payload) => payload,
        Err(e) => return Some(Err(AckFailure::BadRequest(e.to_string()))),
    };
    if !hub.events().is_some_and(|e| e.takes_user_event(&event)) {
        return Some(Ok(()));
    }
    fx.upstream = Some(UserEvent {
        event,
        payload,
        ack_id,
        invocation_id: None,
    });
    None
}

/// An `invoke`: target `event` becomes a blocking user event whose answer is the
/// `invokeResponse`. Anything the upstream cannot be asked (another target, a bad
/// name or payload, no handler for the event) is answered at once with
/// `success: false` and a `BadRequest` error naming the reason, so the caller never
/// waits for an answer that cannot come.
fn invoke(
    hub: &Hub,
    fx: &mut Effects,
    invocation_id: String,
    target: &str,
    event: String,
    payload: Result<crate::protocol::Payload, ProtocolError>,
) {
    let refuse = |fx: &mut Effects, id: String, why: String| {
        fx.replies
            .push(Downstream::invoke_err(id, "BadRequest", why));
    };
    if target != "event" {
        return refuse(
            fx,
            invocation_id,
            format!("unsupported invoke target {target:?}; only \"event\" is served"),
        );
    }
    if event.is_empty() || event.chars().any(char::is_control) {
        return refuse(
            fx,
            invocation_id,
            "event name must be non-empty, without control characters".into(),
        );
    }
    let payload = match payload {
        Ok(p) => p,
        Err(e) => return refuse(fx, invocation_id, e.to_string()),
    };
    if !hub.events().is_some_and(|e| e.takes_user_event(&event)) {
        return refuse(
            fx,
            invocation_id,
            format!("no event handler of this hub takes the event {event:?}"),
        );
    }
    fx.upstream = Some(UserEvent {
        event,
        payload,
        ack_id: None,
        invocation_id: Some(invocation_id),
    });
}

#[cfg(test)]
#[path = "dispatch_test.rs"]
mod tests;
