//! The official Web PubSub SDKs against the `statehub` binary: each test runs one
//! scenario script from `tests/webpubsub-sdk/` (Node.js with `@azure/web-pubsub-client`,
//! `@azure/web-pubsub` and `@azure/web-pubsub-express`; Python with
//! `azure-messaging-webpubsubclient` and `azure-messaging-webpubsubservice`).
//!
//! The scripts start their own statehub (this crate's binary, on port 0) and their
//! own fault-injecting proxy, so the tests run in parallel. A script exits 0 only
//! when every check passed and prints `RESULT {json}` with its counts; this side
//! checks both, so a script that dies early or checks nothing fails here.
//! `scripts/install-test-deps.sh` installs the SDKs (npm ci, pip into `.venv`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn sdk_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/webpubsub-sdk")
}

/// Runs `program args` in `dir` with `env` and checks its exit status and `RESULT`
/// line.
fn run(program: &Path, args: &[&str], env: &[(&str, &str)], dir: &Path, limit: Duration) {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("STATEHUB_BIN", env!("CARGO_BIN_EXE_statehub"))
        .env_remove("STATEHUB_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let report = format!(
        "{} {args:?}\n--- stdout\n{out}\n--- stderr\n{err}",
        program.display()
    );
    let Some(status) = status else {
        panic!("timed out after {limit:?}: {report}")
    };
    let result = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {report}"));
    let result: serde_json::Value = serde_json::from_str(result).expect("RESULT is JSON");
    assert!(status.success(), "scenario failed ({status}): {report}");
    assert_eq!(result["failed"], serde_json::json!([]), "{report}");
    assert!(
        result["passed"].as_u64().unwrap_or(0) > 0,
        "no checks ran: {report}"
    );
    // The scenario's counts, shown by `--no-capture` and in a failure's output.
    eprintln!("{result}");
}

fn node(script: &str, limit: Duration) {
    node_with(script, &[], limit);
}

fn node_with(script: &str, env: &[(&str, &str)], limit: Duration) {
    let dir = sdk_dir().join("js");
    assert!(
        dir.join("node_modules/@azure/web-pubsub-client").is_dir(),
        "the JS SDKs are not installed in {}: run scripts/install-test-deps.sh",
        dir.display()
    );
    run(Path::new("node"), &[script], env, &dir, limit);
}

fn python(script: &str, limit: Duration) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv_python = root.join(".venv/bin/python");
    assert!(
        venv_python.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        venv_python.display()
    );
    run(
        &venv_python,
        &[script],
        &[],
        &sdk_dir().join("python"),
        limit,
    );
}

const LIMIT: Duration = Duration::from_secs(150);

/// Two nodes on one redis-server: groups, users, connections and the REST API across
/// nodes, exactly once and in order; a killed redis-server refuses sends to other nodes
/// clearly, and they flow again when it is back (`cluster.mjs`).
#[test]
fn js_two_nodes_on_redis_groups_rest_and_a_redis_outage() {
    node("cluster.mjs", LIMIT);
}

/// Two nodes on one redis-server: the service SDK's groupExists, userExists,
/// connectionExists, hasPermission and listConnections through one node about a client
/// of the other, at once after each acknowledged change (`cluster-checks.mjs`).
#[test]
fn js_checks_through_one_node_answer_for_the_cluster() {
    node("cluster-checks.mjs", LIMIT);
}

/// Three nodes on one redis-server behind a balancer: a reliable subscriber and
/// publisher recover their sessions on another node, after a cut and after a SIGKILL,
/// with every message once and in order and a re-sent ackId answered Duplicate
/// (`cluster-recovery.mjs`).
#[test]
fn js_reliable_sessions_recover_on_another_node() {
    node("cluster-recovery.mjs", LIMIT);
}

/// A graceful shutdown (SIGTERM) of a node hands its reliable sessions to another
/// node: the official client recovers them there, same connection ids, every message
/// once and in order (`cluster-shutdown.mjs`).
#[test]
fn js_reliable_sessions_move_on_a_graceful_shutdown() {
    node("cluster-shutdown.mjs", LIMIT);
}

/// A reliable subscriber sees a message only once Redis has it: after its node was
/// killed while its writer was blocked, the subscriber recovers on another node and
/// gets every acknowledged send, none dropped as an id it has seen
/// (`cluster-window.mjs`).
#[test]
fn js_a_reliable_subscriber_sees_only_what_redis_has() {
    node("cluster-window.mjs", LIMIT);
}

/// A client stream of the official JS client goes on after its node was killed: the
/// client recovers on another node through the balancer and sends again from its
/// oldest unacknowledged fragment; the receiver gets every fragment once, in order,
/// and the end, and the SDK reports no stream error (`cluster-streams.mjs`).
#[test]
fn js_a_client_stream_survives_a_recovery_on_another_node() {
    node("cluster-streams.mjs", LIMIT);
}

/// The Python client's reliable session taken over by node B after its node A was
/// killed, every message once and in order (`python/cluster_recovery.py`).
#[test]
fn python_reliable_session_recovers_on_another_node() {
    python("cluster_recovery.py", LIMIT);
}

#[test]
fn js_messaging_and_rest_api() {
    node("messaging.mjs", LIMIT);
}

#[test]
fn js_upstream_events_through_express() {
    node("events.mjs", LIMIT);
}

#[test]
fn js_recovery_and_failed_recovery() {
    node("recovery.mjs", LIMIT);
}

/// 20,000 messages from an unpaced publisher to a reliable subscriber: all delivered,
/// in order, on one connection.
#[test]
fn js_firehose_20000_messages_one_session() {
    node("firehose.mjs", LIMIT);
}

/// 20,000 unpaced messages through a proxy that resets every connection every 300 ms:
/// exactly once, in order, no session lost.
#[test]
fn js_chaos_20000_unpaced_messages_exactly_once_in_order() {
    node("chaos.mjs", Duration::from_secs(240));
}

/// The same at 2,000 msg/s with a replay buffer too small to cover a reset (4 KiB,
/// about 17 messages, so that even a machine ten times slower loses sessions):
/// sessions are lost, but only with a `disconnected` naming the evicted messages and
/// close 1008, each followed by a new session, and every missing message falls in
/// the gap of one.
#[test]
fn js_chaos_small_replay_buffer_loses_sessions_only_honestly() {
    let env = [
        ("CHAOS_MESSAGES", "10000"),
        ("CHAOS_RATE", "2000"),
        ("CHAOS_EXPECT_LOSS", "1"),
        (
            "CHAOS_CONFIG",
            "[webpubsub.limits]\nreplay_buffer_bytes = 4096\n",
        ),
    ];
    node_with("chaos.mjs", &env, Duration::from_secs(240));
}

/// A full replay buffer evicts instead of closing; a recovery the ack covers is
/// served, one that needs evicted messages gets 1008 and the SDK starts over.
#[test]
fn js_replay_eviction_and_failed_recovery() {
    node("eviction.mjs", LIMIT);
}

/// A subscriber that never reads is closed as a slow consumer; memory stays bounded.
#[test]
fn js_slow_consumer_is_closed_and_memory_stays_bounded() {
    node("slow-consumer.mjs", LIMIT);
}

/// A full hub fails the client's `start()` (429), a join past the group limit rejects
/// with the ack's `BadRequest`.
#[test]
fn js_hub_and_group_limits() {
    node("limits.mjs", LIMIT);
}

#[test]
fn python_messaging_and_rest_api() {
    python("messaging.py", LIMIT);
}

#[test]
fn python_recovery_and_failed_recovery() {
    python("recovery.py", LIMIT);
}

/// 20,000 messages from an unpaced publisher to the Python client: all delivered, in
/// order, on one connection.
#[test]
fn python_firehose_20000_messages_one_session() {
    python("firehose.py", LIMIT);
}

/// 10,000 unpaced messages to the Python client through a proxy that resets its
/// connection every 300 ms: exactly once, in order, no session lost.
#[test]
fn python_chaos_10000_unpaced_messages_exactly_once_in_order() {
    python("chaos.py", LIMIT);
}

/// The Python client with a small replay buffer: evictions never close it, a recovery
/// its ack covers is served, one that needs evicted messages gets 1008 and it starts
/// over.
#[test]
fn python_replay_eviction_and_failed_recovery() {
    python("eviction.py", LIMIT);
}
