//! The machine over the Redis engine answers exactly as over the memory engine: random
//! command sequences (SET with NX/NEX/PX and fencing tokens, GET, DEL, VDEL, the clock
//! moving, expiry) run against both, every reply compared byte for byte with its
//! version. This checks the Lua scripts' fencing, conditions, quotas and clock against
//! the machine's own rules.
//!
//! A node runs several machines on one store, each on its own connection (the service's
//! shards, one per `network_threads`): random sequences spread over several such
//! machines answer as one memory machine does too; and requests begun several at a
//! time, their scripts in one pipeline, answer as one at a time.

mod common;

use common::{fresh_namespace, machine, request, ts, T0};
use proptest::prelude::*;
use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::{Config, Engine, Machine};

#[derive(Debug, Clone)]
enum Op {
    Set {
        key: u8,
        value: u8,
        len: u8,
        cond: u8,
        px: Option<u64>,
        ft: Option<u8>,
    },
    Get {
        key: u8,
    },
    Del {
        key: u8,
        ft: Option<u8>,
    },
    VDel {
        key: u8,
        value: u8,
        len: u8,
        ft: Option<u8>,
    },
    Advance(u64),
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    let ft = prop::option::of(0..4u8);
    prop_oneof![
        5 => (0..4u8, 0..2u8, 0..6u8, 0..3u8, prop::option::of(1..3_000u64), ft.clone())
            .prop_map(|(key, value, len, cond, px, ft)| Op::Set { key, value, len, cond, px, ft }),
        2 => (0..4u8).prop_map(|key| Op::Get { key }),
        1 => (0..4u8, ft.clone()).prop_map(|(key, ft)| Op::Del { key, ft }),
        1 => (0..4u8, 0..2u8, 0..6u8, ft).prop_map(|(key, value, len, ft)| Op::VDel { key, value, len, ft }),
        2 => (0..2_000u64).prop_map(Op::Advance),
        1 => Just(Op::Expire),
    ]
}

/// How the request is stamped: the client's clock behind, on, or ahead of the server's.
fn stamp() -> impl Strategy<Value = (i64, u64)> {
    (-3..3i64, 0..3u64)
}

fn config() -> Config {
    Config {
        max_keys: 3,
        max_bytes: 14,
        max_value_bytes: 4,
        ..Config::default()
    }
}

/// Fencing tokens: two holders' tokens around the start time, in order.
fn token(i: u8) -> String {
    format!("{:015}:{:05}:holder{}", T0 + u64::from(i / 2), i % 2, i % 2)
}

fn args(op: &Op) -> Option<(Vec<Vec<u8>>, Option<String>)> {
    let value = |v: u8, len: u8| vec![b'a' + v; usize::from(len)];
    let key = |k: u8| vec![b'k', b'0' + k];
    Some(match op {
        Op::Set {
            key: k,
            value: v,
            len,
            cond,
            px,
            ft,
        } => {
            let mut a = vec![b"SET".to_vec(), key(*k), value(*v, *len)];
            match cond {
                1 => a.push(b"NX".to_vec()),
                2 => a.push(b"NEX".to_vec()),
                _ => {}
            }
            if let Some(px) = px {
                a.push(b"PX".to_vec());
                a.push(px.to_string().into_bytes());
            }
            (a, ft.map(token))
        }
        Op::Get { key: k } => (vec![b"GET".to_vec(), key(*k)], None),
        Op::Del { key: k, ft } => (vec![b"DEL".to_vec(), key(*k)], ft.map(token)),
        Op::VDel {
            key: k,
            value: v,
            len,
            ft,
        } => (
            vec![b"VDEL".to_vec(), key(*k), value(*v, *len)],
            ft.map(token),
        ),
        Op::Advance(_) | Op::Expire => return None,
    })
}

fn reply<E: statehub_state_store::Engine>(
    machine: &mut Machine<E>,
    args: &[Vec<u8>],
    stamp: Option<&str>,
    ft: Option<&str>,
    now: u64,
) -> (Vec<u8>, Option<String>) {
    let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let outcome = machine
        .handle(request("client", &args, stamp, ft), now)
        .expect("handle");
    (
        outcome.reply.payload.to_vec(),
        outcome.reply.version.map(|v| v.to_string()),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn redis_answers_as_memory(ops in prop::collection::vec((op(), stamp()), 1..40)) {
        static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
        let server = SERVER.get_or_init(RedisServer::start);
        let mut memory = Machine::in_memory(config());
        let mut redis = machine(server, &fresh_namespace("differential"), "node-a", config());
        let mut now = T0;
        for (i, (op, (skew, counter))) in ops.iter().enumerate() {
            match op {
                Op::Advance(ms) => now += ms,
                Op::Expire => {
                    memory.expire(now).expect("expire");
                    redis.expire(now).expect("expire");
                }
                _ => {}
            }
            let Some((args, ft)) = args(op) else { continue };
            let stamp = ts(now.saturating_add_signed(*skew), *counter);
            let expected = reply(&mut memory, &args, Some(&stamp), ft.as_deref(), now);
            let got = reply(&mut redis, &args, Some(&stamp), ft.as_deref(), now);
            prop_assert_eq!(&got, &expected, "op {} {:?}", i, op);
        }
        prop_assert_eq!(redis.engine().stats(), memory.engine().stats());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Each request goes to one of three machines on one store, each on its own
    /// connection and registered under its own name; expiry runs on the first. Reads
    /// carry no `__ts`: a read's stamp is merged into the shared clock with the next
    /// write on the same connection, so across connections (as across nodes) a write's
    /// version need not exceed another connection's earlier read stamp; every version
    /// still exceeds its own request's stamp and every version before it.
    #[test]
    fn several_machines_on_one_store_answer_as_one(
        ops in prop::collection::vec((op(), stamp(), 0..3usize), 1..40),
    ) {
        static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
        let server = SERVER.get_or_init(RedisServer::start);
        let mut memory = Machine::in_memory(config());
        let namespace = fresh_namespace("differential-shards");
        let mut shards: Vec<_> = ["node-a", "node-a/1", "node-a/2"]
            .iter()
            .map(|node| machine(server, &namespace, node, config()))
            .collect();
        let mut now = T0;
        for (i, (op, (skew, counter), shard)) in ops.iter().enumerate() {
            match op {
                Op::Advance(ms) => now += ms,
                Op::Expire => {
                    memory.expire(now).expect("expire");
                    shards[0].expire(now).expect("expire");
                }
                _ => {}
            }
            let Some((args, ft)) = args(op) else { continue };
            let stamp = ts(now.saturating_add_signed(*skew), *counter);
            let stamp = (!matches!(op, Op::Get { .. })).then_some(stamp.as_str());
            let expected = reply(&mut memory, &args, stamp, ft.as_deref(), now);
            let got = reply(&mut shards[*shard], &args, stamp, ft.as_deref(), now);
            prop_assert_eq!(&got, &expected, "op {} on machine {} {:?}", i, shard, op);
        }
        prop_assert_eq!(shards[2].engine().stats(), memory.engine().stats());
    }
}

/// Finishes what `redis` began, as (reply, version) pairs in order.
fn finish(
    redis: &mut Machine<statehub_state_store_redis::RedisEngine>,
    begun: &mut Vec<statehub_state_store::Pending>,
) -> Vec<(Vec<u8>, Option<String>)> {
    redis
        .finish(std::mem::take(begun))
        .into_iter()
        .map(|outcome| {
            let reply = outcome.expect("finish").reply;
            (reply.payload.to_vec(), reply.version.map(|v| v.to_string()))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// One client's requests begun several at a time (their scripts sent in one
    /// pipeline, before any answer) answer exactly as one at a time on the memory
    /// engine: every reply and version, in order, whatever the runs' lengths (`cut`
    /// ends one), a GET after a SET of its key in the same run included. Some SETs
    /// carry no `__ts` and are refused before any call, in their place.
    #[test]
    fn requests_begun_together_answer_as_one_at_a_time(
        ops in prop::collection::vec((op(), stamp(), any::<bool>(), 0..8u8), 1..40),
    ) {
        static SERVER: std::sync::OnceLock<RedisServer> = std::sync::OnceLock::new();
        let server = SERVER.get_or_init(RedisServer::start);
        let mut memory = Machine::in_memory(config());
        let mut redis = machine(server, &fresh_namespace("pipelined"), "node-a", config());
        let (mut expected, mut got, mut begun) = (Vec::new(), Vec::new(), Vec::new());
        let mut now = T0;
        for (op, (skew, counter), cut, unstamped) in &ops {
            if *cut || matches!(op, Op::Advance(_) | Op::Expire) {
                got.extend(finish(&mut redis, &mut begun));
            }
            match op {
                Op::Advance(ms) => now += ms,
                Op::Expire => {
                    memory.expire(now).expect("expire");
                    redis.expire(now).expect("expire");
                }
                _ => {}
            }
            let Some((args, ft)) = args(op) else { continue };
            let stamp = ts(now.saturating_add_signed(*skew), *counter);
            let stamp = (*unstamped != 0).then_some(stamp.as_str());
            expected.push(reply(&mut memory, &args, stamp, ft.as_deref(), now));
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let request = request("client", &args, stamp, ft.as_deref());
            begun.push(redis.begin(&request, now).expect("begin").expect("begins"));
        }
        got.extend(finish(&mut redis, &mut begun));
        prop_assert_eq!(&got, &expected);
        // A refused request of a run leaves its sweep to the next request's script:
        // due keys last swept by such a request alone are swept here.
        memory.expire(now).expect("expire");
        redis.expire(now).expect("expire");
        prop_assert_eq!(redis.engine().stats(), memory.engine().stats());
    }
}
