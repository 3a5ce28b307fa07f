//! The ops each session change is written with, and the message bodies their
//! records refer to.

use std::sync::Arc;

use statehub_broker::{Message, QueuedRef, SessionChange};

use super::{held, key, num, records, Body, Inner, Op, State};
use crate::wire;

impl Inner {
    /// A record of `msg` is gone from this node's sessions.
    pub(super) fn release_body(state: &mut State, msg: &Arc<Message>) {
        let k = key(msg);
        if let Some(body) = state.bodies.get_mut(&k) {
            body.refs = body.refs.saturating_sub(1);
            if body.refs == 0 {
                state.bodies.remove(&k);
            }
        }
    }

    /// A record of `msg` refers to its body (a new one, or the first since adoption).
    fn refer(state: &mut State, msg: &Arc<Message>, refer: bool) {
        let body = Self::body(state, msg);
        if refer || body.refs == 0 {
            body.refs += 1;
        }
    }

    fn body<'a>(state: &'a mut State, msg: &Arc<Message>) -> &'a mut Body {
        state.bodies.entry(key(msg)).or_insert_with(|| Body {
            id: num(format_args!("{:016x}", rand::random::<u64>())),
            refs: 0,
            sent: false,
            msg: msg.clone(),
        })
    }

    /// The data of the body with id `id`, if a record here still refers to it.
    pub(super) fn body_data(&self, id: &[u8]) -> Option<Vec<u8>> {
        let msg = {
            let state = self.state.lock();
            let body = state.bodies.values().find(|b| b.id == id)?;
            body.msg.clone()
        };
        wire::encode(&msg, wire::Now::at(std::time::Instant::now())).ok()
    }

    /// The `M` op writing `record` for `msg` (its body's id, and its data the first
    /// time one is handed to the writer, or with `resend`).
    pub(super) fn message_op(
        state: &mut State,
        (incarnation, seq): (u64, u64),
        msg: &Arc<Message>,
        record: Vec<u8>,
        resend: bool,
    ) -> Option<Op> {
        let body = Self::body(state, msg);
        let data = if body.sent && !resend {
            Vec::new()
        } else {
            match wire::encode(msg, wire::Now::at(std::time::Instant::now())) {
                Ok(data) => data,
                Err(e) => {
                    tracing::warn!("message not stored for a persistent session: {e}");
                    return None;
                }
            }
        };
        body.sent = true;
        let id = body.id.clone();
        Some(vec![
            b"M".to_vec(),
            num(incarnation),
            num(seq),
            record,
            id,
            data,
        ])
    }

    /// The ops that write `change` (none while a message is held back).
    pub(super) fn ops(&self, state: &mut State, change: SessionChange<'_>) -> Vec<Op> {
        match change {
            SessionChange::Saved {
                client_id,
                incarnation,
                expiry_interval,
                disconnected,
                subscriptions,
            } => {
                let meta = records::encode_session(expiry_interval, disconnected, &subscriptions);
                let saved = (client_id.as_bytes(), expiry_interval, disconnected);
                vec![self.saved(state, incarnation, saved, meta)]
            }
            SessionChange::Ended {
                incarnation,
                messages,
                ..
            } => {
                state.known.remove(&incarnation);
                self.forget_adopted(state, incarnation);
                state.held.retain(|&(inc, _), _| inc != incarnation);
                for (_, msg) in messages {
                    Self::release_body(state, msg);
                }
                vec![vec![b"E".to_vec(), num(incarnation)]]
            }
            SessionChange::Message {
                incarnation,
                seq,
                message,
                released,
                ..
            } => Self::message(state, (incarnation, seq), message, released),
            SessionChange::MessageDone {
                incarnation,
                seq,
                msg,
            } => Self::done(state, (incarnation, seq), msg),
            SessionChange::MessageWithdrawn {
                incarnation,
                seq,
                msg,
            } => Self::withdrawn(state, (incarnation, seq), msg),
            SessionChange::IncomingQos2 {
                incarnation,
                packet_id,
                pending,
            } => {
                let code = if pending { b"Q" } else { b"q" };
                vec![vec![code.to_vec(), num(incarnation), num(packet_id)]]
            }
        }
    }

    /// The `S` op of a session's record: `meta` is its encoded form.
    fn saved(
        &self,
        state: &mut State,
        incarnation: u64,
        (client_id, expiry_interval, disconnected): (&[u8], u32, bool),
        meta: Vec<u8>,
    ) -> Op {
        let new = state.known.insert(incarnation);
        // How long Redis keeps it once no live node holds it connected: its
        // expiry, and a sweep period more, so that an owner alive forgets it
        // first (its own clock ends it at its expiry).
        let life = match expiry_interval {
            u32::MAX => 0,
            secs => u64::from(secs) * 1000 + self.grace_ms,
        };
        let new = if new { b"1" } else { b"0" };
        let down = if disconnected { b"1" } else { b"0" };
        vec![
            b"S".to_vec(),
            num(incarnation),
            new.to_vec(),
            client_id.to_vec(),
            meta,
            num(life),
            down.to_vec(),
        ]
    }

    /// A message queued for a session: held back outside a group (write-behind),
    /// else its `M` op.
    fn message(
        state: &mut State,
        at: (u64, u64),
        message: QueuedRef<'_>,
        released: bool,
    ) -> Vec<Op> {
        Self::refer(state, message.msg, !released);
        let record = records::encode_message(message, released);
        if !released && state.open == 0 {
            let msg = message.msg.clone();
            Self::hold(state, at, held::Held { record, msg });
            return Vec::new();
        }
        state.held.remove(&at);
        Self::message_op(state, at, message.msg, record, false)
            .into_iter()
            .collect()
    }

    /// A message acknowledged: nothing if it was still held back, else its deletion.
    fn done(state: &mut State, (incarnation, seq): (u64, u64), msg: &Arc<Message>) -> Vec<Op> {
        let id = Self::body_id_of(state, msg);
        Self::release_body(state, msg);
        if state.held.remove(&(incarnation, seq)).is_some() {
            if let Some(id) = id {
                state.origins.acknowledged_unwritten(incarnation, &id);
            }
            return Vec::new();
        }
        // Acknowledged before the reader read its entry back: a replay from
        // before that entry must still know the session had it.
        let tomb = id
            .and_then(|id| state.origins.tombstone(incarnation, &id))
            .unwrap_or_default();
        vec![vec![b"D".to_vec(), num(incarnation), num(seq), tomb]]
    }

    /// A message taken back, never sent: no tombstone, so that the message, should
    /// its entry reach the stream after all, is given to the session then (here by
    /// this node's reader, `origins.rs`; by the replay or reader of a node it moved
    /// to).
    fn withdrawn(state: &mut State, (incarnation, seq): (u64, u64), msg: &Arc<Message>) -> Vec<Op> {
        Self::release_body(state, msg);
        if state.held.remove(&(incarnation, seq)).is_some() {
            return Vec::new();
        }
        vec![vec![b"D".to_vec(), num(incarnation), num(seq), Vec::new()]]
    }
}
