//! Where a stored message came from, so that a session moving to another node is
//! never given again, by the replay of the stream, a message its copy already has
//! (docs/decisions/0005, "The old node's own messages").
//!
//! A message's body id is its origin: the stream entry of a message published here
//! carries (`o`) the id of the body this node's sessions stored it under, or a fresh
//! one if none did, and a copy replayed from the stream is stored under the entry's
//! origin. A session's hash thus names the origin of every message it holds (`b:{seq}`
//! fields). A message it held and that was acknowledged before this node's reader
//! had read its entry back (so the position mark does not cover it yet) leaves a
//! tombstone (`o:{origin}`) with its deletion, removed once the reader reads the entry
//! back while the session is still here (one that moved keeps it: `adopted.rs`). A
//! copy acknowledged while still held back (never written) leaves its tombstone only
//! if the session is released before that. The replay on the node the session moves
//! to skips every entry whose origin the session names either way: whether the old
//! node handed it over with a bound, without one (Redis out of reach, a takeover
//! announcement), or died; and that node's reader does not deliver such an entry
//! to the session either, if it comes after the replay (`adopted.rs`).

use std::sync::Arc;

use rustc_hash::FxHashMap;
use statehub_broker::codec::QoS;
use statehub_broker::Message;

use super::adopted::Adopted;
use super::{key, num, Body, Inner, Op, State};

/// Most origins kept as not read back yet. Past it the oldest are forgotten: an
/// entry so far behind the reader that was never appended, or its reader is that far
/// behind (then a message acknowledged meanwhile may be replayed again if its session
/// moves before the reader catches up).
pub(crate) const MAX_UNAPPLIED: usize = 65_536;

/// This node's own messages that its sessions hold and its reader has not read back.
#[derive(Debug, Default)]
pub(super) struct Origins {
    /// Origin → when it was noted (a count), for forgetting the oldest.
    unapplied: FxHashMap<u64, u64>,
    noted: u64,
    /// Tombstones written, by origin: the sessions (incarnations) holding one.
    tombstoned: FxHashMap<u64, Vec<u64>>,
    /// Copies acknowledged while still held back (never written), by origin: the
    /// sessions (incarnations) that had them. Their tombstones are written only if
    /// such a session is handed over before the reader reads the entry back.
    quiet: FxHashMap<u64, Vec<u64>>,
    /// Copies taken back because their publisher was refused, by origin: the client
    /// ids of the sessions that had them, to be given the message by the reader if
    /// its entry reaches the stream after all ([`Inner::withdraw`]).
    withdrawn: FxHashMap<u64, Vec<Arc<str>>>,
    /// This node's QoS 1/2 messages that no session here stores (no body names
    /// them), while their entries are not read back: their origins by address, and
    /// back. So the copies of one refused to its publisher can be taken back as
    /// well ([`Inner::withdraw`]). An address is that of a message whose copies keep
    /// it alive while they may be taken back, and the next message forwarded from
    /// it replaces its entry.
    bodiless: FxHashMap<usize, u64>,
    bodiless_at: FxHashMap<u64, usize>,
    /// What the sessions that moved here held when they came.
    pub(super) adopted: Adopted,
}

/// A body id as an origin (body ids are 16 hex digits).
pub(crate) fn origin_of(id: &[u8]) -> Option<u64> {
    std::str::from_utf8(id)
        .ok()
        .and_then(|s| u64::from_str_radix(s, 16).ok())
}

/// An origin as a body id.
pub(crate) fn body_id(origin: u64) -> Vec<u8> {
    num(format_args!("{origin:016x}"))
}

impl Origins {
    fn note(&mut self, origin: u64) {
        self.noted += 1;
        self.unapplied.insert(origin, self.noted);
        if self.unapplied.len() > MAX_UNAPPLIED {
            let keep_after = self.noted.saturating_sub(MAX_UNAPPLIED as u64 / 2);
            self.unapplied.retain(|_, n| *n > keep_after);
            let unapplied = &self.unapplied;
            self.tombstoned.retain(|o, _| unapplied.contains_key(o));
            self.quiet.retain(|o, _| unapplied.contains_key(o));
            self.withdrawn.retain(|o, _| unapplied.contains_key(o));
            self.bodiless_at.retain(|o, _| unapplied.contains_key(o));
            self.bodiless.retain(|_, o| unapplied.contains_key(o));
        }
    }

    /// The message at `address`, which no session here stores, is forwarded under
    /// `origin`; `noted`: it may be taken back (QoS 1/2), so its origin is kept until
    /// its entry is read back.
    fn forwarded_bodiless(&mut self, address: usize, origin: u64, noted: bool) {
        if let Some(old) = self.bodiless.remove(&address) {
            self.bodiless_at.remove(&old);
        }
        if noted {
            self.note(origin);
            self.bodiless.insert(address, origin);
            self.bodiless_at.insert(origin, address);
        }
    }

    /// This node's reader read `origin`'s entry back.
    fn read_back(&mut self, origin: u64) {
        self.unapplied.remove(&origin);
        self.quiet.remove(&origin);
        if let Some(address) = self.bodiless_at.remove(&origin) {
            self.bodiless.remove(&address);
        }
    }

    /// Session `incarnation`'s copy of the message with body `id` was acknowledged
    /// while still held back: nothing of it was written, and nothing is unless the
    /// session is handed over before the reader reads the entry back
    /// ([`Origins::quiet_tombstones`]).
    pub(super) fn acknowledged_unwritten(&mut self, incarnation: u64, id: &[u8]) {
        if let Some(origin) = origin_of(id).filter(|o| self.unapplied.contains_key(o)) {
            self.quiet.entry(origin).or_default().push(incarnation);
        }
    }

    /// The tombstones of session `incarnation`'s copies acknowledged unwritten, as
    /// changes to write before it is released (without them the next node would
    /// replay those messages, or its reader deliver them, again).
    pub(super) fn quiet_tombstones(&mut self, incarnation: u64) -> Vec<Op> {
        if self.quiet.is_empty() {
            return Vec::new();
        }
        let mut ops = Vec::new();
        self.quiet.retain(|origin, incarnations| {
            let before = incarnations.len();
            incarnations.retain(|i| *i != incarnation);
            if incarnations.len() < before {
                ops.push(vec![
                    b"D".to_vec(),
                    num(incarnation),
                    num(0),
                    body_id(*origin),
                ]);
            }
            !incarnations.is_empty()
        });
        ops
    }

    /// The tombstone to leave in session `incarnation` when its copy of the message
    /// with body `id` goes, if the reader has not read that message's entry back.
    /// Also if the session moved here holding that message: the node it moves to
    /// next must know it had it too (that tombstone stays until the session is
    /// claimed or ends).
    pub(super) fn tombstone(&mut self, incarnation: u64, id: &[u8]) -> Option<Vec<u8>> {
        let origin = origin_of(id)?;
        if self.unapplied.contains_key(&origin) {
            self.tombstoned.entry(origin).or_default().push(incarnation);
            return Some(id.to_vec());
        }
        self.adopted.held(origin, incarnation).then(|| id.to_vec())
    }
}

impl Inner {
    /// The origin of `msg`, published here and about to be appended to the stream:
    /// the id of the body this node's sessions store it under, or a fresh one.
    pub(crate) fn origin(&self, msg: &Message) -> Vec<u8> {
        let k = msg as *const Message as usize;
        let mut state = self.state.lock();
        match state.bodies.get(&k).map(|b| b.id.clone()) {
            Some(id) => {
                if let Some(origin) = origin_of(&id) {
                    state.origins.note(origin);
                }
                id
            }
            None => {
                let origin = rand::random();
                let noted = msg.qos != QoS::AtMostOnce;
                state.origins.forwarded_bodiless(k, origin, noted);
                body_id(origin)
            }
        }
    }

    /// The copies that `clients`' sessions hold of `msg`, published here, are taken
    /// back because its publisher was refused: true if this node's reader has not
    /// read its entry back yet, and will then give it to those sessions (if it ever
    /// comes); false if it did (the copies must go: no one else will give it).
    pub(crate) fn withdraw(&self, msg: &Message, clients: &[Arc<str>]) -> bool {
        let k = msg as *const Message as usize;
        let mut state = self.state.lock();
        let origin = match state.bodies.get(&k) {
            Some(b) => origin_of(&b.id),
            None => state.origins.bodiless.get(&k).copied(),
        };
        let Some(origin) = origin.filter(|o| state.origins.unapplied.contains_key(o)) else {
            return false;
        };
        let holders = state.origins.withdrawn.entry(origin).or_default();
        holders.extend(clients.iter().cloned());
        true
    }

    /// This node's reader read back its own entries with these origins (in the
    /// group that marks its position past them): their tombstones can go. Returns
    /// the client ids whose copies of these messages were taken back, by origin
    /// ([`Inner::withdraw`]): the reader gives them the message now.
    pub(crate) fn read_back(&self, origins: &[u64]) -> Vec<(u64, Vec<Arc<str>>)> {
        if origins.is_empty() {
            return Vec::new();
        }
        let mut state = self.state.lock();
        let mut ops: Vec<Op> = Vec::new();
        let mut withdrawn = Vec::new();
        for origin in origins {
            state.origins.read_back(*origin);
            if let Some(clients) = state.origins.withdrawn.remove(origin) {
                withdrawn.push((*origin, clients));
            }
            if let Some(incarnations) = state.origins.tombstoned.remove(origin) {
                ops.extend(
                    incarnations
                        .into_iter()
                        .map(|inc| vec![b"X".to_vec(), num(inc), body_id(*origin)]),
                );
            }
        }
        self.push(&mut state, ops);
        withdrawn
    }

    /// A copy about to be replayed into a session moved here: stored under the
    /// origin `id` of its stream entry. `own`: an entry of this node that its reader
    /// has not read yet.
    pub(crate) fn name(&self, msg: &Arc<Message>, id: &[u8], own: bool) {
        let mut state = self.state.lock();
        if own {
            if let Some(origin) = origin_of(id) {
                state.origins.note(origin);
            }
        }
        state.bodies.entry(key(msg)).or_insert_with(|| Body {
            id: id.to_vec(),
            refs: 0,
            sent: false,
            msg: msg.clone(),
        });
    }

    /// The copy [`Inner::name`] named was not stored (no subscription matched it).
    pub(crate) fn unname(&self, msg: &Arc<Message>) {
        let mut state = self.state.lock();
        if state.bodies.get(&key(msg)).is_some_and(|b| b.refs == 0) {
            state.bodies.remove(&key(msg));
        }
    }

    /// The body id `msg` is stored under here, if any.
    pub(super) fn body_id_of(state: &State, msg: &Arc<Message>) -> Option<Vec<u8>> {
        state.bodies.get(&key(msg)).map(|b| b.id.clone())
    }
}
