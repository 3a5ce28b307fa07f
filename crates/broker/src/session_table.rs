//! The session table: which session each client id has, and the session lifecycle
//! around it (take on CONNECT, restore from a store, expire, end).
//!
//! The map is a `DashMap` (sharded locks). A session is removed under its shard's
//! lock together with forgetting its stored form, so a new session of the same client
//! id, inserted under that lock, is always recorded after the old one's end.
//!
//! What changes which session a client id has is serialized per client id, under one
//! of [`STRIPES`] mutexes picked by the id's hash: a CONNECT's takeover (find, end or
//! resume, attach), a connection's end (detach, then end the session or start its
//! expiry clock) and an expiry (is it still idle, then end it). Two CONNECTs of one id
//! therefore take over one after the other, each closing its predecessor with 0x8E,
//! and a CONNECT never resumes a session that a connection's end or an expiry is
//! about to remove. The critical sections are short and never await; nothing in them
//! takes another stripe.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::{Mutex, MutexGuard, RwLock};
use statehub_mqtt_codec::{ByteString, ReasonCode};

use crate::config::BrokerConfig;
use crate::fabric::FabricError;
use crate::message::Message;
use crate::metrics::Gauges;
use crate::ratelimit::LogLimit;
use crate::service::BoxFuture;
use crate::session::{Session, Usage};
use crate::session_store::{SessionStore, StoredSession};
use crate::signal::Signal;
use crate::Broker;

/// The session a new connection attached to.
pub(crate) struct Taken {
    pub session: Arc<Session>,
    /// It existed before (Session Present).
    pub present: bool,
    /// A change was recorded in the session store: the CONNACK waits for it.
    pub stored: bool,
    /// The cluster was told of the connection (see `fabric.rs`): the CONNACK waits.
    pub announced: Option<BoxFuture<'static, Result<(), FabricError>>>,
}

/// How many locks serialize session changes per client id (see the module docs).
const STRIPES: usize = 256;

/// Client id → session, the store persistent sessions are kept in, and what the
/// sessions hold together against the broker-wide bounds.
#[derive(Debug)]
pub(crate) struct Sessions {
    map: DashMap<ByteString, Arc<Session>>,
    store: RwLock<Option<Arc<dyn SessionStore>>>,
    stripes: Box<[Mutex<()>]>,
    hasher: std::collections::hash_map::RandomState,
    usage: Arc<Usage>,
    /// Sessions with a Session Expiry above 0 (see [`Session::set_counted`]).
    persistent: AtomicUsize,
    max_persistent: usize,
}

impl Sessions {
    pub fn new(config: &BrokerConfig) -> Sessions {
        Sessions {
            map: DashMap::new(),
            store: RwLock::new(None),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            hasher: Default::default(),
            usage: Arc::new(Usage::new(
                config.max_total_queued_messages,
                config.max_total_queued_bytes,
            )),
            persistent: AtomicUsize::new(0),
            max_persistent: config.max_persistent_sessions,
        }
    }

    /// (messages, bytes) queued across every session.
    pub fn usage(&self) -> (usize, usize) {
        self.usage.get()
    }

    /// Counts `session` as persistent or not (under its client id's lock).
    fn count(&self, session: &Session, persistent: bool) {
        if session.set_counted(persistent) {
            if persistent {
                self.persistent.fetch_add(1, Ordering::Relaxed);
            } else {
                self.persistent.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Serializes changes of `client_id`'s session (see the module docs).
    fn lock(&self, client_id: &str) -> MutexGuard<'_, ()> {
        let stripe = self.hasher.hash_one(client_id) as usize % self.stripes.len();
        self.stripes[stripe].lock()
    }

    pub fn get(&self, client_id: &str) -> Option<Arc<Session>> {
        self.map.get(client_id).map(|s| s.clone())
    }

    pub fn insert(&self, session: Arc<Session>) {
        self.map.insert(session.client_id_bytes().clone(), session);
    }

    /// Removes `session` if the table still maps its client id to it, ending it (its
    /// stored form is forgotten under the shard lock); the filters it was subscribed
    /// to, or `None` if another session had taken its place.
    pub fn remove(&self, session: &Arc<Session>) -> Option<Vec<ByteString>> {
        let mut filters = None;
        self.map.remove_if(session.client_id_bytes(), |_, s| {
            let same = Arc::ptr_eq(s, session);
            if same {
                filters = Some(session.end());
            }
            same
        });
        filters
    }

    /// Every session (to ask their connections to close).
    pub fn for_each(&self, mut f: impl FnMut(&Arc<Session>)) {
        for s in self.map.iter() {
            f(s.value());
        }
    }

    pub fn store(&self) -> Option<Arc<dyn SessionStore>> {
        self.store.read().clone()
    }

    fn set_store(&self, store: Arc<dyn SessionStore>) {
        *self.store.write() = Some(store);
    }
}

impl Broker {
    /// Keeps persistent sessions in `store` from now on, starting from `loaded` (what
    /// it held at start-up): their subscriptions are indexed, their messages queued
    /// (to be sent with DUP set, under their old packet ids), released QoS 2 messages
    /// put back in flight, and their expiry clocks started. Call from within the
    /// runtime, before accepting connections.
    pub fn set_session_store(&self, store: Arc<dyn SessionStore>, loaded: Vec<StoredSession>) {
        self.sessions().set_store(store.clone());
        for stored in loaded {
            let expires_in = stored.expires_in;
            let usage = self.sessions().usage.clone();
            let session = Arc::new(Session::restore(stored, store.clone(), usage));
            self.sessions().count(&session, true);
            for (filter, sub) in session.subscriptions() {
                self.index_subscription(&session, &filter, sub.options, sub.identifier);
            }
            self.sessions().insert(session.clone());
            self.schedule_expiry(&session, 0, expires_in);
        }
    }

    /// Puts a session another node kept into this node's table (see
    /// [`SessionStore::fetch`]), as [`Broker::set_session_store`] does with a loaded one.
    /// False, and nothing changes, if the client id has a session here already.
    pub(crate) fn adopt_stored(&self, stored: StoredSession) -> bool {
        let Some(store) = self.session_store() else {
            return false;
        };
        let sessions = self.sessions();
        let _serialized = sessions.lock(&stored.client_id);
        if sessions.get(&stored.client_id).is_some() {
            return false;
        }
        let expires_in = stored.expires_in;
        let session = Arc::new(Session::restore(stored, store, sessions.usage.clone()));
        sessions.count(&session, true);
        for (filter, sub) in session.subscriptions() {
            self.index_subscription(&session, &filter, sub.options, sub.identifier);
        }
        sessions.insert(session.clone());
        self.schedule_expiry(&session, 0, expires_in);
        true
    }

    /// Another node asked for `client_id`'s session: a connection here is closed with
    /// 0x8E and the session leaves this node without its stored form being forgotten
    /// (the other node loads it). Its incarnation and stored messages, if it was
    /// persistent.
    pub(crate) fn hand_off_stored(
        &self,
        client_id: &str,
        still_ours: impl FnOnce() -> bool,
    ) -> Option<(u64, Vec<Arc<Message>>)> {
        let serialized = self.sessions().lock(client_id);
        let session = self.session(client_id)?;
        if still_ours() {
            return None;
        }
        let incarnation = session.stop_storing();
        let kicked = session.take_over();
        self.end_session(&session);
        drop(serialized);
        if kicked {
            self.notify_services_closed(client_id);
        }
        incarnation
    }

    /// Attaches a new connection (`generation`, woken through `signal`) to the client's
    /// session, resuming it unless `clean_start`, or to a new one. An older connection
    /// on the same client id is told to go with 0x8E. Refused with 0x97 (Quota
    /// exceeded) if it would make one persistent session more than the bound allows.
    /// With `expected` (the session was just brought from another node, or was here
    /// when the CONNECT looked), refused with 0x89 (Server busy) if it left meanwhile
    /// (another node asked for it): the client retries and finds it there, rather than
    /// starting a session that would replace it.
    pub(crate) fn take_session(
        &self,
        client_id: &ByteString,
        (clean_start, expected): (bool, bool),
        expiry: u32,
        generation: u64,
        signal: Arc<Signal>,
    ) -> Result<Taken, ReasonCode> {
        let sessions = self.sessions();
        let serialized = sessions.lock(client_id);
        let old = self.session(client_id);
        if expected && old.is_none() {
            return Err(ReasonCode::SERVER_BUSY);
        }
        // Resuming or replacing a persistent session keeps the count.
        let adds = expiry > 0 && !old.as_ref().is_some_and(|o| o.is_counted());
        if adds && sessions.persistent.load(Ordering::Relaxed) >= sessions.max_persistent {
            return Err(ReasonCode::QUOTA_EXCEEDED);
        }
        let announced = self
            .fabric()
            .map(|fabric| fabric.connected(client_id, !clean_start));
        let mut resumed = None;
        let mut kicked = false;
        if let Some(old) = old {
            kicked = old.take_over();
            if clean_start {
                self.end_session(&old);
            } else {
                resumed = Some(old);
            }
        }
        let present = resumed.is_some();
        let session = resumed.unwrap_or_else(|| {
            let usage = sessions.usage.clone();
            let session = Arc::new(Session::with_usage(client_id.clone(), expiry, usage));
            sessions.insert(session.clone());
            session
        });
        let stored = session.attach(generation, signal, expiry, self.session_store());
        sessions.count(&session, expiry > 0);
        drop(serialized);
        if kicked {
            // The old connection's teardown no longer owns the session and stays quiet;
            // services hear of its end now, before the new one can act (and outside the
            // lock: a service's callback is not ours to bound).
            self.notify_services_closed(client_id);
        }
        Ok(Taken {
            announced,
            session,
            present,
            stored,
        })
    }

    /// Another node took `client_id`'s session (see [`Broker::taken_elsewhere`]): unless
    /// `still_ours` says no, under the client id's lock, a connection here is told to go
    /// with 0x8E and the session ends. True if a session here ended.
    pub(crate) fn end_taken_session(
        &self,
        client_id: &str,
        still_ours: impl FnOnce() -> bool,
    ) -> bool {
        let serialized = self.sessions().lock(client_id);
        let Some(old) = self.session(client_id) else {
            return false;
        };
        if !still_ours() {
            return false;
        }
        let kicked = old.take_over();
        self.end_session(&old);
        drop(serialized);
        if kicked {
            self.notify_services_closed(client_id);
        }
        true
    }

    /// Counts (and logs, throttled) a CONNECT refused by the bound on persistent
    /// sessions.
    pub(crate) fn refused_persistent_session(&self, client_id: &str) {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let m = self.metrics();
        m.persistent_sessions_refused
            .fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                client = client_id,
                left_out,
                max_persistent_sessions = self.sessions().max_persistent,
                "persistent session limit reached; refusing new persistent sessions with CONNACK 0x97"
            );
        }
    }

    /// Sessions kept beyond their connection (Session Expiry above 0), connected or
    /// not.
    pub fn persistent_session_count(&self) -> usize {
        self.sessions().persistent.load(Ordering::Relaxed)
    }

    /// (messages, bytes) queued across every session, pending and in flight.
    pub fn queued_total(&self) -> (usize, usize) {
        self.sessions().usage()
    }

    /// What the broker holds now: connections, sessions, queued and retained messages.
    /// Visits every session (a scrape, not a hot path).
    pub fn gauges(&self) -> Gauges {
        let (mut online, mut offline) = (0, 0);
        self.sessions().for_each(|s| match s.is_connected() {
            true => online += 1,
            false => offline += 1,
        });
        let (queued_messages, queued_bytes) = self.queued_total();
        Gauges {
            connections: self.connection_count() as u64,
            sessions_online: online,
            sessions_offline: offline,
            sessions_persistent: self.persistent_session_count() as u64,
            queued_messages: queued_messages as u64,
            queued_bytes: queued_bytes as u64,
            retained_messages: self.retained_count() as u64,
        }
    }

    /// The session store, if one is configured.
    pub(crate) fn session_store(&self) -> Option<Arc<dyn SessionStore>> {
        self.sessions().store()
    }

    /// Whether `client_id` has a session (connected or not).
    pub fn has_session(&self, client_id: &str) -> bool {
        self.sessions().get(client_id).is_some()
    }

    /// The session of `client_id`, if it has one.
    pub(crate) fn session(&self, client_id: &str) -> Option<Arc<Session>> {
        self.sessions().get(client_id)
    }

    /// Ends a session: removes it from the table (if it is still this one) and its
    /// subscriptions from the trie. The caller holds the client id's lock.
    fn end_session(&self, session: &Arc<Session>) {
        if let Some(filters) = self.sessions().remove(session) {
            self.sessions().count(session, false);
            self.unindex_all(session.client_id(), &filters);
        }
    }

    /// Detaches connection `generation` from its session, if it still owns it, and
    /// leaves the session with `expiry`: messages that came through shared
    /// subscriptions go to another member of their group, then the session ends
    /// (expiry 0) or its expiry clock starts. True if the connection owned it.
    pub(crate) fn release_session(
        &self,
        session: &Arc<Session>,
        generation: u64,
        expiry: u32,
    ) -> bool {
        let _serialized = self.sessions().lock(session.client_id());
        if !session.detach(generation, expiry) {
            return false;
        }
        self.sessions().count(session, expiry > 0);
        self.hand_over_shared(session);
        if expiry == 0 {
            self.end_session(session);
        } else {
            let never = expiry == u32::MAX;
            let expires_in = (!never).then(|| Duration::from_secs(u64::from(expiry)));
            self.schedule_expiry(session, generation, expires_in);
        }
        true
    }

    /// Gives messages that came through shared subscriptions and were not
    /// acknowledged to another member of their group.
    fn hand_over_shared(&self, session: &Arc<Session>) {
        for d in session.take_shared() {
            let Some(via) = d.shared.clone() else {
                continue;
            };
            let (seq, msg) = (d.seq, d.msg.clone());
            if !self.reroute_shared(&d, &via, session.client_id()) {
                self.offer(session, d);
            }
            // Forgotten here only once recorded where it went (the store keeps order).
            session.forget(seq, &msg);
        }
    }

    /// Ends the session when `expires_in` passes without a new connection (`None`:
    /// it never expires). `generation` is the last connection's.
    pub(crate) fn schedule_expiry(
        &self,
        session: &Arc<Session>,
        generation: u64,
        expires_in: Option<Duration>,
    ) {
        let Some(expires_in) = expires_in else { return };
        let broker = self.clone();
        let session = session.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = broker.clock().sleep(expires_in) => {}
                () = session.ended() => return,
            }
            let _serialized = broker.sessions().lock(session.client_id());
            if session.idle_since(generation) {
                tracing::debug!(client = session.client_id(), "session expired");
                broker.end_session(&session);
            }
        });
    }
}
