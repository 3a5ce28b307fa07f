//! Persistent MQTT sessions on the data directory: the broker's [`SessionStore`] hook.
//!
//! One table, `mqtt-sessions`, with three kinds of record, all keyed by the session's
//! incarnation (a random id per session, so a Clean Start's new session never shares
//! a key with the one it replaced, and client ids of any length fit):
//!
//! * `S` + incarnation: client id, expiry interval, whether it was disconnected and
//!   when (its expiry clock), and its subscriptions;
//! * `M` + incarnation + sequence number: a queued or in-flight message with its
//!   per-subscriber fields (QoS, RETAIN, subscription ids, shared group) and whether
//!   its PUBREL was sent; its packet id follows from the sequence number;
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
//! deleted, as are messages that expired and records of no live session. A session
//! that was connected when statehub stopped starts its expiry clock at start-up.

mod load;
mod records;

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use statehub_broker::{BoxFuture, SessionChange, SessionStore, SessionStoreError};
use statehub_storage::{Batch, StorageError, Store, Table};
use tokio::sync::watch;

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
    held: FxHashMap<(u64, u64), (Queued, Instant)>,
    /// When the oldest held message was queued.
    held_since: Option<Instant>,
}

impl SessionTable {
    fn new(store: &Store, table: Table) -> SessionTable {
        SessionTable {
            store: store.clone(),
            table,
            refused: Arc::default(),
            pending: Mutex::default(),
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

    /// Submits every held message (under the pending lock).
    fn flush(&self, pending: &mut Pending) {
        pending.held_since = None;
        if pending.held.is_empty() {
            return;
        }
        let mut held: Vec<_> = pending.held.drain().collect();
        held.sort_unstable_by_key(|(key, _)| *key);
        let mut batch = Batch::new();
        let staged = held
            .iter()
            .try_for_each(|((incarnation, seq), (queued, now))| {
                batch.put(
                    &self.table,
                    &message_key(*incarnation, *seq),
                    &encode_message(queued.as_ref(), false, *now),
                )
            });
        if let Err(e) = staged.and_then(|()| self.store.submit(batch).map(drop)) {
            self.refuse(e);
        }
    }

    /// Applies `change` to the held messages; `None` if that was all it needed.
    fn unhold<'a>(pending: &mut Pending, change: SessionChange<'a>) -> Option<SessionChange<'a>> {
        match change {
            // Acknowledged before it was written: nothing to write or delete.
            SessionChange::MessageDone { incarnation, seq }
                if pending.held.remove(&(incarnation, seq)).is_some() =>
            {
                None
            }
            SessionChange::Message {
                incarnation,
                seq,
                released: true,
                ..
            } => {
                pending.held.remove(&(incarnation, seq));
                Some(change)
            }
            SessionChange::Ended {
                incarnation,
                ref messages,
                ..
            } => {
                for seq in messages {
                    pending.held.remove(&(incarnation, *seq));
                }
                Some(change)
            }
            other => Some(other),
        }
    }

    fn stage(&self, batch: &mut Batch, change: SessionChange<'_>) -> Result<(), StorageError> {
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
                batch.put(&self.table, &session_key(incarnation), &value)
            }
            SessionChange::Ended {
                incarnation,
                messages,
                incoming_qos2,
            } => {
                batch.delete(&self.table, &session_key(incarnation))?;
                for seq in messages {
                    batch.delete(&self.table, &message_key(incarnation, seq))?;
                }
                for packet_id in incoming_qos2 {
                    batch.delete(&self.table, &receipt_key(incarnation, packet_id))?;
                }
                Ok(())
            }
            SessionChange::Message {
                incarnation,
                seq,
                message,
                released,
                now,
            } => batch.put(
                &self.table,
                &message_key(incarnation, seq),
                &encode_message(message, released, now),
            ),
            SessionChange::MessageDone { incarnation, seq } => {
                batch.delete(&self.table, &message_key(incarnation, seq))
            }
            SessionChange::IncomingQos2 {
                incarnation,
                packet_id,
                pending: true,
            } => batch.put(&self.table, &receipt_key(incarnation, packet_id), &[]),
            SessionChange::IncomingQos2 {
                incarnation,
                packet_id,
                pending: false,
            } => batch.delete(&self.table, &receipt_key(incarnation, packet_id)),
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
        let Some(change) = Self::unhold(&mut pending, change) else {
            return;
        };
        let staged = match change {
            _ if pending.open > 0 => self.stage(&mut pending.batch, change),
            SessionChange::Message {
                incarnation,
                seq,
                message,
                released: false,
                now,
            } => {
                pending
                    .held
                    .insert((incarnation, seq), (Queued::of(message), now));
                let since = *pending.held_since.get_or_insert(now);
                if pending.held.len() >= MAX_HELD || since.elapsed() >= STALE {
                    self.flush(&mut pending);
                }
                Ok(())
            }
            change => {
                let mut batch = Batch::new();
                self.stage(&mut batch, change)
                    .and_then(|()| self.store.submit(batch).map(drop))
            }
        };
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
}

#[cfg(test)]
mod tests;
