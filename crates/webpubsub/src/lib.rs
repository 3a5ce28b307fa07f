//! An Azure Web PubSub-compatible WebSocket service, for the official client SDKs.
//!
//! What lives where, from the wire inwards:
//! - `ws`: the client endpoint's router, the handshake (token, subprotocol, recovery).
//! - `rest`: the REST API the server SDKs call (`/api/hubs/{hub}/…`, `/api/health`);
//!   `filter`: its OData `filter` language.
//! - `connection`: one socket's reader and writer tasks.
//! - `dispatch`: what each client request does (acks, permissions, publish), no I/O,
//!   as `effects` the connection carries out.
//! - `protocol`: frame formats (JSON and protobuf subprotocols, raw), no I/O.
//! - `upstream`: the application server's webhooks (CloudEvents `connect`,
//!   `connected`, `disconnected`, user events) per hub settings.
//! - `jwt`, `token` and `permissions`: access tokens (one HS256 validator for
//!   client and REST tokens) and what their roles allow.
//! - `config`: keys, limits and hub settings (statehub's `[webpubsub]` table).
//! - `hub`: hubs, groups, users, sessions, client streams to groups (`streamStart`,
//!   `streamData`, `streamEnd`), and (in `hub::admin`) what the REST API does to
//!   them; `reliable`: the reliable-session bookkeeping (sequence ids, the replay
//!   buffer, processed ackIds); `outbox`: the bounded per-socket send queue;
//!   `stats`: counters of what the limits did.
//!
//! Modules are private; what the binary and clients need is re-exported here.
//!
//! Build it with [`WebPubSub::new`] from a [`Config`], serve [`router`] (the client
//! endpoint and the REST API), and call [`WebPubSub::shutdown`] to stop.

#![warn(unreachable_pub)]

mod admin;
mod cluster;
mod config;
mod connection;
mod dispatch;
mod effects;
mod filter;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod hub;
mod jwt;
mod mirror;
mod outbox;
mod permissions;
mod protocol;
mod reliable;
mod rest;
mod stats;
mod token;
mod upstream;
mod ws;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use admin::{ConnectionSummary, GroupSummary, HubSummary, HubView, ViewFrom};
pub use cluster::{Cluster, ClusterError, Mirrored, Taken, Written};
pub use config::hubs::{EventHandler, HubSettings, SystemEvent};
pub use config::{Config, ConfigError, Limits, MIN_ACCESS_KEY_BYTES};
use hub::Hub;
pub use mirror::{ClaimError, MirroredStream, Provenance, Restored, SessionWrite};
/// The protobuf subprotocols' messages (`webpubsub.client.proto`), for clients.
pub use protocol::proto;
pub use stats::Counters;
pub use token::{issue_client_token, issue_token, ClientClaims};
use upstream::events::HubEvents;
use upstream::Upstream;

/// The service state shared by every connection; cheap to clone.
#[derive(Debug, Clone)]
pub struct WebPubSub {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    hubs: Mutex<HashMap<String, Arc<Hub>>>,
    /// Only when some hub has event handlers.
    upstream: Option<Upstream>,
    shutdown: CancellationToken,
    connections: TaskTracker,
    stats: Arc<stats::Stats>,
    /// The other nodes, once [`WebPubSub::join_cluster`] was called.
    cluster: std::sync::OnceLock<Arc<dyn Cluster>>,
    /// Recoveries of sessions claimed from other nodes, until the reader restores them.
    waiting: mirror::Waiting,
}

impl WebPubSub {
    /// A service with no hubs yet; hubs appear when first used.
    pub fn new(config: Config) -> Self {
        let upstream = config
            .hubs
            .values()
            .any(|h| !h.event_handlers.is_empty())
            .then(|| Upstream::new(&config));
        Self {
            inner: Arc::new(Inner {
                config,
                hubs: Mutex::new(HashMap::new()),
                upstream,
                shutdown: CancellationToken::new(),
                connections: TaskTracker::new(),
                stats: Arc::default(),
                cluster: std::sync::OnceLock::new(),
                waiting: Mutex::default(),
            }),
        }
    }

    /// Spans the service over the nodes of `cluster` (see `cluster.rs`). Call it once,
    /// before any hub is used; a second cluster is refused (`false`).
    pub fn join_cluster(&self, cluster: Arc<dyn Cluster>) -> bool {
        self.inner.cluster.set(cluster).is_ok()
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The hub of this name (case-insensitive, as the service's hub names are), created
    /// on first use with its upstream handlers.
    pub(crate) fn hub(&self, name: &str) -> Arc<Hub> {
        let key = name.to_ascii_lowercase();
        let mut hubs = self
            .inner
            .hubs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        hubs.entry(key.clone())
            .or_insert_with(|| {
                let mut hub = Hub::new(&key, self.inner.config.limits.clone())
                    .with_shutdown(self.inner.shutdown.clone())
                    .with_stats(Arc::clone(&self.inner.stats));
                if let Some(events) = self.hub_events(&key) {
                    hub = hub.with_events(Arc::new(events));
                }
                if let Some(cluster) = self.inner.cluster.get() {
                    hub = hub.with_cluster(Arc::clone(cluster));
                }
                hub::shared(hub)
            })
            .clone()
    }

    /// The hub of this name if it exists (a request not yet authenticated must not
    /// create hubs).
    pub(crate) fn existing_hub(&self, name: &str) -> Option<Arc<Hub>> {
        self.inner
            .hubs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&name.to_ascii_lowercase())
            .cloned()
    }

    /// The settings of a hub.
    pub(crate) fn hub_settings(&self, name: &str) -> HubSettings {
        self.inner.config.hub_settings(name)
    }

    /// The hub's upstream handlers, when it has any.
    pub(crate) fn hub_events(&self, name: &str) -> Option<HubEvents> {
        let settings = self.hub_settings(name);
        if settings.event_handlers.is_empty() {
            return None;
        }
        let upstream = self.inner.upstream.clone()?;
        Some(HubEvents::new(upstream, settings))
    }

    /// What the service did since it started (traffic, acks, recoveries, upstream
    /// calls, what the per-connection limits did) and what it holds now.
    pub fn counters(&self) -> Counters {
        let mut c = self.inner.stats.counters();
        c.connections = self.inner.connections.len() as u64;
        let hubs = self.hubs_now();
        c.hubs = hubs.len() as u64;
        for hub in hubs {
            let (sessions, groups) = hub.sizes();
            c.sessions += sessions as u64;
            c.groups += groups as u64;
        }
        if let Some(upstream) = &self.inner.upstream {
            upstream.count_into(&mut c);
        }
        c
    }

    /// The hubs as they are now (the lock is released before the caller walks them).
    pub(crate) fn hubs_now(&self) -> Vec<Arc<Hub>> {
        self.inner
            .hubs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Whether the service spans several nodes.
    pub(crate) fn in_cluster(&self) -> bool {
        self.inner.cluster.get().is_some()
    }

    /// Whether shutdown has begun (new clients are refused).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    /// Runs a connection task so that [`WebPubSub::shutdown`] waits for it.
    pub(crate) fn track<F>(&self, task: F) -> tokio_util::task::task_tracker::TrackedFuture<F>
    where
        F: std::future::Future,
    {
        self.inner.connections.track_future(task)
    }

    /// Shuts the service down: new clients are refused, every session is closed (its
    /// client gets `disconnected` and a close frame: 1001, or 1008 on reliable
    /// subprotocols since sessions do not outlive the process), and it waits up to
    /// `grace` for the sockets to close and queued upstream events to be posted. In a
    /// cluster, reliable sessions are handed to the other nodes instead (see
    /// [`WebPubSub::hand_over_sessions`]).
    pub async fn shutdown(&self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        self.inner.shutdown.cancel();
        let cluster = self.inner.cluster.get().cloned();
        if let Some(cluster) = &cluster {
            self.hand_over_sessions(cluster, deadline).await;
        }
        let hubs = self.hubs_now();
        for hub in hubs {
            hub.shutdown("The server is shutting down");
        }
        self.inner.connections.close();
        if tokio::time::timeout_at(deadline, self.inner.connections.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "{} web pubsub connections still open after the shutdown grace",
                self.inner.connections.len()
            );
        }
        if let Some(upstream) = &self.inner.upstream {
            upstream
                .drain(deadline.saturating_duration_since(tokio::time::Instant::now()))
                .await;
        }
        if let Some(cluster) = cluster {
            cluster.stop();
        }
    }

    /// Hands this node's reliable sessions to the other nodes: it stops applying their
    /// operations (its sessions' next nodes replay what it did not apply), forgets its
    /// mirrored sessions without ending them, writes what their mirror still lacks,
    /// then closes their sockets with 1012, on which the clients recover them
    /// elsewhere (the same connection id, every message once).
    async fn hand_over_sessions(&self, cluster: &Arc<dyn Cluster>, deadline: tokio::time::Instant) {
        let stopping = Arc::clone(cluster);
        let _ = tokio::task::spawn_blocking(move || stopping.stop_reading()).await;
        let released: Vec<_> = (self.hubs_now().iter())
            .flat_map(|hub| hub.release_mirrored())
            .collect();
        let within = deadline.saturating_duration_since(tokio::time::Instant::now());
        let flushing = Arc::clone(cluster);
        let flushed = tokio::task::spawn_blocking(move || flushing.flush(within)).await;
        if !matches!(flushed, Ok(true)) {
            tracing::warn!(
                sessions = released.len(),
                "web pubsub: the mirror of the sessions handed over could not all be written; their recovery elsewhere may fail"
            );
        }
        for session in &released {
            Hub::release(session);
        }
        tracing::info!(
            sessions = released.len(),
            "web pubsub: reliable sessions handed over to the other nodes"
        );
    }
}

/// Every route of the service: the client endpoint and the REST API.
pub fn router(state: WebPubSub) -> axum::Router {
    ws::router(state.clone()).merge(rest::router(state))
}
