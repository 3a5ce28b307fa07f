//! Crash tests: the real binary with `--data-dir`, killed with SIGKILL at random moments
//! while clients write, restarted on the same directory, many times.
//!
//! Each writer owns a few keys and sends one request at a time, as an SDK caller awaiting
//! each call does: a SET of a value unique to that write, or now and then a DEL. At
//! most one write per writer is in flight when the kill lands. After every restart each
//! key must hold exactly its last acknowledged state (value and version) or, if a write
//! to it was in flight, that write's outcome; never an older value, never anything else,
//! and an in-flight write that did land has a version above the acknowledged one.
//! Versions never go backwards: every write after a restart gets a version above all
//! versions seen before. Iterations alternate `--sync always` and `--sync
//! interval=50` (an acknowledged write reached the OS, so a process crash loses nothing
//! under either).
//!
//! `CRASH_ITERATIONS` (default 30) and `CRASH_SEED` reproduce or extend a run; the seed
//! is printed.

mod common;
mod store_rpc;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{resp, start_on, Rng, Server};
use store_rpc::Client;

const WRITERS: u8 = 16;
const KEYS_PER_WRITER: u64 = 3;

/// What a key holds: a value and its version, or nothing (deleted / never written).
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Value(String, String),
    Absent,
}

/// A write whose answer never came.
#[derive(Debug, Clone)]
enum InFlight {
    Set(String),
    Del,
}

/// One key's history as the clients know it.
#[derive(Debug, Clone)]
struct Known {
    acked: State,
    /// Version of the last acknowledged write (a DEL's too).
    acked_version: Option<String>,
    in_flight: Option<InFlight>,
}

fn key_name(writer: u8, k: u64) -> Vec<u8> {
    format!("crash-w{writer}-k{k}").into_bytes()
}

/// One writer until its connection dies: returns what it learnt about its keys and how
/// many writes were acknowledged. Every version it is given must be above `floor`, the
/// highest version seen before this server started.
async fn write_until_killed(
    addr: SocketAddr,
    writer: u8,
    iteration: u32,
    mut known: HashMap<Vec<u8>, Known>,
    floor: Option<String>,
    seed: u64,
) -> (HashMap<Vec<u8>, Known>, usize) {
    let Some(mut client) = Client::connect(addr, &format!("crash-writer-{writer}")).await else {
        return (known, 0);
    };
    let mut rng = Rng(seed | 1);
    for n in 0u32.. {
        let key = key_name(writer, rng.below(KEYS_PER_WRITER));
        let entry = known.get_mut(&key).expect("every key is known");
        let (request, in_flight) = if rng.below(8) == 0 {
            (resp(&[b"DEL", &key]), InFlight::Del)
        } else {
            let value = format!("i{iteration}-w{writer}-n{n}");
            (
                resp(&[b"SET", &key, value.as_bytes()]),
                InFlight::Set(value),
            )
        };
        entry.in_flight = Some(in_flight.clone());
        let Some(answer) = client.call(request).await else {
            return (known, n as usize);
        };
        let version = answer.version.clone();
        if let (Some(new), Some(old)) = (&version, &entry.acked_version) {
            assert!(
                new > old,
                "key {}: version went from {old} to {new}",
                key.escape_ascii()
            );
        }
        if let (Some(new), Some(floor)) = (&version, &floor) {
            assert!(
                new > floor,
                "version {new} issued after a restart is not above {floor}, seen before it"
            );
        }
        match in_flight {
            InFlight::Set(value) => {
                assert_eq!(answer.payload, b"+OK\r\n");
                entry.acked =
                    State::Value(value, version.clone().expect("a SET answer carries __ts"));
            }
            InFlight::Del => {
                assert!(
                    answer.payload == b":1\r\n" || answer.payload == b":0\r\n",
                    "{:?}",
                    answer.payload
                );
                entry.acked = State::Absent;
            }
        }
        if version.is_some() {
            entry.acked_version = version;
        }
        entry.in_flight = None;
    }
    (known, 0)
}

/// GETs every key and checks it against what was acknowledged. Clears the in-flight
/// writes (they have landed or not, for good).
async fn check(addr: SocketAddr, known: &mut HashMap<Vec<u8>, Known>, iteration: u32) {
    let mut client = Client::connect(addr, "crash-checker")
        .await
        .expect("checker connects");
    let mut keys: Vec<_> = known.keys().cloned().collect();
    keys.sort();
    let answers = client
        .call_many(keys.iter().map(|k| resp(&[b"GET", k])).collect())
        .await
        .expect("GETs answered");
    for (key, answer) in keys.into_iter().zip(answers) {
        let entry = known.get_mut(&key).unwrap();
        let got = if answer.payload == b"$-1\r\n" {
            State::Absent
        } else {
            let text = answer.payload;
            let start = text.iter().position(|&b| b == b'\n').expect("bulk string") + 1;
            let value = String::from_utf8_lossy(&text[start..text.len() - 2]).into_owned();
            State::Value(
                value,
                answer.version.clone().expect("GET of a value carries __ts"),
            )
        };
        let ok = got == entry.acked
            || match (&entry.in_flight, &got) {
                (Some(InFlight::Set(v)), State::Value(value, version)) => {
                    v == value
                        && entry
                            .acked_version
                            .as_ref()
                            .is_none_or(|acked| version > acked)
                }
                (Some(InFlight::Del), State::Absent) => true,
                _ => false,
            };
        assert!(
            ok,
            "iteration {iteration}, key {}: found {got:?}; acknowledged {:?} (version {:?}), in flight {:?}",
            key.escape_ascii(),
            entry.acked,
            entry.acked_version,
            entry.in_flight
        );
        if let State::Value(_, version) = &got {
            entry.acked_version = entry.acked_version.clone().max(Some(version.clone()));
        }
        entry.acked = got;
        entry.in_flight = None;
    }
}

fn launch(dir: &std::path::Path, iteration: u32) -> Server {
    let sync = if iteration.is_multiple_of(2) {
        "always"
    } else {
        "interval=50"
    };
    start_on(dir, &["--sync", sync])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_sigkill() {
    let (iterations, seed) = common::crash_plan("crash test", "CRASH_ITERATIONS", 30);
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let mut known: HashMap<Vec<u8>, Known> = (0..WRITERS)
        .flat_map(|w| (0..KEYS_PER_WRITER).map(move |k| key_name(w, k)))
        .map(|key| {
            (
                key,
                Known {
                    acked: State::Absent,
                    acked_version: None,
                    in_flight: None,
                },
            )
        })
        .collect();
    let mut acknowledged = 0usize;
    for iteration in 0..iterations {
        let mut server = launch(dir.path(), iteration);
        let addr = server.mqtt;
        check(addr, &mut known, iteration).await;
        let floor = known.values().filter_map(|k| k.acked_version.clone()).max();
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let prefix = format!("crash-w{w}-").into_bytes();
                let mine = known
                    .iter()
                    .filter(|(k, _)| k.starts_with(&prefix))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                tokio::spawn(write_until_killed(
                    addr,
                    w,
                    iteration,
                    mine,
                    floor.clone(),
                    rng.next(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(150 + rng.below(450))).await;
        server.child.kill().expect("SIGKILL");
        let _ = server.child.wait();
        for w in writers {
            let (mine, acks) = w.await.expect("writer panicked");
            known.extend(mine);
            acknowledged += acks;
        }
    }
    let server = launch(dir.path(), iterations);
    check(server.mqtt, &mut known, iterations).await;
    drop(server);
    eprintln!("crash test: {iterations} kills survived, {acknowledged} writes acknowledged");
    assert!(
        acknowledged >= iterations as usize,
        "too few writes acknowledged ({acknowledged}) to test anything"
    );
}
