//! The session table: which session each client id has, and the session lifecycle
//! around it (take on CONNECT, restore from a store, expire, end).
//!
//! The map is a `DashMap` (sharded locks). A session is removed under its shard's
//! lock together with forgetting its stored form, so a new session of the same client
//! id, inserted under that lock, is always recorded after the old one's end.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use parking_lot::RwLock;
use statehub_mqtt_codec::ByteString;

use crate::session::Session;
use crate::session_store::{SessionStore, StoredSession};
use crate::signal::Signal;
use crate::Broker;

/// The session a new connection attached to.
#[derive(Debug)]
pub(crate) struct Taken {
    pub session: Arc<Session>,
    /// It existed before (Session Present).
    pub present: bool,
    /// A change was recorded in the session store: the CONNACK waits for it.
    pub stored: bool,
}

/// Client id → session, and the store persistent sessions are kept in.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    map: DashMap<ByteString, Arc<Session>>,
    store: RwLock<Option<Arc<dyn SessionStore>>>,
}

impl Sessions {
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
            let session = Arc::new(Session::restore(stored, store.clone()));
            for (filter, sub) in session.subscriptions() {
                self.index_subscription(&session, &filter, sub.options, sub.identifier);
            }
            self.sessions().insert(session.clone());
            self.schedule_expiry(&session, 0, expires_in);
        }
    }

    /// Attaches a new connection (`generation`, woken through `signal`) to the client's
    /// session, resuming it unless `clean_start`, or to a new one. An older connection
    /// on the same client id is told to go with 0x8E.
    pub(crate) fn take_session(
        &self,
        client_id: &ByteString,
        clean_start: bool,
        expiry: u32,
        generation: u64,
        signal: Arc<Signal>,
    ) -> Taken {
        let mut resumed = None;
        if let Some(old) = self.session(client_id) {
            if old.take_over() {
                // The old connection's teardown no longer owns the session and stays
                // quiet; services hear of its end now, before the new one can act.
                self.notify_services_closed(client_id);
            }
            if clean_start {
                self.end_session(&old);
            } else {
                resumed = Some(old);
            }
        }
        let present = resumed.is_some();
        let session = resumed.unwrap_or_else(|| {
            let session = Arc::new(Session::new(client_id.clone(), expiry));
            self.sessions().insert(session.clone());
            session
        });
        let stored = session.attach(generation, signal, expiry, self.session_store());
        Taken {
            session,
            present,
            stored,
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
    /// subscriptions from the trie.
    pub(crate) fn end_session(&self, session: &Arc<Session>) {
        if let Some(filters) = self.sessions().remove(session) {
            self.unindex_all(session.client_id(), &filters);
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
            if session.idle_since(generation) {
                tracing::debug!(client = session.client_id(), "session expired");
                broker.end_session(&session);
            }
        });
    }
}
