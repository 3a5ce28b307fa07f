//! An Azure Web PubSub-compatible WebSocket service, for the official client SDKs.
//!
//! What lives where, from the wire inwards:
//! - [`ws`]: the client endpoint's router, the handshake (token, subprotocol, recovery).
//! - [`rest`]: the REST API the server SDKs call (`/api/hubs/{hub}/…`, `/api/health`);
//!   [`filter`]: its OData `filter` language.
//! - [`connection`]: one socket's reader and writer tasks.
//! - [`dispatch`]: what each client request does (acks, permissions, publish), no I/O.
//! - [`protocol`]: frame formats (JSON and protobuf subprotocols, raw), no I/O.
//! - [`token`] and [`permissions`]: access tokens and what their roles allow.
//! - [`hub`]: hubs, groups, users, sessions, and (in [`hub::admin`]) what the REST API
//!   does to them; [`session`]: the reliable-session bookkeeping;
//!   [`outbox`]: the bounded per-socket send queue.
//!
//! Build it with [`WebPubSub::new`] from a [`Config`] and serve [`router`] (the client
//! endpoint and the REST API).

pub mod config;
pub mod connection;
pub mod dispatch;
pub mod filter;
pub mod hub;
pub mod outbox;
pub mod permissions;
pub mod protocol;
pub mod rest;
pub mod session;
pub mod token;
pub mod ws;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

pub use config::{Config, Limits};
pub use hub::Hub;

/// The service state shared by every connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct WebPubSub {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
}

impl WebPubSub {
    /// A service with no hubs yet; hubs appear when first used.
    pub fn new(config: Config) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                hubs: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The hub of this name (case-insensitive, as the service's hub names are), created
    /// on first use.
    pub fn hub(&self, name: &str) -> Arc<Hub> {
        let key = name.to_ascii_lowercase();
        let mut hubs = self
            .inner
            .hubs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        hubs.entry(key.clone())
            .or_insert_with(|| Arc::new(Hub::new(&key, self.inner.config.limits.clone())))
            .clone()
    }
}

/// Every route of the service: the client endpoint and the REST API.
pub fn router(state: WebPubSub) -> axum::Router {
    ws::router(state.clone()).merge(rest::router(state))
}
