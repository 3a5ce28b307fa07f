//! Helpers of the cross-node tests: statehub nodes on one redis-server, and the QoS
//! exchanges they check.

use std::future::Future;

use statehub_broker::codec::{Packet, PubResponse, Publish, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{publish, RawClient};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::proxy::Proxy;
use super::{Server, LOCAL};

/// A node on `redis` with id `id`.
pub fn node(redis: &RedisServer, id: &str) -> Server {
    let url = redis.url();
    let mut args = LOCAL.to_vec();
    args.extend(["--redis", &url, "--node-id", id]);
    super::start(&args, &[])
}

/// Publishes and completes the QoS 1/2 exchange; the acknowledgement's reason code.
pub async fn publish_acked(c: &mut RawClient, topic: &str, qos: QoS, payload: &[u8]) -> ReasonCode {
    let id = c.next_packet_id();
    let p = Publish {
        packet_id: (qos != QoS::AtMostOnce).then_some(id),
        ..publish(topic, qos, payload)
    };
    c.send(&Packet::Publish(p)).await;
    match qos {
        QoS::AtMostOnce => ReasonCode::SUCCESS,
        QoS::AtLeastOnce => match c
            .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
            .await
        {
            Packet::PubAck(a) => a.reason_code,
            _ => unreachable!(),
        },
        QoS::ExactlyOnce => {
            let rec = c
                .expect_reply("PUBREC", |p| matches!(p, Packet::PubRec(_)))
                .await;
            let Packet::PubRec(rec) = rec else {
                unreachable!()
            };
            if rec.reason_code.0 >= 0x80 {
                return rec.reason_code;
            }
            c.send(&Packet::PubRel(PubResponse::ok(id))).await;
            c.expect_reply("PUBCOMP", |p| matches!(p, Packet::PubComp(_)))
                .await;
            rec.reason_code
        }
    }
}

/// The payloads of the next `n` messages, each acknowledged.
pub async fn receive(c: &mut RawClient, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        let p = c.expect_publish_ack().await;
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    got
}

/// A node whose liveness key lives `ttl_ms` (so a killed node is found dead quickly).
pub fn node_with_ttl(redis: &RedisServer, id: &str, ttl_ms: u64) -> Server {
    let url = redis.url();
    let toml = format!("[cluster]\nmqtt_node_ttl_ms = {ttl_ms}\n");
    super::start_configured(&toml, &["--redis", &url, "--node-id", id])
}

/// A node on `redis` whose `[cluster]` table also has `settings` (TOML lines).
pub fn node_with_settings(redis: &RedisServer, id: &str, settings: &str) -> Server {
    let url = redis.url();
    let toml = format!("[cluster]\n{settings}\n");
    super::start_configured(&toml, &["--redis", &url, "--node-id", id])
}

/// Two nodes on one redis-server: `a` reaches it through a [`Proxy`] whose relay the
/// test chooses (to hold back what it wants of a's Redis traffic), `b` directly.
/// Built with [`Pair::builder`], each test naming what its nodes' `[cluster]` tables
/// add.
pub struct Pair {
    pub a: Server,
    pub b: Server,
    pub proxy: Proxy,
    pub redis: RedisServer,
}

/// The `[cluster]` lines of a [`Pair`]'s nodes.
#[derive(Default)]
pub struct PairBuilder {
    a: Vec<String>,
    both: Vec<String>,
}

impl Pair {
    pub fn builder() -> PairBuilder {
        PairBuilder::default()
    }
}

impl PairBuilder {
    /// A `[cluster]` line (TOML) for node a only.
    pub fn a(mut self, line: &str) -> Self {
        self.a.push(line.to_owned());
        self
    }

    /// A `[cluster]` line (TOML) for both nodes.
    pub fn both(mut self, line: &str) -> Self {
        self.both.push(line.to_owned());
        self
    }

    /// Starts redis-server, the proxy relaying a's connections with `relay` (see
    /// [`Proxy::start`]), and the nodes `a` and `b`.
    pub async fn start<R, F>(self, relay: R) -> Pair
    where
        R: Fn(TcpStream, TcpStream, watch::Receiver<bool>) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let redis = RedisServer::start();
        let proxy = Proxy::start(redis.port(), relay).await;
        let lines = |lines: &[String]| lines.iter().map(|l| format!("{l}\n")).collect::<String>();
        let a_table = format!("[cluster]\n{}{}", lines(&self.a), lines(&self.both));
        let a = super::start_configured(&a_table, &["--redis", &proxy.url(), "--node-id", "a"]);
        let b = if self.both.is_empty() {
            node(&redis, "b")
        } else {
            node_with_settings(&redis, "b", &self.both.join("\n"))
        };
        Pair { a, b, proxy, redis }
    }
}
