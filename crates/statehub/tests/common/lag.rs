//! Helpers of the reader-lag tests (`cluster.mqtt_reader_lag_limit`, decision 0004):
//! a relay that holds a node's MQTT stream reader, QoS 1 publishers that send without
//! waiting and count their PUBACKs, and what Redis says of the stream's numbering.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::proxy::{contains, hold_while};
use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{publish, RawClient};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Every wait of these tests is for something that happens within a few Redis
/// timeouts; this bounds them on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The proxy's relay between a node and redis-server: while `stall` is set, a
/// connection that sends an `XREAD` of the MQTT stream is held: nothing it sends
/// reaches Redis until `stall` is cleared.
pub async fn relay(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    hold_while(client, upstream, stall, |chunk| {
        contains(chunk, b"XREAD") && contains(chunk, b"mqtt:feed")
    })
    .await;
}

/// A publisher's PUBACKs, counted as they come by a task.
pub struct Acks {
    pub acked: Arc<AtomicUsize>,
    pub task: tokio::task::JoinHandle<RawClient>,
}

impl Acks {
    pub fn count(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }
}

/// Sends QoS 1 PUBLISHes `{prefix}1..={prefix}{n}` on `topic` without waiting, then
/// counts their PUBACKs (each Success, each within `within`) in a task.
pub async fn publish_all(
    mut publisher: RawClient,
    topic: &str,
    prefix: &str,
    n: u16,
    within: Duration,
) -> Acks {
    for i in 1..=n {
        let mut p = publish(topic, QoS::AtLeastOnce, format!("{prefix}{i}").as_bytes());
        p.packet_id = Some(1000 + i);
        publisher.send(&Packet::Publish(p)).await;
    }
    let acked = Arc::new(AtomicUsize::new(0));
    let count = acked.clone();
    let task = tokio::spawn(async move {
        for _ in 0..n {
            match publisher.expect_within(within).await {
                Packet::PubAck(a) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
                other => panic!("expected PUBACK, got {other:?}"),
            }
            count.fetch_add(1, Ordering::Relaxed);
        }
        publisher
    });
    Acks { acked, task }
}

/// Waits until `done` holds, polling; fails after [`PATIENCE`].
pub async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The stream's head number (entries ever appended) and `node`'s reader's position,
/// as Redis has them (default namespace).
pub fn head_and_position(redis: &RedisServer, node: &str) -> (u64, Option<u64>) {
    let number = |key: &str| redis.command(&["GET", key]).trim().parse::<u64>().ok();
    let head = number("{statehub}:mqtt:seq").unwrap_or(0);
    (head, number(&format!("{{statehub}}:mqtt:read:{node}")))
}

/// The payloads of the next `n` messages `sub` gets (each acknowledged), within
/// `within` each.
pub async fn receive_within(sub: &mut RawClient, n: usize, within: Duration) -> Vec<String> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        let p = match sub.expect_within(within).await {
            Packet::Publish(p) => p,
            other => panic!("expected a message ({} so far), got {other:?}", got.len()),
        };
        sub.ack(&p).await;
        got.push(String::from_utf8_lossy(&p.payload).into_owned());
    }
    got
}

/// Whether `got` has `prefix`1..=`n` each once and in order (other messages between
/// them aside).
pub fn in_order(got: &[String], prefix: &str, n: u16) -> bool {
    let mine: Vec<&String> = got.iter().filter(|p| p.starts_with(prefix)).collect();
    let want: Vec<String> = (1..=n).map(|i| format!("{prefix}{i}")).collect();
    mine.len() == want.len() && mine.iter().zip(&want).all(|(a, b)| *a == b)
}

/// How a node of these tests reaches Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Direct,
    /// Through a proxy of its own that can hold its MQTT stream reader ([`relay`]).
    Held,
}

/// A node of these tests, with the proxy its reader can be held at.
pub struct LagNode {
    pub server: super::Server,
    pub proxy: Option<super::proxy::Proxy>,
}

impl LagNode {
    /// Holds (`true`) or releases this node's MQTT stream reader.
    pub fn hold_reader(&self, held: bool) {
        let proxy = self
            .proxy
            .as_ref()
            .expect("a node whose reader can be held");
        proxy.stall.send_replace(held);
    }
}

impl std::ops::Deref for LagNode {
    type Target = super::Server;
    fn deref(&self) -> &super::Server {
        &self.server
    }
}

/// Starts `nodes` (id and link) on `redis` with `[cluster]` `settings`, the last first:
/// each finds the ones after it in the groups hash as it starts.
pub async fn lag_nodes<const N: usize>(
    redis: &RedisServer,
    settings: &str,
    nodes: [(&str, Link); N],
) -> [LagNode; N] {
    let toml = format!("[cluster]\n{settings}\n");
    let mut started = Vec::with_capacity(N);
    for (id, link) in nodes.into_iter().rev() {
        let proxy = match link {
            Link::Direct => None,
            Link::Held => Some(super::proxy::Proxy::start(redis.port(), relay).await),
        };
        let url = proxy.as_ref().map_or_else(|| redis.url(), |p| p.url());
        let server = super::start_configured(&toml, &["--redis", &url, "--node-id", id]);
        started.push(LagNode { server, proxy });
    }
    started.reverse();
    started
        .try_into()
        .unwrap_or_else(|_| unreachable!("one node per id"))
}

/// Publishes `payload` on `topic` at QoS 1 from `publisher` and waits for its PUBACK.
pub async fn publish_one(publisher: &mut RawClient, topic: &str, payload: &str) {
    let mut p = publish(topic, QoS::AtLeastOnce, payload.as_bytes());
    p.packet_id = Some(publisher.next_packet_id());
    publisher.send(&Packet::Publish(p)).await;
    publisher
        .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
        .await;
}

/// A first message from each of `publishers` reached each of `subs` (every reader
/// reads).
pub async fn warm_up(publishers: &mut [RawClient], subs: &mut [&mut RawClient], topic: &str) {
    for (i, p) in publishers.iter_mut().enumerate() {
        let warm = format!("warm-{i}");
        publish_one(p, topic, &warm).await;
        for sub in subs.iter_mut() {
            let got = receive_within(sub, 1, PATIENCE).await;
            assert_eq!(got, [warm.as_str()]);
        }
    }
}
