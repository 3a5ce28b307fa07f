//! Answering only after the write is durable, in order (`--data-dir`).
//!
//! With a persistent engine the machine's outcome may start with
//! [`Effect::AwaitDurable`]: the reply and the notifications reveal writes still on
//! their way to disk. Such an outcome is *held*: queued in the outbox, under the state
//! lock, so the outbox is in the order the machine produced outcomes, with each entry's
//! sequence number raised to the one before it (sequence numbers never decrease along the
//! outbox, so releasing a prefix keeps order). The request's task then awaits its
//! sequence number outside every lock and *releases* the outbox: it publishes, in order,
//! every entry whose sequence number is now durable, whoever's it is. The publisher's
//! PUBACK follows, since the broker awaits `on_publish` before acknowledging. So:
//!
//! * a SET's reply and PUBACK, and its notifications, leave only once it is durable;
//! * a GET (or a duplicate answered from the cache) that could reveal a write still in
//!   flight waits for that write's commit, as Redis answers only after its AOF write;
//! * notifications of one key reach an observer in version order, even when two
//!   requests complete in the same group commit on different threads.
//!
//! If the store fails, entries already durable are released normally; every other
//! entry's reply becomes a 503, its notifications are dropped (logged), the response
//! cache is emptied (it may hold answers to writes that are now lost) and the store
//! answers 503 from then on, as for any engine failure.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::Arc;

use parking_lot::Mutex;
use statehub_broker::{Broker, Message};
use statehub_state_store::{Authorizer, Effect, Engine, WriteSeq};
use statehub_storage::{StorageError, Store};

use crate::{rpc, StateStoreService};

/// An outcome waiting for its writes.
#[derive(Debug)]
struct Held {
    seq: WriteSeq,
    reply: Option<Arc<Message>>,
    effects: Vec<Effect>,
}

/// The durability side of a service over a persistent engine.
#[derive(Debug)]
pub(crate) struct Durability {
    store: Store,
    outbox: Mutex<VecDeque<Held>>,
    /// Held while publishing released entries, so two releasing tasks cannot interleave.
    release: Mutex<()>,
}

/// What to do with an outcome after the state lock is dropped.
pub(crate) enum Next {
    /// Publish it now.
    Now(Option<Arc<Message>>, Vec<Effect>),
    /// It was held: await this sequence number, then release.
    Wait(WriteSeq),
}

impl Durability {
    pub(crate) fn new(store: Store) -> Self {
        Self {
            store,
            outbox: Mutex::new(VecDeque::new()),
            release: Mutex::new(()),
        }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Holds the outcome if it must wait, or if earlier ones are still held (so it cannot
    /// overtake them). Call it under the state lock.
    pub(crate) fn hold(&self, reply: Option<Arc<Message>>, effects: Vec<Effect>) -> Next {
        let own = match effects.first() {
            Some(Effect::AwaitDurable(seq)) => *seq,
            _ => 0,
        };
        let mut outbox = self.outbox.lock();
        let seq = own.max(outbox.back().map_or(0, |h| h.seq));
        if seq == 0 {
            return Next::Now(reply, effects);
        }
        outbox.push_back(Held {
            seq,
            reply,
            effects,
        });
        Next::Wait(seq)
    }
}

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// Awaits `seq`, then publishes everything released (or fails the held outcomes).
    pub(crate) async fn finish(&self, broker: &Broker, durability: &Durability, seq: WriteSeq) {
        match durability.store.ticket(seq).durable().await {
            Ok(()) => self.release(broker, durability),
            Err(error) => self.fail_held(broker, durability, &error),
        }
    }

    /// Publishes, in order, every held outcome whose writes are durable.
    fn release(&self, broker: &Broker, durability: &Durability) {
        let _order = durability.release.lock();
        let durable = durability.store.durable_seq();
        let ready: Vec<Held> = {
            let mut outbox = durability.outbox.lock();
            let n = outbox.iter().take_while(|h| h.seq <= durable).count();
            outbox.drain(..n).collect()
        };
        for held in ready {
            self.carry_out(broker, held.effects);
            if let Some(reply) = held.reply {
                broker.publish(reply);
            }
        }
    }

    /// The store failed: release what became durable, answer 503 to the rest.
    fn fail_held(&self, broker: &Broker, durability: &Durability, error: &StorageError) {
        self.fail(&format!("{error}"));
        self.release(broker, durability);
        let _order = durability.release.lock();
        let lost: Vec<Held> = durability.outbox.lock().drain(..).collect();
        for held in lost {
            let dropped = held
                .effects
                .iter()
                .filter(|e| matches!(e, Effect::Notify(_)))
                .count();
            if dropped > 0 {
                tracing::warn!(
                    dropped,
                    "notifications of writes lost to a storage failure not sent"
                );
            }
            if let Some(reply) = held.reply {
                let unavailable = rpc::fault_response(
                    reply.topic.clone(),
                    reply.properties.correlation_data.clone(),
                    &rpc::Fault::unavailable(),
                    reply.expires_at.unwrap_or_else(std::time::Instant::now),
                );
                broker.publish(Message {
                    recipient: reply.recipient.clone(),
                    ..unavailable
                });
            }
        }
    }
}
