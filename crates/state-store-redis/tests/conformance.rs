//! The engine conformance suite against a real redis-server: each check on a fresh
//! namespace of one server.

use std::sync::atomic::{AtomicU64, Ordering};

use statehub_redis_common::test_server::RedisServer;
use statehub_state_store::conformance;
use statehub_state_store_redis::{defaults, Options, RedisEngine};

fn options(server: &RedisServer, namespace: &str) -> Options {
    Options {
        url: server.url(),
        namespace: namespace.to_owned(),
        node: "node-a".to_owned(),
        version_node_id: "state-store".to_owned(),
        timeout: defaults::TIMEOUT,
        feed_len: defaults::FEED_LEN,
        wait: None,
    }
}

#[test]
fn redis_engine_conforms() {
    let server = RedisServer::start();
    let next = AtomicU64::new(0);
    conformance::run_all(|| {
        let namespace = format!("conformance-{}", next.fetch_add(1, Ordering::Relaxed));
        RedisEngine::open(&options(&server, &namespace)).expect("open")
    });
}
