//! Service configuration: the access keys tokens are signed with, the limits the spec
//! notes ask to mirror (all configurable, defaults as the real service), and the hubs'
//! upstream event handlers.
//!
//! This is also the `[webpubsub]` table of statehub's configuration file, so every field
//! has a default and unknown fields are refused rather than silently ignored. Durations
//! are whole seconds in the file (`*_secs`).

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

pub(crate) mod hubs;

use hubs::HubSettings;

/// Configuration of the service.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Access keys (primary, secondary…): a token signed with any of them is accepted,
    /// and upstream requests are signed with each.
    pub access_keys: Vec<String>,
    /// Limits.
    pub limits: Limits,
    /// Per-hub settings by hub name (case-insensitive); `*` applies to hubs not named.
    pub hubs: HashMap<String, HubSettings>,
    /// The `WebHook-Request-Origin` sent upstream: the host upstream handlers allow
    /// (`localhost:<http port>` when statehub does not say otherwise).
    pub webhook_origin: Option<String>,
}

impl Config {
    /// A configuration with these keys and the default limits.
    pub fn new(access_keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            access_keys: access_keys.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// The settings of a hub: its own, else those of `*`, else none.
    pub fn hub_settings(&self, hub: &str) -> HubSettings {
        self.hubs
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(hub))
            .or_else(|| self.hubs.get_key_value("*"))
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }

    /// Checks what serde cannot: key lengths, templates and event names.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (i, key) in self.access_keys.iter().enumerate() {
            if key.len() < MIN_ACCESS_KEY_BYTES {
                return Err(ConfigError::ShortAccessKey {
                    position: i + 1,
                    count: self.access_keys.len(),
                    len: key.len(),
                });
            }
        }
        for (hub, settings) in &self.hubs {
            if hub != "*" && !crate::protocol::valid_hub_name(hub) {
                return Err(ConfigError::HubName(hub.clone()));
            }
            settings.validate().map_err(|reason| ConfigError::Handler {
                hub: hub.clone(),
                reason,
            })?;
        }
        if self.limits.max_frame_bytes == 0 || self.limits.outbound_queue_messages == 0 {
            return Err(ConfigError::Limits(
                "frame and queue limits must be positive",
            ));
        }
        if self.limits.max_connections_per_hub == 0 {
            return Err(ConfigError::Limits(
                "max_connections_per_hub must be positive",
            ));
        }
        if self.limits.read_buffer_bytes < 1024 || self.limits.write_buffer_bytes < 1024 {
            return Err(ConfigError::Limits(
                "read_buffer_bytes and write_buffer_bytes must be at least 1024",
            ));
        }
        Ok(())
    }
}

/// Shortest access key accepted: tokens are HMACs keyed with it, so an empty or short
/// key (a trailing comma in a key list gives an empty one) lets anyone mint tokens.
pub const MIN_ACCESS_KEY_BYTES: usize = 16;

/// Why the configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// An access key is empty or shorter than [`MIN_ACCESS_KEY_BYTES`].
    #[error(
        "access key {position} of {count} is {len} bytes long; access keys must be at least \
         {MIN_ACCESS_KEY_BYTES} bytes (an empty one usually comes from a trailing comma or an \
         empty value)"
    )]
    ShortAccessKey {
        /// Which key, from 1.
        position: usize,
        /// How many keys there are.
        count: usize,
        /// Its length in bytes.
        len: usize,
    },
    /// A `[webpubsub.hubs.<name>]` table names an invalid hub.
    #[error("invalid hub name {0:?} in [webpubsub.hubs]")]
    HubName(String),
    /// An event handler is invalid.
    #[error("invalid event handler of hub {hub:?}: {reason}")]
    Handler { hub: String, reason: String },
    /// A limit is out of range.
    #[error("invalid [webpubsub.limits]: {0}")]
    Limits(&'static str),
}

/// Bounds on every per-connection resource.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest WebSocket frame or message accepted from a client, and largest REST
    /// message body and upstream response (1 MiB).
    pub max_frame_bytes: usize,
    /// Bytes of a reliable session's replay buffer: the messages the client has not
    /// acknowledged, kept for a recovery, each counted with a small per-message
    /// overhead (16 MiB). Past it the oldest are evicted; the connection goes on, but
    /// a recovery that needs an evicted message fails with 1008 (see `reliable`).
    pub replay_buffer_bytes: usize,
    /// Messages already written to the socket are evicted from the replay buffer after
    /// this long unacknowledged (120 s; 0: no age bound). Keep it above
    /// `idle_timeout_secs`, the longest a dead connection can go unnoticed.
    #[serde(rename = "replay_max_age_secs", with = "secs")]
    pub replay_max_age: Duration,
    /// How long a dropped reliable session is kept for recovery (60 s).
    #[serde(rename = "session_retention_secs", with = "secs")]
    pub session_retention: Duration,
    /// Processed `ackId`s remembered per session for `Duplicate` (1000).
    pub processed_ack_ids: usize,
    /// Frames queued for one socket's writer before it counts as a slow consumer and
    /// is closed: 1013 on reliable subprotocols (the client may recover), 1008 and the
    /// session deleted on the others (4096).
    pub outbound_queue_messages: usize,
    /// Bytes queued for one socket's writer, same consequence (16 MiB).
    pub outbound_queue_bytes: usize,
    /// Interval of WebSocket ping frames (20 s).
    #[serde(rename = "ping_interval_secs", with = "secs")]
    pub ping_interval: Duration,
    /// A socket that sends nothing (not even a pong) for this long is dead and closed
    /// (60 s; never less than two ping intervals).
    #[serde(rename = "idle_timeout_secs", with = "secs")]
    pub idle_timeout: Duration,
    /// How long an upstream webhook may take to answer (10 s).
    #[serde(rename = "upstream_timeout_secs", with = "secs")]
    pub upstream_timeout: Duration,
    /// Fire-and-forget upstream events (`connected`, `disconnected`) waiting to be
    /// posted; past it they are dropped and logged (10 000).
    pub upstream_queue: usize,
    /// A socket's read buffer (8 KiB): allocated and zeroed for every connection from its
    /// first read, idle or not; a larger frame is read into a buffer of its own size.
    pub read_buffer_bytes: usize,
    /// Bytes a socket's writer gathers before writing them out (8 KiB); the buffer keeps
    /// its largest size while the connection lives.
    pub write_buffer_bytes: usize,
    /// Sessions a hub holds at once (live ones and reliable ones kept for recovery);
    /// a new connection past it is refused at the handshake with 429 (100 000).
    pub max_connections_per_hub: usize,
    /// Groups one connection may be in (1000): a join past it is refused, and so is a
    /// connection whose token or `connect` answer lists more.
    pub max_groups_per_connection: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1 << 20,
            replay_buffer_bytes: 16 << 20,
            replay_max_age: Duration::from_secs(120),
            session_retention: Duration::from_secs(60),
            processed_ack_ids: 1000,
            outbound_queue_messages: 4096,
            outbound_queue_bytes: 16 << 20,
            ping_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            upstream_timeout: Duration::from_secs(10),
            upstream_queue: 10_000,
            read_buffer_bytes: 8 * 1024,
            write_buffer_bytes: 8 * 1024,
            max_connections_per_hub: 100_000,
            max_groups_per_connection: 1000,
        }
    }
}

impl Limits {
    /// The idle timeout in force: at least two ping intervals, so a live client that
    /// answers every ping is never taken for dead.
    pub fn effective_idle_timeout(&self) -> Duration {
        self.idle_timeout.max(self.ping_interval * 2)
    }

    /// The replay buffer's age bound, if any.
    pub(crate) fn replay_age_bound(&self) -> Option<Duration> {
        (!self.replay_max_age.is_zero()).then_some(self.replay_max_age)
    }
}

/// Durations as whole seconds in the file.
mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_table() {
        let c: Config = toml_like(
            r#"{"access_keys":["a-key-of-16-byte","another-long-key"],"webhook_origin":"h:1",
                "limits":{"max_frame_bytes":10,"session_retention_secs":5},
                "hubs":{"Chat":{"event_handlers":[{"url_template":"http://x/{hub}/{event}",
                   "user_event_pattern":"*","system_events":["connect"]}]},
                        "*":{"allow_anonymous":true}}}"#,
        );
        assert_eq!(c.access_keys, ["a-key-of-16-byte", "another-long-key"]);
        assert_eq!(c.limits.max_frame_bytes, 10);
        assert_eq!(c.limits.session_retention, Duration::from_secs(5));
        assert_eq!(
            c.limits.ping_interval,
            Duration::from_secs(20),
            "defaults kept"
        );
        assert_eq!(c.hub_settings("chat").event_handlers.len(), 1);
        assert!(c.hub_settings("other").allow_anonymous);
        assert!(c.validate().is_ok());
        assert!(serde_json::from_str::<Config>(r#"{"nope":1}"#).is_err());
        let bad: Config = toml_like(r#"{"hubs":{"1x":{}}}"#);
        assert_eq!(bad.validate(), Err(ConfigError::HubName("1x".into())));
    }

    #[test]
    fn empty_and_short_access_keys_are_refused() {
        let keys = |k: &[&str]| Config::new(k.iter().copied()).validate();
        assert_eq!(keys(&[]), Ok(()), "no keys: the service is off");
        assert_eq!(keys(&["0123456789abcdef"]), Ok(()));
        assert_eq!(
            keys(&["0123456789abcdef", ""]),
            Err(ConfigError::ShortAccessKey {
                position: 2,
                count: 2,
                len: 0
            })
        );
        assert!(matches!(
            keys(&["0123456789abcde"]),
            Err(ConfigError::ShortAccessKey { len: 15, .. })
        ));
    }

    /// The file is TOML in the binary; serde sees the same shape through JSON here.
    fn toml_like(json: &str) -> Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn idle_timeout_covers_two_pings() {
        let l = Limits {
            idle_timeout: Duration::from_secs(10),
            ..Limits::default()
        };
        assert_eq!(l.effective_idle_timeout(), Duration::from_secs(40));
    }
}
