//! A persistent session handed over while its node cannot reach Redis (decision
//! 0005, "Origins" and "A refused copy"), with a message of that node whose
//! append Redis executes only after the new node took the session (a network that
//! delivered it late): the subscriber, a QoS 2 receiver, gets every message once. The
//! old node's Redis link is a proxy in this test that holds back its MQTT stream
//! writer's pipelines only (its reader, session writer and liveness go on), or
//! those of its stream writer, session writer and liveness once they carry a given
//! message (the node lost Redis for what matters).

mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::cluster::{publish_acked, Pair};
use common::proxy::Proxy;
use common::Server;
use statehub_broker::codec::{Packet, PubResponse, Publish, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, publish, Event, RawClient, V5};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// Every wait of this test is for something that happens within a few Redis
/// timeouts; this bounds them on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(60);

/// The first command of every pipeline of the MQTT stream writer, which no other
/// Redis client of statehub sends.
const PING: &[u8] = b"$4\r\nPING\r\n";

/// The proxy's relay between a node and redis-server: while `stall` is set, a
/// connection that sends a pipeline starting with PING (the stream writer's) is held:
/// what it sends from then on waits in the proxy until `stall` is cleared, and is
/// then sent on, even if the node gave up on it and closed the connection meanwhile.
async fn relay(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    relay_holding(client, upstream, stall, &[PING]).await;
}

/// As [`relay`], holding the connections that carry the message `a-late` (node a's
/// stream writer's append of it, its session writer's copy of it) and the one that
/// renews a's liveness key: a has lost Redis for everything that matters here.
async fn relay_late(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    relay_holding(client, upstream, stall, &[b"a-late", ALIVE_A]).await;
}

/// The relay; `markers`: what a chunk must contain (one of them) for its connection
/// to be held.
async fn relay_holding(
    client: TcpStream,
    upstream: TcpStream,
    mut stall: watch::Receiver<bool>,
    markers: &'static [&'static [u8]],
) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_redis, mut to_redis) = upstream.into_split();
    tokio::spawn(async move {
        // Replies go back while the node listens; after that they are read and dropped.
        let mut buf = vec![0u8; 16 << 10];
        let mut listening = true;
        while let Ok(n) = from_redis.read(&mut buf).await {
            if n == 0 {
                break;
            }
            listening = listening && to_client.write_all(&buf[..n]).await.is_ok();
        }
    });
    let mut held: Option<Vec<u8>> = None;
    let mut client_open = true;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        let stalling = *stall.borrow_and_update();
        if !stalling {
            if let Some(late) = held.take() {
                if to_redis.write_all(&late).await.is_err() {
                    return;
                }
            }
        }
        if !client_open && held.is_none() {
            // Kept open: Redis reads what was sent late before it sees the close.
            std::future::pending::<()>().await;
        }
        tokio::select! {
            read = from_client.read(&mut buf), if client_open => {
                let chunk = match read {
                    Ok(0) | Err(_) => {
                        client_open = false;
                        continue;
                    }
                    Ok(n) => &buf[..n],
                };
                // As the flag is now: it may have been set while this read waited.
                let stalling = *stall.borrow();
                let marked = markers
                    .iter()
                    .any(|m| chunk.windows(m.len()).any(|w| w == *m));
                if held.is_none() && stalling && marked {
                    held = Some(Vec::new());
                }
                match &mut held {
                    Some(late) => late.extend_from_slice(chunk),
                    None => {
                        if to_redis.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                }
            }
            changed = stall.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs one command with `redis-cli`; its output.
fn redis_cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// How many entries the message stream has.
fn stream_len(redis: &RedisServer) -> u64 {
    let feed = redis_cli(redis, &["--scan", "--pattern", "*:mqtt:feed"]);
    redis_cli(redis, &["XLEN", &feed]).parse().unwrap()
}

/// Publishes `payload` at QoS 2 and completes the exchange if it is received; the
/// PUBREC's reason code (waited for as long as the node takes to answer).
async fn publish_qos2(c: &mut RawClient, payload: &[u8]) -> ReasonCode {
    let id = c.next_packet_id();
    let p = Publish {
        packet_id: Some(id),
        ..publish("w/1", QoS::ExactlyOnce, payload)
    };
    c.send(&Packet::Publish(p)).await;
    let rec = match c.next_event(PATIENCE).await {
        Event::Packet(Packet::PubRec(rec)) => rec,
        other => panic!("expected PUBREC, got {other:?}"),
    };
    if rec.reason_code == ReasonCode::SUCCESS {
        c.send(&Packet::PubRel(PubResponse::ok(id))).await;
        match c.next_event(PATIENCE).await {
            Event::Packet(Packet::PubComp(_)) => {}
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
    }
    rec.reason_code
}

/// A QoS 2 receiver as the spec has it: a PUBLISH whose packet id it received and
/// has not seen released is the same message again. Kept across connections, as its
/// session.
#[derive(Default)]
struct Receiver {
    pending: HashSet<u16>,
}

impl Receiver {
    /// Takes part in the exchanges until a new message is delivered; its payload.
    async fn next(&mut self, c: &mut RawClient) -> String {
        loop {
            if let Some(payload) = self.step(c).await {
                return payload;
            }
        }
    }

    /// Takes part until every message received was released.
    async fn settle(&mut self, c: &mut RawClient) {
        while !self.pending.is_empty() {
            assert_eq!(self.step(c).await, None, "nothing else was sent");
        }
    }

    async fn step(&mut self, c: &mut RawClient) -> Option<String> {
        let step = self.step_within(c, PATIENCE).await;
        assert_ne!(step.as_deref(), Some(QUIET), "pending {:?}", self.pending);
        step
    }

    /// As [`Receiver::step`]; [`QUIET`] if nothing came `within`.
    async fn step_within(&mut self, c: &mut RawClient, within: Duration) -> Option<String> {
        match c.next_event(within).await {
            Event::Packet(Packet::Publish(p)) if p.qos == QoS::AtMostOnce => {
                Some(String::from_utf8(p.payload.to_vec()).unwrap())
            }
            Event::Packet(Packet::Publish(p)) => {
                assert_eq!(p.qos, QoS::ExactlyOnce, "{p:?}");
                let id = p.packet_id.unwrap();
                c.send(&Packet::PubRec(PubResponse::ok(id))).await;
                self.pending
                    .insert(id)
                    .then(|| String::from_utf8(p.payload.to_vec()).unwrap())
            }
            Event::Packet(Packet::PubRel(r)) => {
                self.pending.remove(&r.packet_id);
                c.send(&Packet::PubComp(PubResponse::ok(r.packet_id))).await;
                None
            }
            Event::Packet(Packet::Disconnect(_)) | Event::Closed => Some(CLOSED.to_owned()),
            Event::Timeout => Some(QUIET.to_owned()),
            other => panic!("unexpected {other:?} (pending {:?})", self.pending),
        }
    }
}

/// The persistent subscriber `mover` on node `a`, subscribed to `filter` at QoS 2.
async fn mover(a: &Server, filter: &str) -> RawClient {
    let (mut sub, ack) = RawClient::connect_with(a.mqtt, persistent_connect("mover", 300)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    sub.subscribe(filter, opts(QoS::ExactlyOnce)).await;
    sub
}

/// Lets the proxy send on what it held and waits until the held append ran (the
/// stream grew); the deadline of that wait, which the test's next waits share.
async fn release_held_append(redis: &RedisServer, proxy: &Proxy) -> tokio::time::Instant {
    let before = stream_len(redis);
    proxy.stall.send_replace(false);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stream_len(redis) == before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held append never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    deadline
}

/// Connects `id` to `addr` resuming its session, retrying while the node says it is
/// busy moving it.
async fn resume(addr: SocketAddr, id: &str) -> RawClient {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let mut c = RawClient::open(addr, V5).await;
        c.send(&Packet::Connect(Box::new(persistent_connect(id, 300))))
            .await;
        let ack = match c.next_event(PATIENCE).await {
            Event::Packet(Packet::ConnAck(ack)) => ack,
            other => panic!("expected CONNACK, got {other:?}"),
        };
        if ack.reason_code == ReasonCode::SUCCESS {
            assert!(ack.session_present, "the session moved");
            return c;
        }
        assert!(
            [ReasonCode::SERVER_BUSY, ReasonCode::UNSPECIFIED_ERROR].contains(&ack.reason_code),
            "{ack:?}"
        );
        assert!(tokio::time::Instant::now() < deadline, "never resumed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_handed_over_while_its_node_cannot_append_gets_each_message_once() {
    // A held pipeline fails after `timeout_ms`: its publisher is refused, and so is the
    // flush that would give the hand-over its bound.
    let Pair { a, b, proxy, redis } = Pair::builder().a("timeout_ms = 3000").start(relay).await;
    let mut sub = mover(&a, "w/#").await;
    let mut on_a = RawClient::connect(a.mqtt, V5, "on-a").await;
    let mut on_b = RawClient::connect(b.mqtt, V5, "on-b").await;
    let ok = ReasonCode::SUCCESS;
    assert_eq!(
        publish_acked(&mut on_a, "w/1", QoS::ExactlyOnce, b"a-0").await,
        ok
    );
    assert_eq!(
        publish_acked(&mut on_b, "w/1", QoS::ExactlyOnce, b"b-0").await,
        ok
    );
    let mut receiver = Receiver::default();
    let mut delivered = vec![receiver.next(&mut sub).await, receiver.next(&mut sub).await];

    proxy.stall.send_replace(true);
    // Routed to the session's copy on a (its session writer still reaches Redis),
    // its append held back: refused to its publisher, and its copy taken back.
    assert_ne!(
        publish_qos2(&mut on_a, b"a-late").await,
        ok,
        "its append is held"
    );
    let (on_a_after, closed) = until_marker(&mut receiver, &mut sub, &mut on_a, PATIENCE).await;
    assert!(!closed);
    delivered.extend(on_a_after);
    receiver.settle(&mut sub).await;
    sub.disconnect().await;
    // b asks a for the session; a's flush fails, so it releases it without a bound.
    let mut sub = resume(b.mqtt, "mover").await;
    let deadline = release_held_append(&redis, &proxy).await;
    // After the late entry (which b's reader gives the session, once): a's writer
    // answers again (a refusal is a message never acknowledged, which may arrive
    // once or not at all).
    let mut after = 0;
    while publish_qos2(&mut on_a, format!("a-after-{after}").as_bytes()).await != ok {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a never appends again"
        );
        after += 1;
        // Refused until a's writer reached Redis again (it retries every 250 ms).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        publish_acked(&mut on_b, "w/1", QoS::ExactlyOnce, b"b-after").await,
        ok
    );
    let last = format!("a-after-{after}");
    let mut seen_b_after = false;
    while !(delivered.contains(&last) && seen_b_after) {
        let got = receiver.next(&mut sub).await;
        seen_b_after |= got == "b-after";
        delivered.push(got);
    }
    let mut each = delivered.clone();
    each.sort();
    each.dedup();
    assert_eq!(each.len(), delivered.len(), "each once: {delivered:?}");
    for acked in ["a-0", "b-0", "a-late", "b-after", &last] {
        assert!(
            delivered.iter().any(|d| d == acked),
            "{acked}: {delivered:?}"
        );
    }
}

/// What [`Receiver::next`] says when the connection is closed.
const CLOSED: &str = "(closed)";

/// What [`Receiver::step_within`] says when nothing came.
const QUIET: &str = "(quiet)";

/// Publishes a QoS 0 marker on the subscriber's node and takes what the subscriber
/// gets until it (a copy of a refused message given then would come before it), or
/// until its connection is closed, or until nothing came for `quiet` (the marker
/// waits behind a copy that is not given): the payloads, marker left out, and
/// whether it was closed.
async fn until_marker(
    receiver: &mut Receiver,
    sub: &mut RawClient,
    publisher: &mut RawClient,
    quiet: Duration,
) -> (Vec<String>, bool) {
    let ok = ReasonCode::SUCCESS;
    assert_eq!(
        publish_acked(publisher, "w/1", QoS::AtMostOnce, b"marker").await,
        ok
    );
    let mut got = Vec::new();
    loop {
        let Some(step) = receiver.step_within(sub, quiet).await else {
            continue;
        };
        match step {
            marker if marker == "marker" || marker == QUIET => return (got, false),
            closed if closed == CLOSED => return (got, true),
            payload => got.push(payload),
        }
    }
}

/// The old node lost Redis: a QoS 2 message published there is refused, and its
/// copy for the session cannot be written, nor can anything after it; the session
/// is taken from the node as from a dead one (its liveness lapses). Had the copy
/// been given to the subscriber with the refusal, no record would say so, and the
/// message's late entry would reach it a second time through the new node's reader.
/// It is taken back instead, and the late entry gives it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_qos_2_copy_is_taken_back_and_given_once_when_its_entry_lands_late() {
    let delivered = refused_copy_moves("w/#", PATIENCE).await;
    for each in ["a-0", "a-late", "b-first", "b-second", "b-after"] {
        let n = delivered.iter().filter(|d| *d == each).count();
        assert_eq!(n, 1, "{each} once: {delivered:?}");
    }
}

/// As above, the subscriber a member of a shared group: its copy of the refused
/// message is not taken back (only the group's pick could give it again), and its
/// record cannot be written. Given with the refusal, its packet id stayed with the
/// receiver (PUBREC, no PUBREL), and b, which knows nothing of it, gave that id to
/// `b-second`, which the receiver then took for the first again: lost. The copy
/// waits until its record is written instead; it never is (b owns the session by
/// then), so the group never gets the refused message, and b's messages all arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_shared_qos_2_copy_is_given_only_once_stored_so_its_id_is_never_reused() {
    let delivered = refused_copy_moves("$share/g/w/#", Duration::from_secs(3)).await;
    for each in ["a-0", "b-first", "b-second", "b-after"] {
        let n = delivered.iter().filter(|d| *d == each).count();
        assert_eq!(n, 1, "{each} once: {delivered:?}");
    }
    let late = delivered.iter().filter(|d| *d == "a-late").count();
    assert!(late <= 1, "{delivered:?}");
}

/// The scenario of the two tests above, the subscriber subscribed with `filter`;
/// `quiet`: how long the subscriber on a is listened to without anything coming.
/// What the subscriber was given, in order.
async fn refused_copy_moves(filter: &str, quiet: Duration) -> Vec<String> {
    let Pair { a, b, proxy, redis } = Pair::builder()
        .a("timeout_ms = 1000")
        .both("mqtt_node_ttl_ms = 2000")
        .start(relay_late)
        .await;
    let mut sub = mover(&a, filter).await;
    let mut on_a = RawClient::connect(a.mqtt, V5, "on-a").await;
    let ok = ReasonCode::SUCCESS;
    assert_eq!(
        publish_acked(&mut on_a, "w/1", QoS::ExactlyOnce, b"a-0").await,
        ok
    );
    let mut receiver = Receiver::default();
    let mut delivered = vec![receiver.next(&mut sub).await];
    receiver.settle(&mut sub).await;

    proxy.stall.send_replace(true);
    assert_ne!(
        publish_qos2(&mut on_a, b"a-late").await,
        ok,
        "its append is held"
    );
    // Before, the copy went to the subscriber with the refusal (and its connection
    // was closed when the release of it could not be stored).
    let (on_a_after, closed) = until_marker(&mut receiver, &mut sub, &mut on_a, quiet).await;
    delivered.extend(on_a_after);
    if !closed {
        sub.disconnect().await;
    }
    // a's liveness lapses; b takes the session as Redis has it.
    let mut sub = resume(b.mqtt, "mover").await;
    let mut on_b = RawClient::connect(b.mqtt, V5, "on-b").await;
    // b numbers the session's messages from what Redis has: one of these goes under
    // the packet id a gave the refused copy, if a gave it (a QoS 2 receiver takes it
    // for that message again), and the late entry then comes under another one.
    for payload in [&b"b-first"[..], b"b-second"] {
        assert_eq!(
            publish_acked(&mut on_b, "w/1", QoS::ExactlyOnce, payload).await,
            ok
        );
    }
    release_held_append(&redis, &proxy).await;
    assert_eq!(
        publish_acked(&mut on_b, "w/1", QoS::ExactlyOnce, b"b-after").await,
        ok
    );
    while !delivered.iter().any(|d| d == "b-after") {
        delivered.push(receiver.next(&mut sub).await);
    }
    delivered
}

/// The chunk that renews node a's liveness key (`{ns}:mqtt:alive:a#{run}`).
const ALIVE_A: &[u8] = b"alive:a";

/// As [`relay`], holding the connection that renews node a's liveness key.
async fn relay_liveness(client: TcpStream, upstream: TcpStream, stall: watch::Receiver<bool>) {
    relay_holding(client, upstream, stall, &[ALIVE_A]).await;
}

/// Decision 0005, "Origins", case 1: a node that still holds a session ends its copy
/// on another node's takeover announcement (the new node took it as from a dead
/// node: a's liveness key lapsed while a went on). The old connection is closed with
/// 0x8E; what a published afterwards reaches the session once, on the new node; the
/// message its copy had given and not seen acknowledged is resent there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_ends_its_copy_of_a_session_taken_as_from_a_dead_node_on_the_announcement() {
    let Pair { a, b, proxy, redis } = Pair::builder()
        .both("mqtt_node_ttl_ms = 2000")
        .start(relay_liveness)
        .await;
    let mut old = mover(&a, "w/#").await;
    let mut on_a = RawClient::connect(a.mqtt, V5, "on-a").await;
    let ok = ReasonCode::SUCCESS;
    assert_eq!(
        publish_acked(&mut on_a, "w/1", QoS::ExactlyOnce, b"a-0").await,
        ok
    );
    // Received on a and never acknowledged there.
    let first = old.expect_publish().await;
    assert_eq!(&first.payload[..], b"a-0");

    proxy.stall.send_replace(true);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !redis_cli(&redis, &["--scan", "--pattern", "*alive:a#*"]).is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a's liveness key never lapsed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // b takes the session without asking a (a passes for dead), then announces it.
    let mut new = resume(b.mqtt, "mover").await;
    old.expect_disconnect_within(ReasonCode::SESSION_TAKEN_OVER, PATIENCE)
        .await;
    let mut receiver = Receiver::default();
    receiver.pending.insert(first.packet_id.unwrap());
    assert_eq!(
        publish_acked(&mut on_a, "w/1", QoS::ExactlyOnce, b"a-1").await,
        ok
    );
    assert_eq!(receiver.next(&mut new).await, "a-1", "a-0 resent, not new");
    receiver.settle(&mut new).await;
    proxy.stall.send_replace(false);
}
