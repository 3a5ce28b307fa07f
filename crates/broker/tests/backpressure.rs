//! Publisher back-pressure: QoS 1 publishers that outrun their subscribers wait for
//! them (their connections stop being read) instead of the subscribers being cut off
//! as slow consumers; only a subscriber that stops reading is one, after
//! `slow_consumer_timeout_secs`.
//!
//! The clients here are raw: each one pipelines its QoS 1 PUBLISHes (a window of
//! them unacknowledged) and reads its deliveries in one task, acknowledging each, so
//! what the broker holds back is exactly what the test sees. Subscribers read a
//! little at a time with a pause between reads: slower than the publishers, but
//! always reading.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BytesMut;
use statehub_broker::codec::{ConnectProperties, Packet, PubResponse, QoS, ReasonCode};
use statehub_broker::{Broker, BrokerConfig};
use statehub_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// Small bounds, so a few thousand messages show the behaviour: the hard bound
/// (1.5 x `max_queued_messages`, where a connected session is cut off) is 75, the
/// high-water mark 10.
fn config() -> BrokerConfig {
    BrokerConfig {
        max_queued_messages: 50,
        backpressure_high_water: 10,
        socket_write_high_water: 16 * 1024,
        ..Default::default()
    }
}

/// What one client publishes: `count` QoS 1 messages on `topic`, at most `window`
/// unacknowledged, each payload `"{tag}:{seq}"`.
#[derive(Debug, Clone)]
struct Plan {
    tag: String,
    topic: String,
    count: u32,
    window: u32,
}

/// What one client saw.
#[derive(Debug, Default)]
struct Report {
    /// Per publisher tag, the sequence numbers received, in order.
    received: HashMap<String, Vec<u32>>,
    total: usize,
    acked: u32,
    disconnect: Option<ReasonCode>,
    closed: bool,
}

impl Report {
    /// Panics unless `tag`'s `count` messages all arrived, once each, in order.
    fn assert_all_from(&self, who: &str, tag: &str, count: u32) {
        let got = self.received.get(tag).map(Vec::as_slice).unwrap_or(&[]);
        let want: Vec<u32> = (0..count).collect();
        assert!(
            got == want.as_slice(),
            "{who}: from {tag} got {} of {count} messages (in order: {}); disconnect {:?}, closed {}",
            got.len(),
            got.windows(2).all(|w| w[0] < w[1]),
            self.disconnect,
            self.closed,
        );
    }
}

/// Connects `id` (MQTT 5), subscribed at QoS 1 to `filter` if given.
async fn client(addr: SocketAddr, id: &str, filter: Option<&str>) -> RawClient {
    let mut c = RawClient::connect(addr, V5, id).await;
    if let Some(f) = filter {
        c.subscribe(f, opts(QoS::AtLeastOnce)).await;
    }
    c
}

/// Runs a client until it has published and had acknowledged all of `plan` and
/// received `expect` messages, or nothing happened for 10 s, or the broker closed it.
/// `read_chunk` bytes are read at a time, with `read_pause` between reads.
async fn run(
    mut c: RawClient,
    plan: Option<Plan>,
    expect: usize,
    read_chunk: usize,
    read_pause: Duration,
) -> Report {
    let mut r = Report::default();
    let mut rbuf = BytesMut::new();
    let mut out = BytesMut::new();
    let mut sent = 0u32;
    let count = plan.as_ref().map_or(0, |p| p.count);
    while r.acked < count || r.total < expect {
        if let Some(p) = &plan {
            while sent < p.count && sent - r.acked < p.window {
                let mut m = publish(
                    &p.topic,
                    QoS::AtLeastOnce,
                    format!("{}:{sent}", p.tag).as_bytes(),
                );
                m.packet_id = Some((sent % 65_000) as u16 + 1);
                c.codec.encode(&Packet::Publish(m), &mut out).unwrap();
                sent += 1;
            }
        }
        if !out.is_empty() && c.stream.write_all(&out).await.is_err() {
            r.closed = true;
            return r;
        }
        out.clear();
        rbuf.reserve(read_chunk);
        let mut chunk = vec![0u8; read_chunk];
        match tokio::time::timeout(Duration::from_secs(10), c.stream.read(&mut chunk)).await {
            Err(_) => return r,
            Ok(Ok(0)) | Ok(Err(_)) => {
                r.closed = true;
                return r;
            }
            Ok(Ok(n)) => rbuf.extend_from_slice(&chunk[..n]),
        }
        while let Some(p) = c.codec.decode(&mut rbuf).expect("decode") {
            match p {
                Packet::PubAck(a) => {
                    assert!(a.reason_code.is_success(), "PUBACK {a:?}");
                    r.acked += 1;
                }
                Packet::Publish(m) => {
                    let text = std::str::from_utf8(&m.payload).unwrap();
                    let (tag, seq) = text.split_once(':').unwrap();
                    let list = r.received.entry(tag.to_owned()).or_default();
                    list.push(seq.parse().unwrap());
                    r.total += 1;
                    let ack = PubResponse::ok(m.packet_id.unwrap());
                    c.codec.encode(&Packet::PubAck(ack), &mut out).unwrap();
                }
                Packet::Disconnect(d) => {
                    r.disconnect = Some(d.reason_code);
                    return r;
                }
                _ => {}
            }
        }
        if !read_pause.is_zero() {
            tokio::time::sleep(read_pause).await;
        }
    }
    r
}

/// A subscriber that reads slower than the publishers publish, but keeps reading.
fn slow_reader(c: RawClient, expect: usize) -> tokio::task::JoinHandle<Report> {
    tokio::spawn(run(c, None, expect, 256, Duration::from_millis(1)))
}

/// A publisher of `plan` that reads everything it is sent at once.
fn publisher(c: RawClient, plan: Plan, expect: usize) -> tokio::task::JoinHandle<Report> {
    tokio::spawn(run(c, Some(plan), expect, 64 * 1024, Duration::ZERO))
}

fn plan(tag: &str, topic: &str, count: u32, window: u32) -> Plan {
    Plan {
        tag: tag.into(),
        topic: topic.into(),
        count,
        window,
    }
}

fn slow_consumers(broker: &Broker) -> u64 {
    broker.metrics().slow_consumers.load(Ordering::Relaxed)
}

/// N publishers flood M QoS 1 subscribers that keep reading, each slower than the
/// publishers together: every message arrives, in order per publisher, and nobody is
/// cut off; the publishers were paused instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishers_wait_for_subscribers_that_keep_reading() {
    let (broker, addr) = start_broker(config()).await;
    const PUBS: u32 = 4;
    const SUBS: usize = 3;
    const EACH: u32 = 1500;
    let mut subs = Vec::new();
    for j in 0..SUBS {
        let c = client(addr, &format!("sub{j}"), Some("bp/all")).await;
        subs.push(slow_reader(c, (PUBS * EACH) as usize));
    }
    let mut pubs = Vec::new();
    for i in 0..PUBS {
        let c = client(addr, &format!("pub{i}"), None).await;
        pubs.push(publisher(c, plan(&format!("p{i}"), "bp/all", EACH, 50), 0));
    }
    for (i, p) in pubs.into_iter().enumerate() {
        let r = p.await.unwrap();
        assert_eq!(r.acked, EACH, "publisher {i}: {r:?}");
    }
    for (j, s) in subs.into_iter().enumerate() {
        let r = s.await.unwrap();
        for i in 0..PUBS {
            r.assert_all_from(&format!("sub{j}"), &format!("p{i}"), EACH);
        }
        assert_eq!(r.disconnect, None);
    }
    assert_eq!(slow_consumers(&broker), 0);
    assert!(broker.metrics().publisher_pauses.load(Ordering::Relaxed) > 0);
}

/// Connects a subscriber to `bp/all` with a tiny receive buffer that never reads.
async fn stalled(addr: SocketAddr, id: &str) -> RawClient {
    stalled_on(addr, id, "bp/all").await
}

/// Connects a subscriber to `filter` with a tiny receive buffer that never reads.
async fn stalled_on(addr: SocketAddr, id: &str, filter: &str) -> RawClient {
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = sock.connect(addr).await.unwrap();
    let mut c = RawClient::from_stream(stream, V5);
    let mut connect = connect_packet(V5, id);
    connect.properties = ConnectProperties::default();
    c.send(&Packet::Connect(Box::new(connect))).await;
    assert!(matches!(c.expect().await, Packet::ConnAck(a) if a.reason_code.is_success()));
    c.subscribe(filter, opts(QoS::AtLeastOnce)).await;
    c
}

/// A shared subscription gives the messages to a member below its high-water mark
/// rather than hold the publisher for one that stopped reading: the reading member
/// (never past its mark: the publisher keeps few messages in flight) gets everything
/// but what the stalled one took before it was past its mark, and nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_group_prefers_a_member_with_room() {
    let (broker, addr) = start_broker(BrokerConfig {
        // A wait for the stalled member would last this long and fail the test.
        slow_consumer_timeout_secs: 60,
        ..config()
    })
    .await;
    const N: u32 = 1000;
    let high = config().backpressure_high_water as u32;
    let _stuck = stalled_on(addr, "stuck", "$share/g/bp/shared").await;
    let reader = client(addr, "reader", Some("$share/g/bp/shared")).await;
    let c = client(addr, "pub", None).await;
    let publisher = publisher(c, plan("p", "bp/shared", N, 4), 0);
    let want = (N - high) as usize;
    let reader = tokio::spawn(run(reader, None, want, 64 * 1024, Duration::ZERO));
    let p = tokio::time::timeout(Duration::from_secs(30), publisher)
        .await
        .expect("the publisher waited for the stalled member")
        .unwrap();
    eprintln!(
        "DEBUG pauses {} stuck {:?} reader {:?}",
        broker.metrics().publisher_pauses.load(Ordering::Relaxed),
        broker
            .session_snapshot("stuck", 0)
            .map(|s| (s.queued, s.inflight)),
        broker
            .session_snapshot("reader", 0)
            .map(|s| (s.queued, s.inflight))
    );
    assert_eq!(p.acked, N, "{p:?}");
    let r = reader.await.unwrap();
    assert!(
        r.total >= want && r.disconnect.is_none(),
        "the reading member got {} of {N}: {r:?}",
        r.total
    );
    assert_eq!(slow_consumers(&broker), 0);
}

/// A subscriber that stops reading holds the publishers back for
/// `slow_consumer_timeout_secs`, then gets DISCONNECT 0x97; the publishers go on, and
/// a healthy subscriber (slower than them, but reading) gets everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_cut_off_after_the_timeout() {
    let (broker, addr) = start_broker(BrokerConfig {
        slow_consumer_timeout_secs: 1,
        ..config()
    })
    .await;
    const EACH: u32 = 1000;
    let mut stuck = stalled(addr, "stuck").await;
    let healthy = slow_reader(
        client(addr, "healthy", Some("bp/all")).await,
        2 * EACH as usize,
    );
    let pubs: Vec<_> = futures_join(addr, EACH).await;
    for (i, p) in pubs.into_iter().enumerate() {
        let r = p.await.unwrap();
        assert_eq!(r.acked, EACH, "publisher {i}: {r:?}");
    }
    let r = healthy.await.unwrap();
    r.assert_all_from("healthy", "p0", EACH);
    r.assert_all_from("healthy", "p1", EACH);
    assert_eq!(r.disconnect, None);
    assert_eq!(
        slow_consumers(&broker),
        1,
        "only the one that stopped reading"
    );
    // What reached the stalled one's socket, then DISCONNECT 0x97.
    let mut last = None;
    loop {
        match stuck.next_event(Duration::from_secs(10)).await {
            Event::Packet(p) => last = Some(p),
            Event::Closed => break,
            other => panic!("expected packets then the close, got {other:?}"),
        }
    }
    assert!(
        matches!(&last, Some(Packet::Disconnect(d)) if d.reason_code == ReasonCode::QUOTA_EXCEEDED),
        "last packet {last:?}"
    );
}

/// Two publishers of `each` messages on `bp/all`, tags p0 and p1.
async fn futures_join(addr: SocketAddr, each: u32) -> Vec<tokio::task::JoinHandle<Report>> {
    let mut pubs = Vec::new();
    for i in 0..2 {
        let c = client(addr, &format!("pub{i}"), None).await;
        pubs.push(publisher(c, plan(&format!("p{i}"), "bp/all", each, 50), 0));
    }
    pubs
}

/// A publisher subscribed to its own topic is never held back by its own backlog (it
/// could not read the acknowledgements that drain it), while another subscriber still
/// holds it back: both get everything, nobody is cut off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_subscribed_to_its_own_topic_is_not_deadlocked() {
    let (broker, addr) = start_broker(BrokerConfig {
        // A wait for itself would last this long and fail the test.
        slow_consumer_timeout_secs: 60,
        ..config()
    })
    .await;
    const EACH: u32 = 1500;
    let other = slow_reader(client(addr, "other", Some("bp/self")).await, EACH as usize);
    let me = client(addr, "me", Some("bp/self")).await;
    // A window wide enough that its own backlog passes the mark.
    let me = publisher(me, plan("me", "bp/self", EACH, 20), EACH as usize);
    let r = tokio::time::timeout(Duration::from_secs(60), me)
        .await
        .expect("the publisher is stuck")
        .unwrap();
    assert_eq!(r.acked, EACH, "{r:?}");
    r.assert_all_from("me", "me", EACH);
    other.await.unwrap().assert_all_from("other", "me", EACH);
    assert_eq!(slow_consumers(&broker), 0);
}

/// Two clients that publish to each other and read each other's messages do not wait
/// for each other until one is cut off: a connection whose own session others wait
/// for is not paused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_publishing_to_each_other_do_not_deadlock() {
    let (broker, addr) = start_broker(BrokerConfig {
        slow_consumer_timeout_secs: 60,
        ..config()
    })
    .await;
    const EACH: u32 = 2000;
    let a = client(addr, "a", Some("bp/to-a")).await;
    let b = client(addr, "b", Some("bp/to-b")).await;
    let a = tokio::spawn(run(
        a,
        Some(plan("a", "bp/to-b", EACH, 50)),
        EACH as usize,
        512,
        Duration::from_millis(1),
    ));
    let b = tokio::spawn(run(
        b,
        Some(plan("b", "bp/to-a", EACH, 50)),
        EACH as usize,
        512,
        Duration::from_millis(1),
    ));
    let within = Duration::from_secs(50);
    let a = tokio::time::timeout(within, a)
        .await
        .expect("a stuck")
        .unwrap();
    let b = tokio::time::timeout(within, b)
        .await
        .expect("b stuck")
        .unwrap();
    a.assert_all_from("a", "b", EACH);
    b.assert_all_from("b", "a", EACH);
    assert_eq!(slow_consumers(&broker), 0);
}

/// The memory bound: while a subscriber does not read, its backlog stays within the
/// high-water mark plus one message per publisher (each is paused right after the
/// message that found it past the mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_stays_within_the_mark_plus_one_per_publisher() {
    let (broker, addr) = start_broker(BrokerConfig {
        slow_consumer_timeout_secs: 60,
        ..config()
    })
    .await;
    const PUBS: usize = 4;
    let high = config().backpressure_high_water;
    let _stuck = stalled(addr, "stuck").await;
    let mut pubs = Vec::new();
    for i in 0..PUBS {
        let c = client(addr, &format!("pub{i}"), None).await;
        pubs.push(publisher(c, plan(&format!("p{i}"), "bp/all", 1000, 50), 0));
    }
    let depth = || {
        let s = broker.session_snapshot("stuck", 0).expect("session");
        s.queued + s.inflight
    };
    // Every publisher is paused (the backlog stays put), then watched for a while.
    assert!(
        wait_until(Duration::from_secs(10), || {
            broker.metrics().publisher_pauses.load(Ordering::Relaxed) >= PUBS as u64
        })
        .await,
        "not every publisher was paused"
    );
    let mut most = 0;
    for _ in 0..50 {
        most = most.max(depth());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        most >= high,
        "the backlog reached {most}, under the mark {high}"
    );
    assert!(
        most <= high + PUBS,
        "the backlog reached {most}: over the mark {high} + {PUBS} publishers"
    );
    assert_eq!(slow_consumers(&broker), 0);
    for p in pubs {
        p.abort();
    }
}
