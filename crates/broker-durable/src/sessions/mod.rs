//! Persistent MQTT sessions on the data directory: the broker's [`SessionStore`] hook.
//!
//! One table, `mqtt-sessions`, with four kinds of record. Those of a session are keyed
//! by its incarnation (a random id per session, so a Clean Start's new session never
//! shares a key with the one it replaced, and client ids of any length fit):
//!
//! * `S` + incarnation: client id, expiry interval, whether it was disconnected and
//!   when (its expiry clock), and its subscriptions;
//! * `M` + incarnation + sequence number: a queued or in-flight message's
//!   per-subscriber fields (QoS, RETAIN, subscription ids, shared group), whether its
//!   PUBREL was sent, and the id of its body; its packet id follows from the sequence
//!   number;
//! * `B` + body id: the message itself (as the wire has it, with the time it was
//!   written), once however many sessions queue it; deleted with the last `M` record
//!   that refers to it (`bodies.rs` says why that is crash-safe);
//! * `Q` + incarnation + packet id: a QoS 2 PUBLISH received from the client, PUBREC
//!   sent, PUBREL not yet received.
//!
//! **Write-behind for queued messages.** Most messages queued for a connected session
//! are acknowledged within a round trip (a state store response, say): writing them
//! and then their deletion would double the store's work for nothing. So a queued
//! message is held in memory first; its acknowledgement cancels it without any write,
//! and it is written when anyone asks for a barrier (a publisher awaiting its PUBACK
//! asks at once, so no promised message waits), when [`STALE`] has passed, or when
//! [`MAX_HELD`] messages are held. What a crash can lose is only a message nobody was
//! promised anything about (a service's response or notification queued in the last
//! [`STALE`]); the durability contract of the hook holds (a barrier covers it).
//!
//! At start-up (`load.rs`) sessions whose expiry passed while statehub was down are
//! deleted, as are messages that expired, records of no live session and bodies no
//! record refers to. A session that was connected when statehub stopped starts its
//! expiry clock at start-up.

mod bodies;
mod load;
mod records;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use statehub_broker::{
    BoxFuture, Gate, Message, QueuedRef, SessionChange, SessionStore, SessionStoreError,
};
use statehub_storage::{Batch, StorageError, Store, Table};
use tokio::sync::watch;

use bodies::Bodies;
use records::{encode_message, encode_session, message_key, receipt_key, session_key, Queued};

/// The table of persistent sessions.
pub const SESSIONS_TABLE: &str = "mqtt-sessions";
/// How long a queued message may be held unwritten (see the module docs).
pub const STALE: Duration = Duration::from_millis(50);
/// How many queued messages may be held unwritten at once.
const MAX_HELD: usize = 4096;

/// The session table of an open store.
#[derive(Debug)]
pub struct SessionTable {
    store: Store,
    table: Table,
    /// The first change that could not be submitted; every later barrier fails with it
    /// (the store only refuses once it has failed or closed, for good).
    refused: Arc<Mutex<Option<Arc<StorageError>>>>,
    /// Held messages and open groups. Submitting happens under this lock too, so the
    /// store's order is the order of `record` calls.
    pending: Mutex<Pending>,
    /// (groups closed so far, sequence number of the last closed group's batch).
    closed: watch::Sender<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Groups open now (they overlap into one batch).
    open: u32,
    batch: Batch,
    closed: u64,
    /// Queued messages not written yet, by (incarnation, sequence number): keys the
    /// server makes, so a fast hash (every response to a persistent session is held here
    /// and removed by its PUBACK).
    held: FxHashMap<(u64, u64), Queued>,
    /// When the oldest held message was queued.
    held_since: Option<Instant>,
    /// The bodies the message records (written or held) refer to.
    bodies: Bodies,
}

impl SessionTable {
    fn new(store: &Store, table: Table, bodies: Bodies) -> SessionTable {
        SessionTable {
            store: store.clone(),
            table,
            refused: Arc::default(),
            pending: Mutex::new(Pending {
                bodies,
                ..Pending::default()
            }),
            closed: watch::Sender::new((0, 0)),
        }
    }

    /// Writes the held messages every [`STALE`], so a quiet server writes them too.
    /// Runs until dropped (abort its task before [`SessionTable::flush_all`]).
    pub async fn run_flusher(self: Arc<Self>) {
        let mut tick = tokio::time::interval(STALE);
        loop {
            tick.tick().await;
            self.flush_stale();
        }
    }

    /// Writes the held messages if the oldest has waited [`STALE`].
    pub fn flush_stale(&self) {
        let mut pending = self.pending.lock();
        if pending.held_since.is_some_and(|t| t.elapsed() >= STALE) {
            self.flush(&mut pending);
        }
    }

    /// Writes every held message now (at shutdown, before the store closes).
    pub fn flush_all(&self) {
        self.flush(&mut self.pending.lock());
    }

    /// Writes every held message (under the pending lock): into the open group's
    /// batch if there is one, so nothing overtakes a body staged there.
    fn flush(&self, pending: &mut Pending) {
        pending.held_since = None;
        if pending.held.is_empty() {
            return;
        }
        let mut held: Vec<_> = pending.held.drain().collect();
        held.sort_unstable_by_key(|(key, _)| *key);
        let mut own = Batch::new();
        let staged = {
            let Pending {
                open,
                batch: group,
                bodies,
                ..
            } = pending;
            let batch = if *open > 0 { group } else { &mut own };
            held.iter().try_for_each(|((incarnation, seq), queued)| {
                self.stage_message(batch, bodies, (*incarnation, *seq), queued.as_ref(), false)
            })
        };
        if let Err(e) = staged.and_then(|()| self.submit(own)) {
            self.refuse(e);
        }
    }

    /// Stages a message record, after its body if that is not staged yet.
    fn stage_message(
        &self,
        batch: &mut Batch,
        bodies: &mut Bodies,
        (incarnation, seq): (u64, u64),
        message: QueuedRef<'_>,
        released: bool,
    ) -> Result<(), StorageError> {
        let Some(body) = bodies.write(&self.table, batch, message.msg)? else {
            return Ok(());
        };
        let key = message_key(incarnation, seq);
        batch.put(&self.table, &key, &encode_message(message, released, body))
    }

    /// The record of a message no longer queued goes (unless it was never written), and
    /// with the last record referring to it, its body.
    fn stage_done(
        &self,
        batch: &mut Batch,
        pending: (&mut FxHashMap<(u64, u64), Queued>, &mut Bodies),
        (incarnation, seq): (u64, u64),
        msg: &Arc<Message>,
    ) -> Result<(), StorageError> {
        let (held, bodies) = pending;
        if held.remove(&(incarnation, seq)).is_none() {
            batch.delete(&self.table, &message_key(incarnation, seq))?;
        }
        bodies.release(&self.table, batch, msg)
    }

    /// Submits `batch` unless it is empty.
    fn submit(&self, batch: Batch) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.store.submit(batch).map(drop)
    }

    /// Applies one change: a queued message is held (outside a group), everything else
    /// is staged into `own`, or into the open group's batch.
    fn apply(
        &self,
        pending: &mut Pending,
        own: &mut Batch,
        change: SessionChange<'_>,
    ) -> Result<(), StorageError> {
        let Pending {
            open,
            batch: group,
            held,
            held_since,
            bodies,
            ..
        } = pending;
        let grouped = *open > 0;
        let batch = if grouped { group } else { own };
        let table = &self.table;
        match change {
            SessionChange::Message {
                incarnation,
                seq,
                message,
                released: false,
                now,
            } => {
                bodies.refer(message.msg, now);
                if grouped {
                    return self.stage_message(batch, bodies, (incarnation, seq), message, false);
                }
                held.insert((incarnation, seq), Queued::of(message));
                held_since.get_or_insert_with(Instant::now);
                Ok(())
            }
            SessionChange::Message {
                incarnation,
                seq,
                message,
                released: true,
                now,
            } => {
                held.remove(&(incarnation, seq));
                if !bodies.is_referred(message.msg) {
                    bodies.refer(message.msg, now);
                }
                self.stage_message(batch, bodies, (incarnation, seq), message, true)
            }
            SessionChange::MessageDone {
                incarnation,
                seq,
                msg,
            }
            | SessionChange::MessageWithdrawn {
                incarnation,
                seq,
                msg,
            } => self.stage_done(batch, (held, bodies), (incarnation, seq), msg),
            SessionChange::Ended {
                incarnation,
                messages,
                incoming_qos2,
            } => {
                batch.delete(table, &session_key(incarnation))?;
                for (seq, msg) in messages {
                    self.stage_done(batch, (&mut *held, &mut *bodies), (incarnation, seq), msg)?;
                }
                for packet_id in incoming_qos2 {
                    batch.delete(table, &receipt_key(incarnation, packet_id))?;
                }
                Ok(())
            }
            other => self.stage_session(batch, other),
        }
    }

    /// Stages a change to a session's own record or to its QoS 2 receipts.
    fn stage_session(
        &self,
        batch: &mut Batch,
        change: SessionChange<'_>,
    ) -> Result<(), StorageError> {
        let table = &self.table;
        match change {
            SessionChange::Saved {
                client_id,
                incarnation,
                expiry_interval,
                disconnected,
                subscriptions,
            } => {
                let value =
                    encode_session(client_id, expiry_interval, disconnected, &subscriptions);
                batch.put(table, &session_key(incarnation), &value)
            }
            SessionChange::IncomingQos2 {
                incarnation,
                packet_id,
                pending: true,
            } => batch.put(table, &receipt_key(incarnation, packet_id), &[]),
            SessionChange::IncomingQos2 {
                incarnation,
                packet_id,
                pending: false,
            } => batch.delete(table, &receipt_key(incarnation, packet_id)),
            // The message changes are staged by `apply`.
            SessionChange::Message { .. }
            | SessionChange::MessageDone { .. }
            | SessionChange::MessageWithdrawn { .. }
            | SessionChange::Ended { .. } => Ok(()),
        }
    }

    fn refuse(&self, e: StorageError) {
        let mut refused = self.refused.lock();
        if refused.is_none() {
            tracing::error!("persistent session change not stored: {e}");
            *refused = Some(Arc::new(e));
        }
    }
}

impl SessionStore for SessionTable {
    fn record(&self, change: SessionChange<'_>) {
        let mut pending = self.pending.lock();
        let mut own = Batch::new();
        let mut staged = self.apply(&mut pending, &mut own, change);
        if staged.is_ok() {
            staged = self.submit(own);
        }
        let due = pending.held_since.is_some_and(|t| t.elapsed() >= STALE);
        if pending.held.len() >= MAX_HELD || due {
            self.flush(&mut pending);
        }
        drop(pending);
        if let Err(e) = staged {
            self.refuse(e);
        }
    }

    fn begin_group(&self) {
        self.pending.lock().open += 1;
    }

    fn end_group(&self) {
        let mut pending = self.pending.lock();
        pending.open = pending.open.saturating_sub(1);
        if pending.open > 0 {
            return;
        }
        let batch = std::mem::take(&mut pending.batch);
        let seq = if batch.is_empty() {
            self.store.last_seq()
        } else {
            match self.store.submit(batch) {
                Ok(ticket) => ticket.seq(),
                Err(e) => {
                    self.refuse(e);
                    self.store.last_seq()
                }
            }
        };
        pending.closed += 1;
        self.closed.send_replace((pending.closed, seq));
    }

    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        let mut pending = self.pending.lock();
        self.flush(&mut pending);
        // While a group is open its changes are not submitted yet: wait for it to close.
        let open_group = (pending.open > 0).then(|| (pending.closed, self.closed.subscribe()));
        let last = self.store.last_seq();
        drop(pending);
        let (store, refused) = (self.store.clone(), self.refused.clone());
        Box::pin(async move {
            let seq = match open_group {
                None => last,
                Some((closed, mut rx)) => {
                    let Ok(state) = rx.wait_for(|&(n, _)| n > closed).await else {
                        return Err(SessionStoreError(Arc::new(StorageError::Closed)));
                    };
                    state.1
                }
            };
            if let Some(e) = refused.lock().clone() {
                return Err(SessionStoreError(e));
            }
            store
                .ticket(seq)
                .durable()
                .await
                .map_err(|e| SessionStoreError(Arc::new(e)))
        })
    }

    /// Opens `gate` once every change recorded so far is durable: a barrier taken now,
    /// awaited in the background. While writes wait for disk space the gate waits with
    /// them (and the subscriber's queue behind its copy). If the store failed or closed
    /// (it never writes again) the gate stays shut: the copy's record is not on disk, so
    /// after a restart its packet id may be given to another message, which a QoS 2
    /// receiver still holding the id would drop; its publisher was not acknowledged.
    fn open_when_stored(&self, gate: Arc<Gate>) {
        let stored = self.barrier();
        let opener = async move {
            match stored.await {
                Ok(()) => gate.open(),
                Err(e) => tracing::warn!("a QoS 2 copy stays undelivered, never stored: {e}"),
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(opener)),
            Err(_) => tracing::warn!("no runtime to open a gate when stored; it stays shut"),
        }
    }
}

#[cfg(test)]
mod tests;
