//! The store's tunables, each a bound on what clients can make it hold or do.
//!
//! Every limit has a default that protects a default install (a few hundred megabytes
//! at most in all) and is refused, when hit, with `the quota has been exceeded`: the one
//! refusal the SDKs map to a quota error. Set a limit to its type's maximum to lift it.
//!
//! [`Config`] is also the core of statehub's `[state_store]` table (the service flattens it
//! into its settings), so each field's name is its configuration key and a missing key
//! takes the default below.

use crate::hlc::{DEFAULT_MAX_SKEW_MS, DEFAULT_NODE_ID};

/// Tunables of the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct Config {
    /// The node id of every version issued (`state-store` by default).
    pub node_id: String,
    /// Most keys the store holds; a SET adding one more is refused. Each key costs about
    /// 350 bytes besides its bytes (1M keys of 100 B took 448 MB), so this bounds what
    /// tiny keys can take.
    pub max_keys: u64,
    /// Most bytes (sum of key and value lengths) the store holds.
    pub max_bytes: u64,
    /// Longest key a SET may store or a KEYNOTIFY observe (the engine may allow less).
    pub max_key_bytes: usize,
    /// Longest value a SET may store.
    pub max_value_bytes: usize,
    /// Most keys one client may observe at once.
    pub max_observations_per_client: usize,
    /// Most observations (client and key pairs) of all clients together.
    pub max_observations: usize,
    /// Most bytes of observed keys, summed over all observations.
    pub max_observed_key_bytes: u64,
    /// How far ahead of the server clock `__ts` and `__ft` may be, in milliseconds.
    pub max_skew_ms: u64,
    /// Most keys one SCAN request visits; a page holds the matching ones among them.
    pub scan_count: usize,
    /// Longest SCAN pattern.
    pub max_pattern_bytes: usize,
    /// Work one SCAN request may do, in key bytes × pattern words (see
    /// [`crate::glob::Pattern::words`]): a page ends, with a token to continue, once the
    /// keys it visited add up to this, even when it visited fewer than `scan_count`.
    pub scan_work: u64,
    /// A page ends, with a token to continue, once the keys it returns add up to this
    /// many bytes, so its response stays well inside an MQTT packet.
    pub scan_page_bytes: usize,
}

/// Defaults of [`Config`], named for the docs and for the shell's settings.
pub mod defaults {
    /// [`super::Config::max_keys`].
    pub const MAX_KEYS: u64 = 100_000;
    /// [`super::Config::max_bytes`]: 128 MiB.
    pub const MAX_BYTES: u64 = 128 << 20;
    /// [`super::Config::max_key_bytes`]: 16 KiB. The SDKs' tests use keys of 6,500
    /// bytes; a notification topic carries the key in hex, so a key must stay well under
    /// 32 KiB for its topic to fit in an MQTT topic name.
    pub const MAX_KEY_BYTES: usize = 16 << 10;
    /// [`super::Config::max_value_bytes`]: 1 MiB, the broker's default largest packet.
    pub const MAX_VALUE_BYTES: usize = 1 << 20;
    /// [`super::Config::max_observations_per_client`].
    pub const MAX_OBSERVATIONS_PER_CLIENT: usize = 1_000;
    /// [`super::Config::max_observations`].
    pub const MAX_OBSERVATIONS: usize = 100_000;
    /// [`super::Config::max_observed_key_bytes`]: 16 MiB.
    pub const MAX_OBSERVED_KEY_BYTES: u64 = 16 << 20;
    /// [`super::Config::scan_count`].
    pub const SCAN_COUNT: usize = 100;
    /// [`super::Config::max_pattern_bytes`]: 4 KiB.
    pub const MAX_PATTERN_BYTES: usize = 4 << 10;
    /// [`super::Config::scan_work`]: about a millisecond of matching.
    pub const SCAN_WORK: u64 = 1 << 20;
    /// [`super::Config::scan_page_bytes`]: 256 KiB.
    pub const SCAN_PAGE_BYTES: usize = 256 << 10;
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_id: DEFAULT_NODE_ID.to_owned(),
            max_keys: defaults::MAX_KEYS,
            max_bytes: defaults::MAX_BYTES,
            max_key_bytes: defaults::MAX_KEY_BYTES,
            max_value_bytes: defaults::MAX_VALUE_BYTES,
            max_observations_per_client: defaults::MAX_OBSERVATIONS_PER_CLIENT,
            max_observations: defaults::MAX_OBSERVATIONS,
            max_observed_key_bytes: defaults::MAX_OBSERVED_KEY_BYTES,
            max_skew_ms: DEFAULT_MAX_SKEW_MS,
            scan_count: defaults::SCAN_COUNT,
            max_pattern_bytes: defaults::MAX_PATTERN_BYTES,
            scan_work: defaults::SCAN_WORK,
            scan_page_bytes: defaults::SCAN_PAGE_BYTES,
        }
    }
}
