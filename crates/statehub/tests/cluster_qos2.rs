//! QoS 2 exactly once across statehub nodes on one redis-server (`--redis`) when a
//! persistent session moves while messages are published for it, on its node and on
//! another: its node killed (SIGKILL) in the middle of it. The subscriber is a QoS 2 receiver as
//! the spec has it (a PUBLISH whose packet id it received and has not seen released
//! is the same message again): a second copy under another packet id, which a replay
//! of the stream would make, is a second delivery to its application.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use common::cluster::node_with_ttl;
use statehub_broker::codec::{Codec, Packet, ProtocolVersion, PubResponse, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, publish, Event, RawClient, V5};

/// Short, so the killed node is found dead quickly.
const TTL_MS: u64 = 2000;

/// Sends `p`; false if the connection is gone.
async fn try_send(c: &mut RawClient, p: &Packet) -> bool {
    let mut out = BytesMut::new();
    Codec::with_version(ProtocolVersion::V5, 0)
        .encode(p, &mut out)
        .unwrap();
    c.try_send_raw(&out).await
}

/// A QoS 2 receiver: what it delivered to its application, in order, and the packet
/// ids it received and has not seen released (kept across connections, as its session).
#[derive(Default)]
struct Receiver {
    pending: HashSet<u16>,
    delivered: Vec<String>,
}

impl Receiver {
    /// Takes part in every exchange until the connection ends or nothing comes for
    /// `quiet`.
    async fn run(&mut self, c: &mut RawClient, quiet: Duration) {
        loop {
            match c.next_event(quiet).await {
                Event::Packet(Packet::Publish(p)) => {
                    assert_eq!(p.qos, QoS::ExactlyOnce, "{p:?}");
                    let id = p.packet_id.unwrap();
                    if self.pending.insert(id) {
                        self.delivered
                            .push(String::from_utf8(p.payload.to_vec()).unwrap());
                    }
                    if !try_send(c, &Packet::PubRec(PubResponse::ok(id))).await {
                        return;
                    }
                }
                Event::Packet(Packet::PubRel(r)) => {
                    self.pending.remove(&r.packet_id);
                    if !try_send(c, &Packet::PubComp(PubResponse::ok(r.packet_id))).await {
                        return;
                    }
                }
                Event::Packet(other) => panic!("unexpected {other:?}"),
                Event::Timeout | Event::Closed | Event::DecodeError(_) => return,
            }
        }
    }
}

/// QoS 2 messages `{name}-0`, `{name}-1`... on `w/1` through `addr` until its
/// connection ends or `stop` is set: the numbers of those the node received
/// (PUBREC), and of the last one sent (which the node may have routed before it died).
async fn publish_until_closed(
    addr: std::net::SocketAddr,
    name: String,
    received: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> (Vec<usize>, usize) {
    let mut c = RawClient::connect(addr, V5, &name).await;
    let mut acked = Vec::new();
    for n in 0.. {
        if stop.load(Ordering::Relaxed) {
            return (acked, n);
        }
        let id = c.next_packet_id();
        let payload = format!("{name}-{n}");
        let p = statehub_broker::codec::Publish {
            packet_id: Some(id),
            ..publish("w/1", QoS::ExactlyOnce, payload.as_bytes())
        };
        if !try_send(&mut c, &Packet::Publish(p)).await {
            return (acked, n);
        }
        match c.next_event(Duration::from_secs(30)).await {
            Event::Packet(Packet::PubRec(r)) if r.reason_code == ReasonCode::SUCCESS => {}
            _ => return (acked, n),
        }
        acked.push(n);
        received.fetch_add(1, Ordering::Relaxed);
        if !try_send(&mut c, &Packet::PubRel(PubResponse::ok(id))).await {
            return (acked, n);
        }
        match c.next_event(Duration::from_secs(30)).await {
            Event::Packet(Packet::PubComp(_)) => {}
            _ => return (acked, n),
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qos_2_subscriber_gets_each_message_once_when_its_node_dies_while_publishing() {
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let (mut sub, ack) = RawClient::connect_with(a.mqtt, persistent_connect("exact", 300)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    sub.subscribe("w/#", opts(QoS::ExactlyOnce)).await;
    let received = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Two publish on the subscriber's node (their copies are routed there at once),
    // two on the other (their messages reach it through the stream).
    let publishers: Vec<_> = [a.mqtt, a.mqtt, b.mqtt, b.mqtt]
        .into_iter()
        .enumerate()
        .map(|(p, addr)| {
            let name = format!("p{p}");
            tokio::spawn(publish_until_closed(
                addr,
                name,
                received.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let mut receiver = Receiver::default();
    // The subscriber takes part while they publish, until its node is killed.
    let watching = tokio::spawn(async move {
        receiver.run(&mut sub, Duration::from_secs(30)).await;
        receiver
    });
    while received.load(Ordering::Relaxed) < 60 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    a.kill();
    stop.store(true, Ordering::Relaxed);
    let mut receiver = watching.await.unwrap();
    let mut sent = BTreeMap::new();
    for (p, publisher) in publishers.into_iter().enumerate() {
        sent.insert(format!("p{p}"), publisher.await.unwrap());
    }

    let mut sub = loop {
        let (c, ack) = RawClient::connect_with(b.mqtt, persistent_connect("exact", 300)).await;
        if ack.reason_code == ReasonCode::SUCCESS {
            assert!(ack.session_present, "the dead node's session");
            break c;
        }
        assert!(
            [ReasonCode::SERVER_BUSY, ReasonCode::UNSPECIFIED_ERROR].contains(&ack.reason_code),
            "{ack:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    receiver.run(&mut sub, Duration::from_secs(3)).await;

    for (name, (acked, last)) in &sent {
        let prefix = format!("{name}-");
        let got: Vec<usize> = receiver
            .delivered
            .iter()
            .filter_map(|m| m.strip_prefix(&prefix)?.parse().ok())
            .collect();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "{name}'s messages once each, in order: {got:?}"
        );
        let missed: Vec<&usize> = acked.iter().filter(|n| !got.contains(n)).collect();
        assert!(
            missed.is_empty(),
            "{name}: received, never delivered: {missed:?}"
        );
        assert!(got.iter().all(|n| n <= last), "{name}: {got:?} past {last}");
    }
}
