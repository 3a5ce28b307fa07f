//! [`Cluster::ask`](statehub_webpubsub::Cluster::ask) over Redis: the question goes
//! into the operations stream through this node's writer (after everything it handed
//! over before); each node's reader, this one's included, answers it in stream order,
//! through that node's writer, into a list the asker pops with `BLPOP`.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::Connection;
use statehub_webpubsub::{Cluster, ClusterError};

use crate::{lock, open, unavailable, RedisCluster, WpsRedisError};

/// How long an unread answer stays (the asker deletes the list when done).
const ANSWERS_TTL_MS: u64 = 60_000;
/// Connections kept for later questions.
const KEPT: usize = 8;
/// Questions of this node waiting for answers at once (each holds a blocking thread
/// and a Redis connection for up to 3 x the timeout); more are refused (503).
pub(crate) const MAX_ASKING: usize = 64;

/// See the module docs.
pub(crate) fn ask(
    cluster: &RedisCluster,
    id: &str,
    question: Vec<u8>,
    settles: &dyn Fn(&[u8]) -> bool,
) -> Result<Vec<Vec<u8>>, ClusterError> {
    if cluster.asking.fetch_add(1, Ordering::AcqRel) >= MAX_ASKING {
        cluster.asking.fetch_sub(1, Ordering::AcqRel);
        return Err(ClusterError::Backlog(MAX_ASKING));
    }
    let answers = ask_on_a_connection(cluster, id, question, settles);
    cluster.asking.fetch_sub(1, Ordering::AcqRel);
    answers
}

fn ask_on_a_connection(
    cluster: &RedisCluster,
    id: &str,
    question: Vec<u8>,
    settles: &dyn Fn(&[u8]) -> bool,
) -> Result<Vec<Vec<u8>>, ClusterError> {
    let mut con = match lock(&cluster.askers).pop() {
        Some(con) => con,
        None => open(&cluster.client, cluster.timeout).map_err(unavailable)?,
    };
    let answers = collect(cluster, &mut con, id, question, settles);
    // A connection that failed may hold half a reply: only a clean one is kept.
    if !matches!(answers, Err(Failed::Redis(_))) {
        let mut kept = lock(&cluster.askers);
        if kept.len() < KEPT {
            kept.push(con);
        }
    }
    answers.map_err(|f| match f {
        Failed::Redis(e) => unavailable(e),
        Failed::Cluster(e) => e,
    })
}

enum Failed {
    Redis(WpsRedisError),
    Cluster(ClusterError),
}

impl From<redis::RedisError> for Failed {
    fn from(e: redis::RedisError) -> Self {
        Failed::Redis(e.into())
    }
}

fn collect(
    cluster: &RedisCluster,
    con: &mut Connection,
    id: &str,
    question: Vec<u8>,
    settles: &dyn Fn(&[u8]) -> bool,
) -> Result<Vec<Vec<u8>>, Failed> {
    let mut waiting = alive(cluster, con)?;
    waiting.insert(cluster.node.clone());
    cluster.broadcast(question).map_err(Failed::Cluster)?;
    let key = cluster.names.answers(id);
    let deadline = Instant::now() + cluster.timeout * 3;
    let mut answers = Vec::new();
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let silent: Vec<String> = waiting.into_iter().collect();
            return Err(Failed::Cluster(ClusterError::NoAnswer(silent.join(", "))));
        }
        let block = left.min(cluster.timeout / 2).max(Duration::from_millis(10));
        let popped: Option<(String, Vec<u8>)> = redis::cmd("BLPOP")
            .arg(&key)
            .arg(block.as_secs_f64())
            .query(con)?;
        let Some((_, entry)) = popped else {
            // Nobody answered meanwhile: stop waiting for nodes that died since. Never
            // for this one: its answer shows the question was read in order at all.
            let alive = alive(cluster, con)?;
            waiting.retain(|n| *n == cluster.node || alive.contains(n));
            continue;
        };
        let Some(at) = entry.iter().position(|b| *b == b'\n') else {
            continue;
        };
        let node = String::from_utf8_lossy(&entry[..at]).into_owned();
        let answer = entry[at + 1..].to_vec();
        if waiting.remove(&node) {
            let decided = settles(&answer);
            answers.push(answer);
            if decided {
                break;
            }
        }
    }
    redis::cmd("DEL").arg(&key).query::<()>(con)?;
    Ok(answers)
}

/// The nodes whose liveness key exists (this one among them while its writer
/// reaches Redis).
fn alive(cluster: &RedisCluster, con: &mut Connection) -> Result<HashSet<String>, Failed> {
    let nodes: Vec<String> = redis::cmd("SMEMBERS")
        .arg(cluster.names.nodes())
        .query(con)?;
    if nodes.is_empty() {
        return Ok(HashSet::new());
    }
    let keys: Vec<String> = nodes.iter().map(|n| cluster.names.alive(n)).collect();
    let alive: Vec<Option<String>> = redis::cmd("MGET").arg(&keys).query(con)?;
    Ok(nodes
        .into_iter()
        .zip(alive)
        .filter_map(|(n, a)| a.map(|_| n))
        .collect())
}

/// The writer's part: push one answer, kept a while for a slow asker.
pub(crate) fn push_answer(pipe: &mut redis::Pipeline, key: &str, entry: &[u8]) {
    pipe.cmd("RPUSH").arg(key).arg(entry).ignore();
    pipe.cmd("PEXPIRE").arg(key).arg(ANSWERS_TTL_MS).ignore();
}
