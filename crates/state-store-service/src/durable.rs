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
//!
//! A full disk is not a failure. The store retries the write until there is room; held
//! outcomes wait for it (a SET acknowledged once its write is durable, however late).
//! Meanwhile the engine refuses new client writes (503 "disk is full", answered at
//! once) and says which reads reveal a waiting write; the others are answered at once,
//! ahead of the held outcomes ([`Durability::hold`]). A request whose write waits stops
//! waiting at its deadline (its client has given up on the reply by then), so that its
//! PUBACK goes and the client's later requests, which the broker handles in order, are
//! served; its outcome stays held and the expiry task releases it once durable. When
//! the disk has room again the held outcomes are released in order and writes are taken
//! again, without a restart.
//!
//! An engine shared by several nodes ([`Engine::publishes_changes`]) uses the same
//! hold, with the node's change feed in place of the disk ([`FeedApplied`]): a write that
//! fed a change is answered once this node's feed has applied it, so its own
//! notifications reach this node's observers before the writer's reply.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::sync::Arc;

use std::time::Duration;

use parking_lot::Mutex;
use statehub_broker::{Broker, Message};
use statehub_state_store::{Authorizer, Effect, Engine, WriteSeq};
use statehub_state_store_durable::{DurableError, Progress};
use tokio::sync::{watch, Notify};

use crate::{rpc, StateStoreService};

/// The effects of two machine calls made back to back, as one outcome: one wait first
/// (for the later of the two), then the other effects in order.
pub(crate) fn merge(first: Vec<Effect>, then: Vec<Effect>) -> Vec<Effect> {
    if first.is_empty() {
        return then;
    }
    let wait = |effects: &[Effect]| match effects.first() {
        Some(Effect::AwaitDurable(seq)) => Some(*seq),
        _ => None,
    };
    let seq = wait(&first).max(wait(&then));
    let rest = first
        .into_iter()
        .chain(then)
        .filter(|e| !matches!(e, Effect::AwaitDurable(_)));
    seq.map(Effect::AwaitDurable)
        .into_iter()
        .chain(rest)
        .collect()
}

/// An outcome waiting for its writes.
#[derive(Debug)]
struct Held {
    seq: WriteSeq,
    reply: Option<Arc<Message>>,
    effects: Vec<Effect>,
}

/// How far the change feed of an engine shared by several nodes has been applied on
/// this node: the sequence numbers are the feed's ([`statehub_state_store::Change::seq`]).
#[derive(Debug)]
pub(crate) struct FeedApplied {
    applied: watch::Sender<WriteSeq>,
    /// Longest a reply waits for the feed (which may be out of reach with Redis): then
    /// it goes, and its notifications follow whenever the feed brings them.
    bound: Duration,
}

impl FeedApplied {
    pub(crate) fn new(bound: Duration) -> Self {
        Self {
            applied: watch::Sender::new(0),
            bound,
        }
    }

    /// The feed applied the change numbered `seq` (in feed order: a lower number after a
    /// higher one means the feed's numbering restarted).
    pub(crate) fn applied(&self, seq: WriteSeq) {
        self.applied.send_replace(seq);
    }

    async fn reached(&self, seq: WriteSeq) {
        let mut applied = self.applied.subscribe();
        let reached = applied.wait_for(|&applied| applied >= seq);
        if tokio::time::timeout(self.bound, reached).await.is_err() {
            tracing::debug!(
                seq,
                "the change feed did not bring this write in time; replying without waiting"
            );
            self.applied
                .send_modify(|applied| *applied = (*applied).max(seq));
        }
    }
}

/// What held outcomes wait for: the disk, or the change feed.
#[derive(Debug)]
pub(crate) enum Tracker {
    /// A persistent engine's writes becoming durable.
    Storage(Progress),
    /// An engine shared by several nodes: this node applying its change feed.
    Feed(FeedApplied),
}

impl Tracker {
    async fn durable(&self, seq: WriteSeq) -> Result<(), DurableError> {
        match self {
            Tracker::Storage(progress) => progress.durable(seq).await,
            Tracker::Feed(feed) => {
                feed.reached(seq).await;
                Ok(())
            }
        }
    }

    fn durable_seq(&self) -> WriteSeq {
        match self {
            Tracker::Storage(progress) => progress.durable_seq(),
            Tracker::Feed(feed) => *feed.applied.borrow(),
        }
    }

    /// See [`Progress::admit`].
    pub(crate) async fn admit(&self) {
        if let Tracker::Storage(progress) = self {
            progress.admit().await;
        }
    }

    /// See [`Progress::stalled`].
    pub(crate) fn stalled(&self) -> bool {
        matches!(self, Tracker::Storage(progress) if progress.stalled())
    }
}

/// The durability side of a service over a persistent engine.
#[derive(Debug)]
pub(crate) struct Durability {
    progress: Tracker,
    outbox: Mutex<VecDeque<Held>>,
    /// Held while publishing released entries, so two releasing tasks cannot interleave.
    release: Mutex<()>,
    /// The highest sequence number a request stopped waiting for at its deadline (0:
    /// none): the expiry task waits for it and releases the outbox then.
    orphaned: Mutex<WriteSeq>,
    orphan: Notify,
}

/// What to do with an outcome after the state lock is dropped.
pub(crate) enum Next {
    /// Publish it now.
    Now(Option<Arc<Message>>, Vec<Effect>),
    /// It was held: await this sequence number, then release.
    Wait(WriteSeq),
}

impl Durability {
    pub(crate) fn new(progress: Tracker) -> Self {
        Self {
            progress,
            outbox: Mutex::new(VecDeque::new()),
            release: Mutex::new(()),
            orphaned: Mutex::new(0),
            orphan: Notify::new(),
        }
    }

    pub(crate) fn progress(&self) -> &Tracker {
        &self.progress
    }

    /// A request stopped waiting for `seq`: someone else must release it.
    fn orphan(&self, seq: WriteSeq) {
        let mut orphaned = self.orphaned.lock();
        *orphaned = (*orphaned).max(seq);
        self.orphan.notify_one();
    }

    /// The next sequence number requests stopped waiting for.
    pub(crate) async fn next_orphan(&self) -> WriteSeq {
        loop {
            let seq = std::mem::take(&mut *self.orphaned.lock());
            if seq > 0 {
                return seq;
            }
            self.orphan.notified().await;
        }
    }

    /// Holds the outcome if it must wait, or if earlier ones are still held (so it cannot
    /// overtake them), but for one exception: while writes wait for disk space, an outcome
    /// that need not wait and carries no notification (a read of durable data, a write
    /// refused) goes out at once, ahead of the held ones, which may wait long.
    /// Notifications always keep their order. Call it under the state lock.
    pub(crate) fn hold(&self, reply: Option<Arc<Message>>, effects: Vec<Effect>) -> Next {
        let own = match effects.first() {
            Some(Effect::AwaitDurable(seq)) => *seq,
            _ => 0,
        };
        let notifies = || effects.iter().any(|e| matches!(e, Effect::Notify(_)));
        if own == 0 && self.progress.stalled() && !notifies() {
            return Next::Now(reply, effects);
        }
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
    /// Waits until `deadline` at most (the request's, after which nobody waits for its
    /// reply): then the request's PUBACK goes, so a write that waits for disk space holds
    /// up its client's later requests only that long, and the expiry task releases the
    /// outcome once it is durable.
    pub(crate) async fn finish(
        &self,
        broker: &Broker,
        durability: &Durability,
        seq: WriteSeq,
        deadline: Option<std::time::Instant>,
    ) {
        let durable = durability.progress.durable(seq);
        let outcome = match deadline {
            None => Some(durable.await),
            Some(at) => tokio::time::timeout_at(at.into(), durable).await.ok(),
        };
        match outcome {
            Some(Ok(())) => self.release(broker, durability),
            Some(Err(error)) => self.fail_held(broker, durability, &error),
            None => {
                tracing::debug!(
                    seq,
                    "a state store request's deadline passed while its write waits for disk space"
                );
                durability.orphan(seq);
            }
        }
    }

    /// Publishes, in order, every held outcome whose writes are durable.
    fn release(&self, broker: &Broker, durability: &Durability) {
        let _order = durability.release.lock();
        let durable = durability.progress.durable_seq();
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
    fn fail_held(&self, broker: &Broker, durability: &Durability, error: &DurableError) {
        self.fail(error);
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
