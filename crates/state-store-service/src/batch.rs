//! A store thread's run of requests queued back to back (`offload.rs`), their engine
//! calls sent together: with `--redis`, one pipeline and one round trip for them all
//! (decision 0006, "One client's pipelined requests").
//!
//! The thread takes, in the order queued, every request it can begin
//! ([`Machine::begin`]: a SET, GET, DEL or VDEL that passed the RPC checks and is not
//! in the response cache), until one it cannot: those it began are finished together
//! ([`Machine::finish`]), answered in order, and the one it could not is handled alone
//! ([`StateStoreService::handle`]), after them. So every request takes effect, and is
//! answered, in the order its client sent it, as when each ran alone: a GET after a
//! SET of its key sees it; a KEYNOTIFY (whose quota and registration follow the
//! observations made before it) or a SCAN (pages of reads) runs once everything before
//! it has. A request whose Correlation Data repeats one begun in the run (a resend)
//! waits for that one's answer to be cached, so it is answered from the cache.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::{Instant, SystemTime};

use statehub_broker::codec::Publish;
use statehub_broker::{Broker, ClientInfo};
use statehub_state_store::{unix_ms, Machine, Pending, Request, WriteSeq};
use tokio::sync::oneshot;

use crate::cache::{CacheKey, Lookup, Vacancy};
use crate::durable::Next;
use crate::offload::Batches;
use crate::{refuse, rpc, Authorizer, Call, Engine, State, StateStoreService};

/// A request queued on its shard's thread, and where its answer goes: what its
/// connection's future waits for ([`StateStoreService::handle`]'s result).
pub(crate) struct Queued {
    pub(crate) shard: usize,
    pub(crate) broker: Broker,
    pub(crate) from: ClientInfo,
    pub(crate) publish: Publish,
    pub(crate) answer: oneshot::Sender<Option<(WriteSeq, Instant)>>,
}

/// A request begun in a run, with what its answer needs.
struct Begun {
    key: CacheKey,
    at: Vacancy,
    received: Instant,
    deadline: Instant,
}

impl<E, A> Batches<Queued> for StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    fn run_batch(&self, items: Vec<Queued>) {
        let mut rest: VecDeque<Queued> = items.into();
        while !rest.is_empty() {
            // A request alone goes the usual way (a GET without a sweep due is then a
            // plain read, not a script).
            if rest.len() > 1 && self.pipeline(&mut rest) > 0 {
                continue;
            }
            if let Some(item) = rest.pop_front() {
                let held = self.handle(item.shard, &item.broker, &item.from, &item.publish);
                let _ = item.answer.send(held);
            }
        }
    }
}

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// Begins the requests at the front of `rest` that can be begun, finishes them
    /// together and answers them in order; returns how many (none: the first must be
    /// handled alone).
    fn pipeline(&self, rest: &mut VecDeque<Queued>) -> usize {
        let Some(shard) = rest.front().map(|q| q.shard) else {
            return 0;
        };
        let mut taken: Vec<Queued> = Vec::new();
        let answers = self.shards.run(shard, |state| {
            let (mut begun, mut pending) = (Vec::new(), Vec::new());
            while let Some(item) = rest.front() {
                let Some((one, begin)) = self.begin(state, item, &begun) else {
                    break;
                };
                begun.push(one);
                pending.push(begin);
                taken.extend(rest.pop_front());
            }
            if pending.is_empty() {
                return Vec::new();
            }
            let outcomes = state.machine.finish(pending);
            outcomes
                .into_iter()
                .zip(begun)
                .zip(&taken)
                .map(|((outcome, begun), item)| self.answer(state, item, begun, outcome))
                .collect::<Vec<_>>()
        });
        let n = taken.len();
        for ((next, deadline), item) in answers.into_iter().zip(taken) {
            let held = self.dispatch(&item.broker, next);
            let _ = item.answer.send(held.map(|seq| (seq, deadline)));
        }
        n
    }

    /// Begins `item` if it can be begun (see the module docs); `None`: nothing was
    /// done, and it must be handled alone once the run before it is finished.
    fn begin(
        &self,
        state: &mut State<E, A>,
        item: &Queued,
        begun: &[Begun],
    ) -> Option<(Begun, Pending)> {
        let publish = &item.publish;
        let props = &publish.properties;
        // Turned away: handled alone, which answers it.
        let (_, user) = refuse::screen(publish).ok()?;
        let plain =
            !state.failed && !self.stalled() && Machine::<E, A>::can_begin(&publish.payload);
        if !plain {
            return None;
        }
        let key = CacheKey {
            client_id: item.from.client_id.clone(),
            correlation: props.correlation_data.clone().unwrap_or_default(),
        };
        if begun.iter().any(|one| one.key == key) {
            return None;
        }
        let received = item.broker.now();
        let Lookup::Miss(at) = state.cache.lookup(&key, received) else {
            return None;
        };
        let request = Request {
            client_id: &item.from.client_id,
            payload: publish.payload.clone(),
            timestamp: user.timestamp,
            fencing_token: user.fencing_token,
            access: item.from.access.as_deref().map(|a| a as &dyn Authorizer),
        };
        let pending = state
            .machine
            .begin(&request, unix_ms(SystemTime::now()))
            .ok()??;
        let deadline = rpc::deadline(props, received);
        let one = Begun {
            key,
            at,
            received,
            deadline,
        };
        Some((one, pending))
    }

    /// A begun request's response from its outcome, cached as
    /// [`StateStoreService::handle`] caches it; under the state lock.
    fn answer(
        &self,
        state: &mut State<E, A>,
        item: &Queued,
        begun: Begun,
        outcome: Result<statehub_state_store::Outcome, statehub_state_store::FatalError>,
    ) -> (Next, Instant) {
        let props = &item.publish.properties;
        let call = Call {
            client_id: &item.from.client_id,
            props,
            request: rpc::RequestProps::of(props),
            topic: props.response_topic.as_deref().unwrap_or_default(),
            deadline: begun.deadline,
            stalled: false,
            access: None,
        };
        let (answer, effects) = state.conclude(&call, outcome, Vec::new());
        let reply = state.record(answer, begun.at, begun.key, begun.received);
        (self.next(Some(reply), effects), begun.deadline)
    }
}
