//! Helpers shared by the engine's tests.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::{AllowAll, Config, Machine, Request};
use statehub_state_store_redis::{defaults, Options, RedisEngine};

/// 2023-10-03T23:07:05Z.
pub const T0: u64 = 1_696_374_425_000;

/// A namespace no other test of this process uses.
pub fn fresh_namespace(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn options(server: &RedisServer, namespace: &str, node: &str) -> Options {
    Options {
        url: server.url(),
        namespace: namespace.to_owned(),
        node: node.to_owned(),
        version_node_id: "state-store".to_owned(),
        timeout: defaults::TIMEOUT,
        feed_len: defaults::FEED_LEN,
        wait: None,
    }
}

/// A machine over the store `namespace` of `server`, as node `node`.
pub fn machine(
    server: &RedisServer,
    namespace: &str,
    node: &str,
    config: Config,
) -> Machine<RedisEngine, AllowAll> {
    let engine = RedisEngine::open(&options(server, namespace, node)).expect("open");
    Machine::new(engine, AllowAll, config).expect("machine")
}

/// A RESP array of bulk strings.
pub fn resp(args: &[&[u8]]) -> Bytes {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    Bytes::from(out)
}

pub fn request<'a>(
    client: &'a str,
    args: &[&[u8]],
    ts: Option<&'a str>,
    ft: Option<&'a str>,
) -> Request<'a> {
    Request {
        client_id: client,
        payload: resp(args),
        timestamp: ts,
        fencing_token: ft,
        access: None,
    }
}

/// A client HLC.
pub fn ts(ms: u64, counter: u64) -> String {
    format!("{ms:015}:{counter:05}:CLIENT")
}
