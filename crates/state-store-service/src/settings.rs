//! The `[state_store]` table of statehub's configuration file.
//!
//! Kept apart from the core's [`Config`] because it also holds what only the MQTT shell
//! needs (the duplicate-request cache) and because it is read from TOML, so every field
//! has a default and unknown fields are an error rather than silently ignored. Bad
//! settings and a store that cannot be loaded (`OpenError`) are this crate's only errors:
//! a request the store cannot answer gets an RPC fault (see `rpc.rs`), never an `Err`.

use serde::Deserialize;
use statehub_state_store::Config;

/// Settings of the state store service. The limits are those of the core's [`Config`]
/// (see its docs); each, when hit, is refused with `the quota has been exceeded`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Node id of every version the store issues (`state-store`, as the real one).
    pub node_id: String,
    /// Most keys held; a SET adding one more gets `the quota has been exceeded`.
    pub max_keys: u64,
    /// Most bytes (keys plus values) held.
    pub max_bytes: u64,
    /// Longest key a SET stores or a KEYNOTIFY observes.
    pub max_key_bytes: usize,
    /// Longest value a SET stores.
    pub max_value_bytes: usize,
    /// Most keys one client may observe at once.
    pub max_observations_per_client: usize,
    /// Most observations of all clients together.
    pub max_observations: usize,
    /// Most bytes of observed keys, summed over all observations.
    pub max_observed_key_bytes: u64,
    /// How far ahead of the server clock `__ts` and `__ft` may be, in milliseconds.
    pub max_skew_ms: u64,
    /// Most keys visited per SCAN request.
    pub scan_count: usize,
    /// Longest SCAN pattern.
    pub max_pattern_bytes: usize,
    /// Matching work per SCAN request, in key bytes × pattern words.
    pub scan_work: u64,
    /// Most bytes of keys in one SCAN response.
    pub scan_page_bytes: usize,
    /// Answered responses remembered to answer QoS 1 redeliveries without running them
    /// twice (0 turns the cache off). Responses still on their way to their requester
    /// (queued or unacknowledged) are kept beyond this bound, up to
    /// `response_cache_in_flight`: their requests are the ones a client resends after a
    /// reconnect. Small by default because every request under load evicts one entry,
    /// and a large cache makes that eviction miss the CPU caches.
    pub response_cache_entries: usize,
    /// Most responses remembered in all, those still on their way included (at least
    /// `response_cache_entries`).
    pub response_cache_in_flight: usize,
}

impl Default for Settings {
    fn default() -> Self {
        let core = Config::default();
        Self {
            node_id: core.node_id,
            max_keys: core.max_keys,
            max_bytes: core.max_bytes,
            max_key_bytes: core.max_key_bytes,
            max_value_bytes: core.max_value_bytes,
            max_observations_per_client: core.max_observations_per_client,
            max_observations: core.max_observations,
            max_observed_key_bytes: core.max_observed_key_bytes,
            max_skew_ms: core.max_skew_ms,
            scan_count: core.scan_count,
            max_pattern_bytes: core.max_pattern_bytes,
            scan_work: core.scan_work,
            scan_page_bytes: core.scan_page_bytes,
            response_cache_entries: 1_000,
            response_cache_in_flight: 20_000,
        }
    }
}

impl Settings {
    /// Checks the settings and returns the core's configuration.
    pub fn machine_config(&self) -> Result<Config, SettingsError> {
        if self.node_id.is_empty() || self.node_id.contains(':') {
            return Err(SettingsError::NodeId(self.node_id.clone()));
        }
        if self.scan_count == 0 || self.scan_work == 0 || self.scan_page_bytes == 0 {
            return Err(SettingsError::ScanPage);
        }
        Ok(Config {
            node_id: self.node_id.clone(),
            max_keys: self.max_keys,
            max_bytes: self.max_bytes,
            max_key_bytes: self.max_key_bytes,
            max_value_bytes: self.max_value_bytes,
            max_observations_per_client: self.max_observations_per_client,
            max_observations: self.max_observations,
            max_observed_key_bytes: self.max_observed_key_bytes,
            max_skew_ms: self.max_skew_ms,
            scan_count: self.scan_count,
            max_pattern_bytes: self.max_pattern_bytes,
            scan_work: self.scan_work,
            scan_page_bytes: self.scan_page_bytes,
        })
    }
}

/// The `[state_store]` settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// Versions are `{wall}:{counter}:{node}`: a node id with ':' would be unparsable.
    #[error("state store node id {0:?} must be non-empty and contain no ':'")]
    NodeId(String),
    /// A SCAN page must be allowed to visit at least one key or it never ends.
    #[error("state store scan_count, scan_work and scan_page_bytes must be at least 1")]
    ScanPage,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_core() {
        let config = Settings::default().machine_config().unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn node_id_with_colon_is_refused() {
        let settings = Settings {
            node_id: "a:b".into(),
            ..Settings::default()
        };
        assert!(matches!(
            settings.machine_config(),
            Err(SettingsError::NodeId(_))
        ));
    }
}
