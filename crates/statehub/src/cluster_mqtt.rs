//! Scale-out of the broker: with `--redis`, this node's broker joins every other node on
//! that Redis (and namespace) as one MQTT broker through `statehub-broker-redis`'s
//! fabric: messages, retained messages, takeovers and shared subscriptions span nodes.

use statehub_broker::Broker;
use statehub_broker_redis::RedisFabric;

use crate::cluster::Cluster;
use crate::metrics::ClusterSources;

/// Joins `broker` to the cluster, if there is one, its counters read by `metrics`. Call
/// before accepting connections.
pub fn start(
    cluster: Option<&Cluster>,
    broker: &Broker,
    metrics: &ClusterSources,
) -> std::io::Result<Option<RedisFabric>> {
    let Some(options) = cluster.map(|c| &c.mqtt) else {
        return Ok(None);
    };
    let fabric = RedisFabric::start(options, broker)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, crate::chain(&e)))?;
    metrics.set_mqtt(&fabric);
    tracing::info!("mqtt broker joined the cluster in redis at {}", options.url);
    Ok(Some(fabric))
}
