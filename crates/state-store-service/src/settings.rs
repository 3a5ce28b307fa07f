//! The `[state_store]` table of statehub's configuration file.
//!
//! The core's [`Config`] (the one statement of each limit and its default) flattened into
//! one table with what only the MQTT shell needs (the duplicate-request cache). Read from
//! TOML, so every field has a default and unknown fields are an error rather than
//! silently ignored. Bad settings and a store that cannot be loaded (`OpenError`) are this
//! crate's only errors: a request the store cannot answer gets an RPC fault (see
//! `rpc.rs`), never an `Err`.

use serde::Deserialize;
use statehub_state_store::Config;

/// Settings of the state store service: the core's [`Config`] (its limits, each refused
/// when hit with `the quota has been exceeded`; see its docs for each key and default)
/// and what only the MQTT shell needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The core's tunables, read from the same table (`max_keys`, `scan_count`...).
    #[serde(flatten)]
    pub store: Config,
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
    /// Requests (and expiry runs) waiting for each of the state store's own threads,
    /// with an engine that blocks on the network (`--redis`); past it a request is
    /// answered `__stat=503` (busy) at once. Unused by the embedded engines.
    pub network_queue: usize,
    /// With `--redis`: the state store's threads, each with its own Redis connection,
    /// making round trips at the same time (a client's requests always go to the same
    /// one). At least 1. Unused by the embedded engines.
    pub network_threads: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            store: Config::default(),
            response_cache_entries: 1_000,
            response_cache_in_flight: 20_000,
            network_queue: 4_096,
            network_threads: 8,
        }
    }
}

impl Settings {
    /// Checks the settings and returns the core's configuration.
    pub fn machine_config(&self) -> Result<Config, SettingsError> {
        let store = &self.store;
        if store.node_id.is_empty() || store.node_id.contains(':') {
            return Err(SettingsError::NodeId(store.node_id.clone()));
        }
        if store.scan_count == 0 || store.scan_work == 0 || store.scan_page_bytes == 0 {
            return Err(SettingsError::ScanPage);
        }
        Ok(store.clone())
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
    fn one_table_holds_the_core_and_the_shell() {
        let settings: Settings =
            toml::from_str("max_keys = 7\nscan_count = 3\nresponse_cache_entries = 5\n").unwrap();
        let config = settings.machine_config().unwrap();
        assert_eq!(config.max_keys, 7);
        assert_eq!(config.scan_count, 3);
        assert_eq!(config.max_bytes, Config::default().max_bytes);
        assert_eq!(settings.response_cache_entries, 5);
        assert_eq!(settings.response_cache_in_flight, 20_000);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<Settings>("max_key = 7\n").unwrap_err();
        assert!(err.to_string().contains("max_key"), "{err}");
    }

    #[test]
    fn node_id_with_colon_is_refused() {
        let mut settings = Settings::default();
        settings.store.node_id = "a:b".into();
        assert!(matches!(
            settings.machine_config(),
            Err(SettingsError::NodeId(_))
        ));
    }
}
