//! What the sessions that moved here held when they came, for this node's reader
//! (docs/decisions/0005, "Origins").
//!
//! The replay into a session that moved here skips every stream entry whose origin
//! the session held or saw acknowledged. An entry of the node the session came from
//! can reach the stream only after that replay: its append timed out there and Redis
//! executed it later, or that node died with it on its way. This node's reader then
//! delivers it like any other node's message, and the session would get it twice. So
//! the origins a claimed session named are kept here while it stays, and the reader
//! delivers an entry with one of them to every matching session but those that held
//! it. Only sessions that moved here with messages have any; an entry whose origin
//! none of them holds costs the reader one lookup, and none while no such session is
//! here. While such a session stays, an acknowledgement of one of those messages
//! leaves a tombstone, so that the next node it moves to knows it too.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use statehub_broker::LogLimit;

use super::origins::{body_id, origin_of};
use super::{num, Inner, State};

/// Most origins kept for the sessions that moved here. Past it the oldest sessions'
/// are forgotten (counted, logged): a late entry of one of theirs is delivered again.
pub(crate) const MAX_ADOPTED: usize = 65_536;

/// The origins the sessions that moved here held when they came.
#[derive(Debug, Default)]
pub(super) struct Adopted {
    /// Origin → the sessions (incarnation, client id) that held it.
    by_origin: FxHashMap<u64, Vec<(u64, Arc<str>)>>,
    /// Each such session's origins.
    sessions: FxHashMap<u64, Vec<u64>>,
    /// Those sessions in the order they came, the oldest first (it may still name
    /// some forgotten since).
    order: VecDeque<u64>,
    /// How many origins are kept, over all sessions.
    len: usize,
}

impl Adopted {
    /// Session `incarnation` of `client` came holding `origins`; the origins
    /// forgotten to keep within [`MAX_ADOPTED`] (the oldest sessions', or past it in
    /// this one), by session.
    fn add(&mut self, incarnation: u64, client: &str, mut origins: Vec<u64>) -> Vec<(u64, u64)> {
        self.forget(incarnation);
        let mut forgotten: Vec<(u64, u64)> = origins
            .drain(MAX_ADOPTED.min(origins.len())..)
            .map(|o| (incarnation, o))
            .collect();
        if origins.is_empty() {
            return forgotten;
        }
        let client: Arc<str> = Arc::from(client);
        for origin in &origins {
            let holders = self.by_origin.entry(*origin).or_default();
            holders.push((incarnation, client.clone()));
        }
        self.len += origins.len();
        self.sessions.insert(incarnation, origins);
        self.order.push_back(incarnation);
        while self.len > MAX_ADOPTED {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            forgotten.extend(self.forget(oldest).into_iter().map(|o| (oldest, o)));
        }
        if self.order.len() > 2 * self.sessions.len() + 64 {
            let sessions = &self.sessions;
            self.order.retain(|i| sessions.contains_key(i));
        }
        forgotten
    }

    /// Session `incarnation` left this node or ended, or what it held is forgotten:
    /// its origins.
    pub(super) fn forget(&mut self, incarnation: u64) -> Vec<u64> {
        let Some(origins) = self.sessions.remove(&incarnation) else {
            return Vec::new();
        };
        for origin in &origins {
            if let Entry::Occupied(mut holders) = self.by_origin.entry(*origin) {
                holders.get_mut().retain(|(i, _)| *i != incarnation);
                if holders.get().is_empty() {
                    holders.remove();
                }
            }
        }
        self.len -= origins.len();
        origins
    }

    /// Whether session `incarnation` held the message of `origin` when it came.
    pub(super) fn held(&self, origin: u64, incarnation: u64) -> bool {
        self.by_origin
            .get(&origin)
            .is_some_and(|holders| holders.iter().any(|(i, _)| *i == incarnation))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Inner {
    /// Session `incarnation` of `client_id` moved here; `ids`: the body ids (origins)
    /// of the messages it held, and its tombstones. Those stay in Redis while this
    /// node keeps them: the tombstones of the ones forgotten go.
    pub(super) fn held_when_adopted<'a>(
        &self,
        incarnation: u64,
        client_id: &str,
        ids: impl Iterator<Item = &'a [u8]>,
    ) {
        let origins: Vec<u64> = ids.filter_map(origin_of).collect();
        let mut state = self.state.lock();
        let forgotten = state.origins.adopted.add(incarnation, client_id, origins);
        self.note_adopted(&state);
        if forgotten.is_empty() {
            return;
        }
        let counter = &self.counters.adopted_forgotten;
        counter.fetch_add(forgotten.len() as u64, Ordering::Relaxed);
        static LOG: LogLimit = LogLimit::per_secs(10);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                forgotten = forgotten.len(),
                left_out,
                "mqtt sessions: more than {MAX_ADOPTED} origins held by sessions that moved here; the oldest forgotten (a late message of the node one came from would reach it again)"
            );
        }
        let ops = forgotten
            .into_iter()
            .map(|(inc, origin)| vec![b"X".to_vec(), num(inc), body_id(origin)])
            .collect();
        self.push(&mut state, ops);
    }

    /// Session `incarnation` left this node or ended: what it held goes here (its
    /// tombstones stay with it in Redis, for the next node).
    pub(super) fn forget_adopted(&self, state: &mut State, incarnation: u64) {
        if !state.origins.adopted.forget(incarnation).is_empty() {
            self.note_adopted(state);
        }
    }

    /// Session `incarnation` was claimed but did not join the broker here.
    pub(super) fn not_joined(&self, incarnation: u64) {
        let mut state = self.state.lock();
        self.forget_adopted(&mut state, incarnation);
    }

    fn note_adopted(&self, state: &State) {
        let any = !state.origins.adopted.is_empty();
        self.any_adopted.store(any, Ordering::Relaxed);
    }

    /// The client ids of the sessions here that held the message of `origin` (a
    /// stream entry's `o`) when they moved here: the reader does not deliver it to
    /// them. Nothing to look up while no session that moved here held anything.
    pub(crate) fn held_by(&self, origin: &[u8]) -> Vec<Arc<str>> {
        if !self.any_adopted.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let Some(origin) = origin_of(origin) else {
            return Vec::new();
        };
        let state = self.state.lock();
        state
            .origins
            .adopted
            .by_origin
            .get(&origin)
            .map(|holders| holders.iter().map(|(_, c)| c.clone()).collect())
            .unwrap_or_default()
    }
}
