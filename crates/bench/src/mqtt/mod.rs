//! The `mqtt` scenario: N publishers, M subscribers, QoS 0 or 1, MQTT 5 or 3.1.1.
//!
//! Phases, each bounded in time:
//! 1. connect every subscriber and wait for every SUBACK (`--connect-timeout`);
//! 2. connect every publisher (CONNACK);
//! 3. start all publishers at once; each stops after `--messages-per-publisher`
//!    messages or `--duration` seconds (and never later than `--timeout`); a QoS 1
//!    publisher then waits up to `--drain-timeout` for its outstanding PUBACKs;
//! 4. wait until subscribers have received every expected message, or until no
//!    message arrived for `--drain-timeout` seconds;
//! 5. stop, disconnect, report.
//!
//! Every payload starts with a 20-byte header — publisher index (u32), sequence
//! number (u64) and send time (u64, ns since the process' time base), little
//! endian — so subscribers compute publish-to-receive latency and detect gaps and
//! duplicates per publisher. Publishers and subscribers live in one process, so
//! both ends read the same monotonic clock.
//!
//! The scenario is split by phase and role: [`args`] (the CLI), [`client`]
//! (connecting, subscribing, disconnecting), [`topics`] (which topics each
//! client uses), [`publisher`] and [`publisher_qos1`] (the publishing loops),
//! [`subscriber`] (the receiving loop), [`run`] (phases 1 to 4) and [`summary`]
//! (phase 5: aggregating the per-client results into the report).

mod args;
mod client;
mod publisher;
mod publisher_qos1;
mod run;
mod subscriber;
mod summary;
mod topics;

pub use args::MqttArgs;
pub use run::run;

/// Bytes of the payload header (publisher index, sequence, timestamp).
pub const HEADER_LEN: usize = 20;
/// Messages published per batch (one write syscall) at most.
const MAX_BATCH_MSGS: usize = 64;
/// Bytes per batch at most.
const MAX_BATCH_BYTES: usize = 32 * 1024;
/// Default message count when neither `--messages-per-publisher` nor `--duration` is given.
const DEFAULT_MESSAGES: u64 = 10_000;
