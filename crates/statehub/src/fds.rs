//! File descriptors: the soft limit is raised to the hard limit at start-up (as
//! Mosquitto and nginx do; the soft limit is often 1024 while the hard limit allows far
//! more), and the connection caps that are not configured are sized from what it allows,
//! so that the process runs out of connection slots, which it answers, before it runs
//! out of descriptors, which stalls every listener.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

use crate::config::Settings;

/// Descriptors kept for everything but client connections: stdio, the runtime's
/// epoll and wake-up descriptors, the data directory's files, upstream webhook
/// connections, DNS.
pub const RESERVED: u64 = 128;
/// The most connections a listener gets by default, however high the limit.
pub const DEFAULT_MAX_CONNECTIONS: usize = 100_000;

/// The descriptor limit in force.
#[derive(Debug)]
pub struct Descriptors {
    /// The soft limit at start-up (`None`: unlimited).
    before: Option<u64>,
    /// The soft limit now.
    limit: Option<u64>,
    /// Why it could not be raised, if it could not.
    refused: Option<rustix::io::Errno>,
}

impl Descriptors {
    /// Raises the soft limit to the hard limit.
    pub fn raise() -> Descriptors {
        let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
        if current == maximum {
            return Descriptors {
                before: current,
                limit: current,
                refused: None,
            };
        }
        match setrlimit(
            Resource::Nofile,
            Rlimit {
                current: maximum,
                maximum,
            },
        ) {
            Ok(()) => Descriptors {
                before: current,
                limit: maximum,
                refused: None,
            },
            Err(e) => Descriptors {
                before: current,
                limit: current,
                refused: Some(e),
            },
        }
    }

    /// Connections one listener (MQTT or HTTP) gets by default: half of the descriptors
    /// left after [`RESERVED`], at most [`DEFAULT_MAX_CONNECTIONS`].
    pub fn per_listener(&self) -> usize {
        self.limit.map_or(DEFAULT_MAX_CONNECTIONS, |n| {
            let half = n.saturating_sub(RESERVED) / 2;
            usize::try_from(half).map_or(DEFAULT_MAX_CONNECTIONS, |h| {
                h.clamp(1, DEFAULT_MAX_CONNECTIONS)
            })
        })
    }

    /// Gives the MQTT and HTTP connection caps that the configuration leaves unset
    /// their size from the limit, and logs the limit and both caps.
    pub fn size_connections(&self, settings: &mut Settings) {
        let sized = self.per_listener();
        if !settings.mqtt_max_connections_set {
            settings.broker.max_connections = sized;
        }
        let http_configured = settings.http.max_connections.is_some();
        let http = *settings.http.max_connections.get_or_insert(sized);
        let mqtt = settings.broker.max_connections;
        let shown = |n: Option<u64>| n.map_or_else(|| "unlimited".to_owned(), |n| n.to_string());
        match (&self.refused, self.before == self.limit) {
            (Some(e), _) => tracing::warn!(
                "file descriptors: cannot raise the soft limit {} to the hard limit: {e}",
                shown(self.before)
            ),
            (None, true) => tracing::info!("file descriptors: limit {}", shown(self.limit)),
            (None, false) => tracing::info!(
                "file descriptors: soft limit raised from {} to the hard limit {}",
                shown(self.before),
                shown(self.limit)
            ),
        }
        tracing::info!(
            "connection caps: mqtt max_connections {mqtt}{}, http max_connections {http}{} \
             (unset caps get half each of the descriptors left after {RESERVED} reserved, at \
             most {DEFAULT_MAX_CONNECTIONS})",
            if settings.mqtt_max_connections_set {
                " (configured)"
            } else {
                ""
            },
            if http_configured { " (configured)" } else { "" },
        );
        let needed = (mqtt as u64)
            .saturating_add(http as u64)
            .saturating_add(RESERVED);
        if self.limit.is_some_and(|n| needed > n) {
            tracing::warn!(
                "the configured connection caps need {needed} file descriptors but the limit \
                 is {}: connections past it will fail to be accepted",
                shown(self.limit)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(limit: Option<u64>) -> Descriptors {
        Descriptors {
            before: limit,
            limit,
            refused: None,
        }
    }

    #[test]
    fn listeners_share_what_is_left_after_the_reserve() {
        assert_eq!(at(Some(1024)).per_listener(), 448);
        assert_eq!(at(Some(1 << 20)).per_listener(), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(at(None).per_listener(), DEFAULT_MAX_CONNECTIONS);
        assert_eq!(at(Some(64)).per_listener(), 1, "never zero");
    }
}
