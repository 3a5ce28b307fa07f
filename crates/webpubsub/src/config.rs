//! Service configuration: the access keys tokens are signed with, and the limits the
//! spec notes ask to mirror (all configurable, defaults as the real service).

use std::time::Duration;

/// Configuration of the service.
#[derive(Debug, Clone)]
pub struct Config {
    /// Access keys (primary, secondary…): a token signed with any of them is accepted.
    pub access_keys: Vec<String>,
    /// Limits.
    pub limits: Limits,
}

impl Config {
    /// A configuration with these keys and the default limits.
    pub fn new(access_keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            access_keys: access_keys.into_iter().map(Into::into).collect(),
            limits: Limits::default(),
        }
    }
}

/// Bounds on every per-connection resource.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest WebSocket frame or message accepted from a client (1 MiB).
    pub max_frame_bytes: usize,
    /// Unacknowledged messages a reliable session may hold before it is closed with
    /// 1008 and deleted (1000).
    pub max_unacked_messages: usize,
    /// Bytes of unacknowledged messages, same consequence (16 MiB).
    pub max_unacked_bytes: usize,
    /// How long a dropped reliable session is kept for recovery (60 s).
    pub session_retention: Duration,
    /// Processed `ackId`s remembered per session for `Duplicate` (1000).
    pub processed_ack_ids: usize,
    /// Frames queued for one socket's writer before it counts as a slow consumer (4096).
    pub outbound_queue_messages: usize,
    /// Bytes queued for one socket's writer, same consequence (16 MiB).
    pub outbound_queue_bytes: usize,
    /// Interval of WebSocket ping frames (20 s).
    pub ping_interval: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame_bytes: 1 << 20,
            max_unacked_messages: 1000,
            max_unacked_bytes: 16 << 20,
            session_retention: Duration::from_secs(60),
            processed_ack_ids: 1000,
            outbound_queue_messages: 4096,
            outbound_queue_bytes: 16 << 20,
            ping_interval: Duration::from_secs(20),
        }
    }
}
