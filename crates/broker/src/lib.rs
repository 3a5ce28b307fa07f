//! statehub's MQTT broker core.
//!
//! * [`Broker`] (`broker.rs`): shared state and the publish path (routing into
//!   session queues, retained messages, built-in services).
//! * `session/`: what survives a connection: subscriptions, queued and in-flight
//!   messages, packet ids, expiry; `session_table.rs`: client id → session, and the
//!   session lifecycle (take over, restore, expire, end); `signal.rs`: what wakes a
//!   connection task.
//! * `trie.rs`: the subscription index, including shared-subscription groups;
//!   `retained.rs`: the retained messages, indexed by topic level.
//! * `connection/`: one task per client: handshake, inbound packets, outbound
//!   flow control, teardown (wills, session expiry).
//! * [`MqttListener`] (`server.rs`): accept loop and graceful shutdown;
//!   `pending.rs`: the bounds on connections that have not sent CONNECT yet;
//!   [`WebSocketEndpoint`] (`websocket.rs`): MQTT over WebSocket on a socket the
//!   binary's HTTP server upgraded; `transport/`: what a connection reads and writes.
//! * [`Service`] (`service.rs`) and [`Authenticator`] (`auth.rs`): the hooks other
//!   layers (the state store, security) plug into; `authz.rs`: the authorization rules
//!   ([`Broker::set_policy`]) and each connection's grants; [`RetainStore`]
//!   (`retain_store.rs`) and [`SessionStore`] (`session_store.rs`): the durability hooks
//!   `statehub-broker-durable` implements; [`Clock`] (`clock.rs`): the time the broker
//!   reads, which tests move by hand; [`Fabric`] (`fabric.rs`): the seam through which
//!   nodes on one shared medium (`statehub-broker-redis`) act as one broker.
//!
//! See ARCHITECTURE.md at the repository root for the journey of one PUBLISH.

mod admin;
mod auth;
mod authz;
mod broker;
mod clock;
mod config;
mod connection;
mod fabric;
mod levels;
mod message;
mod metrics;
mod pending;
mod rate;
mod ratelimit;
pub mod records;
mod retain_store;
mod retained;
mod server;
mod service;
mod session;
mod session_store;
mod session_table;
mod signal;
pub mod sys;
pub mod topic;
mod transport;
mod trie;
mod websocket;

pub use admin::{SessionPage, Tap, TapError, Tapped};
pub use auth::{AllowAll, AuthDecision, Authenticator, Identity, Peer, Principal};
pub use broker::{Broker, DeliverError};
pub use clock::{Clock, ManualClock};
pub use config::{BrokerConfig, Overlap, QueueFull};
pub use fabric::{Fabric, FabricError, SharedPick, SharedPicks};
pub use message::{Message, SharedVia};
pub use metrics::{packet_type, Gauges, Metrics, PacketCounts, Refusals, PACKET_TYPES};
pub use rate::Bandwidth;
pub use ratelimit::LogLimit;
pub use retain_store::{RetainStore, RetainStoreError};
pub use server::MqttListener;
pub use service::{done, BoxFuture, ClientInfo, Service};
pub use session::{PeerInfo, SessionSnapshot, Subscription};
pub use session_store::{
    packet_id_for, Gate, QueuedRef, SessionChange, SessionStore, SessionStoreError, StoredMessage,
    StoredSession,
};
pub use statehub_mqtt_codec as codec;
pub use transport::tls::TlsSource;
pub use websocket::{WebSocketEndpoint, WebSocketRefusals};
