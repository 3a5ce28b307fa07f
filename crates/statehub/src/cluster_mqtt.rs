//! Scale-out of the broker: with `--redis`, this node's broker joins every other node on
//! that Redis (and namespace) as one MQTT broker through `statehub-broker-redis`'s
//! fabric: messages, retained messages, takeovers and shared subscriptions span nodes.

use statehub_broker::Broker;
use statehub_broker_redis::{Options, RedisFabric};
use statehub_state_store_redis::Options as ClusterOptions;

use crate::cluster::{ClusterConfig, ClusterError};

/// The broker's bounds from the `[cluster]` table.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    stream_len: u64,
    queue: usize,
}

impl Limits {
    pub fn from_file(file: &ClusterConfig) -> Result<Self, ClusterError> {
        if file.mqtt_stream_len == 0 {
            return Err(ClusterError::Invalid("mqtt_stream_len must be at least 1"));
        }
        if file.mqtt_queue == 0 {
            return Err(ClusterError::Invalid("mqtt_queue must be at least 1"));
        }
        Ok(Self {
            stream_len: file.mqtt_stream_len,
            queue: file.mqtt_queue,
        })
    }
}

/// Joins `broker` to the cluster, if there is one. Call before accepting connections.
pub fn start(
    cluster: Option<&ClusterOptions>,
    limits: Limits,
    broker: &Broker,
) -> std::io::Result<Option<RedisFabric>> {
    let Some(cluster) = cluster else {
        return Ok(None);
    };
    let options = Options {
        url: cluster.url.clone(),
        namespace: cluster.namespace.clone(),
        node: cluster.node.clone(),
        timeout: cluster.timeout,
        stream_len: limits.stream_len,
        queue: limits.queue,
    };
    let fabric = RedisFabric::start(&options, broker)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, crate::chain(&e)))?;
    tracing::info!("mqtt broker joined the cluster in redis at {}", options.url);
    Ok(Some(fabric))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bounds_come_from_the_cluster_table_and_zero_is_refused() {
        let file: ClusterConfig = toml::from_str("mqtt_stream_len = 50\nmqtt_queue = 7\n").unwrap();
        let limits = Limits::from_file(&file).unwrap();
        assert_eq!((limits.stream_len, limits.queue), (50, 7));
        let zero: ClusterConfig = toml::from_str("mqtt_queue = 0\n").unwrap();
        assert!(Limits::from_file(&zero).is_err());
        let default = Limits::from_file(&ClusterConfig::default()).unwrap();
        assert_eq!(default.queue, statehub_broker_redis::defaults::QUEUE);
    }
}
