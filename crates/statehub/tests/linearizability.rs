//! Linearizability of the state store against the real binary: several MQTT 5 clients
//! run SET (plain, NX, NEX), GET, DEL and VDEL, some with fencing tokens, on a few keys
//! at once; the history they record (invoke and complete times, answers with their
//! versions) must be linearizable with respect to the store's sequential model
//! (`lincheck`: per key, plus the shared version clock across keys).
//!
//! In memory, and with `--data-dir` across a `kill -9` in the middle of the run: after
//! the restart every acknowledged operation is reflected, and each request in flight at
//! the kill either happened before it or never did.
//!
//! On three nodes on one redis-server (`--redis`), clients spread over the nodes; and
//! with one node killed (SIGKILL) mid-history and restarted while the others go on: a
//! request in flight on the killed node either happened or never did, at any moment
//! after it was sent (Redis may run a script the dead node had already written to its
//! socket after the process is gone), so its result is left open with no deadline.
//!
//! `LIN_SEED` reproduces a run (the seed is printed).

mod common;
mod lincheck;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{start, Server, LOCAL};
use lincheck::check_history;
use lincheck::client::{run_client, since, Recorded, Shared};
use lincheck::model::Ret;
use statehub_redis_common::test_server::RedisServer;

const CLIENTS: usize = 5;
const KEYS: usize = 3;
/// Per key; the checker answers in milliseconds on these histories.
const CHECK_BUDGET: Duration = Duration::from_secs(60);

fn seed() -> u64 {
    let seed = std::env::var("LIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("LIN_SEED={seed}");
    seed
}

/// Starts `CLIENTS` clients of `ops` operations each, client `c` on `addrs[c % len]`.
fn spawn_clients(
    addrs: &[SocketAddr],
    name: &str,
    ops: usize,
    seed: u64,
    shared: &Shared,
) -> Vec<tokio::task::JoinHandle<Vec<Recorded>>> {
    spawn_some(addrs, 0..CLIENTS, name, ops, seed, shared)
}

/// Starts clients `which` (numbered as in [`spawn_clients`]).
fn spawn_some(
    addrs: &[SocketAddr],
    which: impl Iterator<Item = usize>,
    name: &str,
    ops: usize,
    seed: u64,
    shared: &Shared,
) -> Vec<tokio::task::JoinHandle<Vec<Recorded>>> {
    which
        .map(|c| {
            let id = format!("lin-{name}-{c}-{seed}");
            let client_seed = seed.wrapping_mul(31).wrapping_add(c as u64 * 7919);
            tokio::spawn(run_client(
                addrs[c % addrs.len()],
                id,
                c,
                client_seed,
                ops,
                KEYS,
                shared.clone(),
            ))
        })
        .collect()
}

async fn join(handles: Vec<tokio::task::JoinHandle<Vec<Recorded>>>) -> Vec<Recorded> {
    let mut history = Vec::new();
    for handle in handles {
        history.extend(handle.await.expect("a client task"));
    }
    history
}

/// The history with one GET hit's version changed to one never issued: the checker must
/// refuse it, or it could not fail the test.
fn corrupted(history: &[Recorded]) -> Vec<Recorded> {
    let mut corrupted = history.to_vec();
    let hit = corrupted
        .iter_mut()
        .find_map(|o| match &mut o.ret {
            Some((_, Ret::Value(_, version))) => Some(version),
            _ => None,
        })
        .expect("some GET saw a value");
    *hit = (hit.0, hit.1 + 1_000);
    corrupted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_histories_are_linearizable() {
    let server = start(&LOCAL, &[]);
    let seed = seed();
    let shared = Shared::new();
    let history = join(spawn_clients(&[server.mqtt], "mem", 120, seed, &shared)).await;
    assert!(
        history.iter().all(|o| o.ret.is_some()),
        "every call answered"
    );
    eprintln!("{} operations on {KEYS} keys", history.len());
    if let Err(e) = check_history(&history, u64::MAX, CHECK_BUDGET) {
        panic!("LIN_SEED={seed}: {e}\n{history:#?}");
    }
    assert!(
        check_history(&corrupted(&history), u64::MAX, CHECK_BUDGET).is_err(),
        "the checker accepts a read of a version never issued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_across_a_kill_are_linearizable() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let mut args = LOCAL.to_vec();
    args.extend(["--data-dir", data_dir]);
    let mut server = start(&args, &[]);
    let seed = seed();
    let shared = Shared::new();
    let before = spawn_clients(&[server.mqtt], "before", 150, seed, &shared);
    // Kill once about a third of the operations are done, while every client is busy.
    while shared.completed.load(Ordering::Relaxed) < CLIENTS * 50 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.child.kill().expect("kill -9");
    server.child.wait().expect("reap");
    let killed_at = since(shared.epoch);
    let mut history = join(before).await;
    // A request sent after the process was gone never reached it.
    history.retain(|o| o.ret.is_some() || o.call < killed_at);
    let open = history.iter().filter(|o| o.ret.is_none()).count();

    let server = start(&args, &[]);
    let after = spawn_clients(&[server.mqtt], "after", 60, seed ^ 0x5555, &shared);
    history.extend(join(after).await);
    eprintln!(
        "{} operations on {KEYS} keys, {open} in flight at the kill",
        history.len()
    );
    if let Err(e) = check_history(&history, killed_at, CHECK_BUDGET) {
        panic!("LIN_SEED={seed}: {e}\n{history:#?}");
    }
}

/// A node on `redis` with its own id.
fn node(redis: &RedisServer, id: &str) -> Server {
    let url = redis.url();
    let mut args = LOCAL.to_vec();
    args.extend(["--redis", &url, "--node-id", id]);
    start(&args, &[])
}

fn three_nodes(redis: &RedisServer) -> Vec<Server> {
    ["n0", "n1", "n2"]
        .iter()
        .map(|id| node(redis, id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_across_three_nodes_on_one_redis_are_linearizable() {
    let redis = RedisServer::start();
    let nodes = three_nodes(&redis);
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.mqtt).collect();
    let seed = seed();
    let shared = Shared::new();
    let history = join(spawn_clients(&addrs, "cluster", 100, seed, &shared)).await;
    assert!(
        history.iter().all(|o| o.ret.is_some()),
        "every call answered"
    );
    eprintln!("{} operations on {KEYS} keys, 3 nodes", history.len());
    if let Err(e) = check_history(&history, u64::MAX, CHECK_BUDGET) {
        panic!("LIN_SEED={seed}: {e}\n{history:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_across_a_node_killed_and_restarted_are_linearizable() {
    let redis = RedisServer::start();
    let mut nodes = three_nodes(&redis);
    let addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.mqtt).collect();
    let seed = seed();
    let shared = Shared::new();
    let before = spawn_clients(&addrs, "before", 150, seed, &shared);
    // Kill node 0 once about a third of the operations are done, every client busy.
    while shared.completed.load(Ordering::Relaxed) < CLIENTS * 50 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    nodes[0].child.kill().expect("kill -9");
    nodes[0].child.wait().expect("reap");
    let killed_at = since(shared.epoch);
    // Node 0's clients start again on its restarted process, while the clients of
    // nodes 1 and 2 go on.
    nodes[0] = node(&redis, "n0");
    let restarted = [nodes[0].mqtt, addrs[1], addrs[2]];
    let on_node_0 = (0..CLIENTS).filter(|c| c % restarted.len() == 0);
    let after = spawn_some(&restarted, on_node_0, "after", 60, seed ^ 0x5555, &shared);
    let mut history = join(before).await;
    // A request sent after the process was gone never reached it.
    history.retain(|o| o.ret.is_some() || o.call < killed_at);
    let open = history.iter().filter(|o| o.ret.is_none()).count();
    history.extend(join(after).await);
    eprintln!(
        "{} operations on {KEYS} keys, {open} in flight on the killed node",
        history.len()
    );
    if let Err(e) = check_history(&history, u64::MAX, CHECK_BUDGET) {
        panic!("LIN_SEED={seed}: {e}\n{history:#?}");
    }
}
