//! The order in which this node's own sends reach its own members.
//!
//! A node delivers its own sends (a REST send, a client's `sendToGroup`, a client
//! stream's fragment or end) to its own members itself, and every other node's members
//! get them from the cluster's stream. Most sends go out here at once. But a fragment
//! (or end) of a reliable session's client stream can be fenced out by the store: when
//! another node claimed the session, the store neither publishes it nor takes its
//! state, and the client sends it again to that node, which publishes it to everyone,
//! this node's members included. So such a send reaches this node's members only once
//! the store answered that it took it ([`Taken`]); a fenced one never does.
//!
//! While one waits, every later own send of the hub waits behind it, and they go out
//! in the order they were numbered: so one publisher's messages reach the members here
//! in the order the other nodes get them, and a reliable member's frames from this
//! node's own sends stay a prefix of them in number order, which a recovery elsewhere
//! relies on (it skips the old node's own operations up to the last one its copy
//! reflects, `mirror.rs`). Sends that wait are kept with their data, at most
//! [`MAX_KEPT`] per hub; usually for one writer round trip.
//!
//! Locking: the lane's mutex is held while a send is numbered (so the queue is in
//! number order) and never while delivering; one caller at a time delivers
//! (`draining`), with the hub's send order lock held for reading, so a reader that
//! takes it for writing sees no delivery in progress. [`Hub::settled_through`] waits
//! on the lane's condition variable, notified whenever a kept send leaves the queue.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::cluster::{ClusterError, Taken};
use crate::hub::{lock, Hub};
use crate::mirror::{with_provenance, Provenance};

/// A send kept until its turn: it delivers to the hub's members.
pub(crate) type Delivery = Box<dyn FnOnce(&Hub) + Send>;

/// Own sends a hub keeps waiting for their turn: past it, a new one is refused before
/// it is numbered (as when the other nodes cannot be reached). Reached only while a
/// fragment's answer does not come (Redis out of reach after it was queued) and sends
/// only to this node's own connections go on.
pub(crate) const MAX_KEPT: usize = 10_000;

/// How long [`Hub::settled_through`] waits for the sends it names before it logs
/// and goes on.
const SETTLE_BOUND: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// The store has not answered yet.
    Waiting,
    Taken,
    Fenced,
}

struct Kept {
    id: u64,
    from: Provenance,
    fate: Fate,
    deliver: Delivery,
}

/// The hub's own sends that wait for their turn, and what wakes a caller of
/// [`Hub::settled_through`] when one leaves.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    sends: Mutex<Sends>,
    /// Notified (while `Sends::settling` is not 0) when a kept send leaves the queue.
    left: Condvar,
}

/// The kept sends, in number order.
#[derive(Default)]
struct Sends {
    queue: VecDeque<Kept>,
    /// A caller is delivering (it takes whatever is queued meanwhile).
    draining: bool,
    next_id: u64,
    /// Callers of [`Hub::settled_through`] waiting on [`Lane::left`].
    settling: usize,
}

impl std::fmt::Debug for Sends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sends")
            .field("kept", &self.queue.len())
            .field("draining", &self.draining)
            .field("settling", &self.settling)
            .finish_non_exhaustive()
    }
}

/// What numbering a send gives [`Hub::send_own`]: the caller's result, the origin its
/// frames record, and, for a send the store may fence out, what says whether it took it.
pub(crate) type Numbered<T> = (T, Provenance, Option<Taken>);

impl Hub {
    /// Numbers an own send (`number`: its broadcast, under the lane's lock) and
    /// delivers it to this node's members in number order: now (`now`) if nothing
    /// waits before it and it cannot be fenced, else later (`later` makes the owned
    /// delivery). Call it with [`Hub::sending`] held. `Err` from `number`: nothing is
    /// delivered.
    pub(crate) fn send_own<T>(
        &self,
        number: impl FnOnce() -> Result<Numbered<T>, ClusterError>,
        now: impl FnOnce(),
        later: impl FnOnce() -> Delivery,
    ) -> Result<T, ClusterError> {
        let mut lane = lock(&self.lane.sends);
        if lane.queue.len() >= MAX_KEPT {
            drop(lane);
            self.stats.kept_full(&self.name, MAX_KEPT);
            return Err(ClusterError::Backlog(MAX_KEPT));
        }
        let (out, from, taken) = number()?;
        if taken.is_none() && lane.queue.is_empty() && !lane.draining {
            lane.draining = true;
            drop(lane);
            with_provenance(from, now);
            self.drain(true);
            return Ok(out);
        }
        lane.next_id += 1;
        let id = lane.next_id;
        let fate = if taken.is_some() {
            Fate::Waiting
        } else {
            Fate::Taken
        };
        let deliver = later();
        lane.queue.push_back(Kept {
            id,
            from,
            fate,
            deliver,
        });
        drop(lane);
        if let Some(taken) = taken {
            self.await_fate(id, taken);
        }
        self.drain(false);
        Ok(out)
    }

    /// Settles kept send `id` once the store answered, and delivers what then may go.
    fn await_fate(&self, id: u64, taken: Taken) {
        let hub = self.me.upgrade();
        match (hub, tokio::runtime::Handle::try_current()) {
            (Some(hub), Ok(runtime)) => {
                runtime.spawn(async move {
                    let fate = if taken.await {
                        Fate::Taken
                    } else {
                        Fate::Fenced
                    };
                    hub.settle(id, fate);
                    let _order = hub.sending();
                    hub.drain(false);
                });
            }
            // Outside a runtime, or a hub not shared (tests): as it comes.
            _ => self.settle(id, Fate::Taken),
        }
    }

    fn settle(&self, id: u64, fate: Fate) {
        let mut lane = lock(&self.lane.sends);
        if let Some(kept) = lane.queue.iter_mut().find(|k| k.id == id) {
            kept.fate = fate;
        }
    }

    /// Delivers the kept sends whose turn came, in order, unless another caller is at
    /// it (`owner`: this caller already is).
    fn drain(&self, mut owner: bool) {
        loop {
            let kept = {
                let mut lane = lock(&self.lane.sends);
                if !owner {
                    if lane.draining {
                        return;
                    }
                    lane.draining = true;
                    owner = true;
                }
                match lane.queue.front().map(|k| k.fate) {
                    None | Some(Fate::Waiting) => {
                        lane.draining = false;
                        return;
                    }
                    Some(_) => {
                        let kept = lane.queue.pop_front();
                        if lane.settling > 0 {
                            self.lane.left.notify_all();
                        }
                        kept
                    }
                }
            };
            if let Some(k) = kept.filter(|k| k.fate == Fate::Taken) {
                with_provenance(k.from, || (k.deliver)(self));
            }
        }
    }

    /// Whether this node's own operation `seq` waits here, not yet delivered.
    pub(crate) fn keeps(&self, seq: u64) -> bool {
        let lane = lock(&self.lane.sends);
        let held = lane.queue.iter().any(|k| k.from == Provenance::Own(seq));
        held
    }

    /// Returns once every own send numbered up to `through` was delivered here (or
    /// dropped, fenced out), and no send is between its numbering and its delivery:
    /// what they produced for mirrored sessions is then queued for the mirror. The
    /// send order lock is taken once, at the end (a kept send numbered up to
    /// `through` is never added again, and one being delivered holds it for reading).
    pub(crate) fn settled_through(&self, through: u64) {
        self.settled_within(through, SETTLE_BOUND);
    }

    /// [`Hub::settled_through`], going on (logged) after `bound`.
    fn settled_within(&self, through: u64, bound: Duration) {
        let deadline = Instant::now() + bound;
        let waits = |k: &Kept| matches!(k.from, Provenance::Own(seq) if seq <= through);
        let mut lane = lock(&self.lane.sends);
        while lane.queue.iter().any(waits) {
            let now = Instant::now();
            if now >= deadline {
                tracing::warn!(
                    hub = %self.name,
                    through,
                    "web pubsub: own sends still wait for the store's answer; going on"
                );
                break;
            }
            lane.settling += 1;
            lane = (self.lane.left.wait_timeout(lane, deadline - now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            lane.settling -= 1;
        }
        drop(lane);
        drop(self.order.write());
    }
}

/// A hub shared as `Arc`, knowing itself (its kept sends are delivered from a task).
pub(crate) fn shared(hub: Hub) -> Arc<Hub> {
    Arc::new_cyclic(|me| {
        let mut hub = hub;
        hub.me = me.clone();
        hub
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::channel;

    use super::*;
    use crate::config::Limits;

    /// Far longer than any wake-up takes, even on a loaded machine.
    const BOUND: Duration = Duration::from_secs(30);
    /// What the waiter is given: a waiter that is not woken waits this long.
    const LONG: Duration = Duration::from_secs(3600);

    /// A caller of `settled_within` waits for own send 1 until the store answers
    /// `taken` for it, and returns once it answered; whether the send was delivered.
    fn settle_waits_for_the_answer(taken: bool) -> bool {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let hub = shared(Hub::new("chat", Limits::default()));
        let (fate, answer) = tokio::sync::oneshot::channel::<bool>();
        let delivered = Arc::new(AtomicBool::new(false));
        {
            let _runtime = runtime.enter();
            let _order = hub.sending();
            let answer: crate::cluster::Taken = Box::pin(async { answer.await.unwrap_or(false) });
            let flag = delivered.clone();
            let later =
                move || -> Delivery { Box::new(move |_| flag.store(true, Ordering::SeqCst)) };
            (hub.send_own(|| Ok(((), Provenance::Own(1), Some(answer))), || {}, later)).unwrap();
        }
        let (settled, done) = channel();
        let waiter = hub.clone();
        std::thread::spawn(move || {
            waiter.settled_within(1, LONG);
            let _ = settled.send(());
        });
        let deadline = Instant::now() + BOUND;
        while lock(&hub.lane.sends).settling == 0 {
            assert!(Instant::now() < deadline, "the caller never waited");
            std::thread::yield_now();
        }
        assert!(done.try_recv().is_err(), "waits for the store's answer");
        fate.send(taken).unwrap();
        done.recv_timeout(BOUND)
            .expect("woken once the send left the lane");
        delivered.load(Ordering::SeqCst)
    }

    #[test]
    fn a_settle_is_woken_once_the_send_it_waits_for_is_delivered() {
        assert!(settle_waits_for_the_answer(true), "delivered");
    }

    #[test]
    fn a_settle_is_woken_once_the_send_it_waits_for_is_fenced_out() {
        assert!(!settle_waits_for_the_answer(false), "not delivered");
    }
}
