//! The `statestore` scenario: N MQTT 5 clients calling the Azure IoT Operations
//! state store (SET / GET) the way the Rust SDK does.
//!
//! Every request is a QoS 1 PUBLISH to [`REQUEST_TOPIC`] with Response Topic
//! `clients/<id>/services/<request topic>` (the Rust SDK's response topic, to
//! which each client subscribes at QoS 1 before sending), 16 bytes of
//! Correlation Data, Message Expiry (`--message-expiry`, 10 s by default), Content
//! Type `application/octet-stream`, and the user properties `__srcId`, `__ts` (the
//! client's HLC), `__protVer` = `1.0` and `$partition` (the client id). Clients
//! connect like the SDK, with clean start false and Session Expiry 3600 (ids are
//! unique per run; the session is ended with a Session Expiry 0 DISCONNECT).
//!
//! Phases:
//! 1. connect and subscribe every client (`--connect-timeout`);
//! 2. if GETs are measured (and not `--no-populate`): every client SETs its share
//!    of the `--keys` keys, so that the measured GETs hit; not measured;
//! 3. all clients start together; each keeps `--pipeline` requests outstanding
//!    (1: strict request/response, as an SDK caller awaiting each call), choosing
//!    GET with probability `--ratio-get` and a uniformly random key, until it has
//!    completed `--requests-per-client` requests or `--duration` has passed;
//! 4. report ops/s (total, SET, GET), latency from encoding the request PUBLISH to
//!    reading its response (per command), and every kind of error.
//!
//! A response is an error when it lacks `__stat` = `200`, when its payload is a
//! RESP error (`-...`) or not the expected reply (`+OK` for SET, a bulk string for
//! GET); a GET answered `$-1` is a miss (counted apart; an error after populating).
//! Keys are `key:` and 12 digits, values `x` repeated, like `redis-benchmark -r`.
//!
//! The scenario is split by concern: [`args`] (the CLI), [`client`] (building
//! requests: topic, properties, RESP payloads), [`response`] (checking
//! responses and PUBACKs), [`stats`] (what a client counts), [`session`] (one
//! client's connection, from CONNECT to DISCONNECT), [`phase`] (the request
//! loop of one phase), [`run`] (argument checks, connecting, starting and
//! collecting the clients) and [`summary`] (the report).

mod args;
mod client;
mod phase;
mod response;
mod run;
mod session;
mod stats;
mod summary;

pub use args::StateStoreArgs;
pub use run::run;

/// The state store's request topic.
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// Default request count when neither `--requests-per-client` nor `--duration` is given.
const DEFAULT_REQUESTS: u64 = 10_000;
/// Requests outstanding per client while populating.
const POPULATE_PIPELINE: usize = 16;
/// Bytes of a key: `key:` and 12 digits.
const KEY_LEN: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Set,
    Get,
}
