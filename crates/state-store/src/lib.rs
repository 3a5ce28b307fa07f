//! The state store of statehub: the Azure IoT Operations state store protocol as pure logic.
//!
//! Nothing here performs I/O or reads a clock. The MQTT shell (`statehub-state-store-service`,
//! a built-in service of the broker) takes each request PUBLISH on [`REQUEST_TOPIC`], builds
//! a [`Request`] from its payload and user properties, calls [`Machine::handle`] with the
//! current time, publishes the returned [`Reply`] on the request's Response Topic and
//! carries out the returned [`Effect`]s (notifications, expiry timers). Keeping the core
//! pure lets the tests assert the exact bytes and effects of every command, and lets one
//! model-based test drive it with a simulated clock.
//!
//! What lives where:
//! - [`resp`]: the RESP3-like framing of requests and responses.
//! - [`command`]: a request payload turned into a typed [`Command`] (arity, options).
//! - [`hlc`]: hybrid logical clocks, the versions of keys.
//! - [`glob`]: the SCAN pattern language.
//! - [`machine`]: the state machine: commands, fencing, quotas, expiry, observers.
//! - [`notify`]: notification topics and payloads.
//! - [`value`]: a stored value, kept framed as the GET reply carries it.
//! - [`engine`]: the storage engine trait (its contract) and [`MemoryEngine`].
//! - [`authz`]: the per-key authorization hook.
//! - [`error`]: refusals (sent to the client as `-ERR`) apart from fatal errors.
//! - `conformance` (feature `conformance`): the suite every engine must pass.

pub mod authz;
pub mod command;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod engine;
pub mod error;
pub mod glob;
pub mod hlc;
pub mod machine;
pub mod notify;
pub mod resp;
pub mod value;

pub use authz::{AllowAll, Authorizer, Operation};
pub use command::{Command, SetCondition};
pub use engine::{
    Change, DelOutcome, Engine, Entry, Limits, MemoryEngine, Op, OpOutcome, ScanBatch, SetOutcome,
    SetRequest, Stats, WriteSeq,
};
pub use error::{EngineError, FatalError, Refusal};
pub use hlc::{Hlc, HlcClock, Stamp};
pub use machine::{
    Config, Counts, Effect, Machine, Notification, Outcome, Pending, Reply, Request, COMMANDS,
    RESULTS,
};
pub use notify::{notify_topic, REQUEST_TOPIC};
pub use value::Value;

/// User property carrying an HLC: the client's clock on requests, the key's version on
/// replies and notifications.
pub const TIMESTAMP_PROPERTY: &str = "__ts";
/// User property carrying a fencing token (an HLC) on requests.
pub const FENCING_TOKEN_PROPERTY: &str = "__ft";
/// User property the SDKs set to their client id on requests.
pub const SOURCE_ID_PROPERTY: &str = "__srcId";

/// Milliseconds since the Unix epoch of `time` (0 before the epoch): the time unit of
/// [`Machine`].
pub fn unix_ms(time: std::time::SystemTime) -> u64 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
