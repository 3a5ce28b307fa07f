//! Liveness: each node renews two keys that expire after [`Options::node_ttl`]: one
//! for this process as the owner of persistent sessions (`alive:{owner}`, so a node
//! restarted under the same id does not pass for the one that died) and one for the
//! node id (`node:{id}`, which the shared groups hash is keyed by). A node whose key
//! expired is dead: another node takes its sessions as they are (`sessions/fetch.rs`)
//! and no publisher picks it for a shared group any more.

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, Connection};

use crate::writer::open;
use crate::{Options, Shared};

/// Starts the heartbeat thread (it runs for the life of the process).
pub(crate) fn start(
    client: Client,
    shared: Arc<Shared>,
    owner: &str,
    options: &Options,
) -> std::io::Result<()> {
    let heart = Heart {
        client,
        alive_key: format!("{}alive:{owner}", shared.keys.prefix),
        node_key: format!("{}node:{}", shared.keys.prefix, shared.node),
        shared,
        ttl: options.node_ttl.max(Duration::from_millis(30)),
        timeout: options.timeout,
    };
    std::thread::Builder::new()
        .name("mqtt-cluster-liveness".into())
        .spawn(move || heart.run())?;
    Ok(())
}

struct Heart {
    client: Client,
    shared: Arc<Shared>,
    alive_key: String,
    node_key: String,
    ttl: Duration,
    timeout: Duration,
}

impl Heart {
    fn run(self) {
        let mut connection: Option<Connection> = None;
        loop {
            if let Err(e) = self.beat(&mut connection) {
                self.shared
                    .counters
                    .liveness_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!("mqtt cluster liveness: {e}");
                connection = None;
            }
            std::thread::sleep(self.ttl / 3);
        }
    }

    fn beat(&self, connection: &mut Option<Connection>) -> redis::RedisResult<()> {
        let con = match connection {
            Some(con) => con,
            None => connection.insert(open(&self.client, self.timeout)?),
        };
        let ttl = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        redis::pipe()
            .set(&self.alive_key, 1)
            .arg("PX")
            .arg(ttl)
            .ignore()
            .set(&self.node_key, 1)
            .arg("PX")
            .arg(ttl)
            .ignore()
            .query::<()>(con)?;
        let others = self.shared.groups.other_nodes();
        if others.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for node in &others {
            pipe.exists(format!("{}node:{node}", self.shared.keys.prefix));
        }
        let alive: Vec<bool> = pipe.query(con)?;
        let dead = others
            .into_iter()
            .zip(alive)
            .filter_map(|(node, up)| (!up).then_some(node))
            .collect();
        self.shared.groups.set_dead(dead);
        Ok(())
    }
}
