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

/// Writes what this node's persistent sessions still hold back (their queued messages
/// written behind, the writer's queue) to Redis, so a session resumed on another node
/// after a graceful shutdown lacks nothing; gives up after `grace` (Redis away).
pub async fn flush_sessions(fabric: Option<&RedisFabric>, grace: std::time::Duration) {
    use statehub_broker::SessionStore;
    let Some(fabric) = fabric else { return };
    match tokio::time::timeout(grace, fabric.sessions().barrier()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("persistent sessions not all written at shutdown: {e}"),
        Err(_) => {
            tracing::warn!("persistent sessions not all written at shutdown within {grace:?}")
        }
    }
}
