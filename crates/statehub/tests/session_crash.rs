//! Persistent sessions under SIGKILL: publishers send QoS 1 and QoS 2 messages, one at
//! a time, to a persistent subscriber that consumes them, while the test kills the
//! server at random moments and restarts it on the same data directory. The clients
//! behave as the protocol asks of them across reconnects (resend what was in flight
//! with DUP and the same packet id; a QoS 2 receiver remembers ids until PUBREL).
//!
//! Checked at the end: every message whose publisher got its PUBACK or PUBCOMP
//! reached the subscriber; QoS 2 messages reached it exactly once; each publisher's
//! messages first arrived in the order they were sent; nothing arrived that was not
//! sent. Iterations alternate `--sync always` and `--sync interval=50`.
//!
//! `SESSION_CRASH_ITERATIONS` (default 16) and `CRASH_SEED` extend or reproduce it.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use common::{start_on, Rng, Server};
use statehub_broker::codec::{
    Connect, ConnectProperties, Packet, ProtocolVersion, PubResponse, Publish, QoS,
    SubscriptionOptions,
};
use statehub_test_support::{bs, Event, RawClient};
use tokio::sync::watch;

const WRITERS: u32 = 3;
const LONG: Duration = Duration::from_secs(5);

fn launch(dir: &Path, sync: &str) -> Server {
    start_on(dir, &["--sync", sync])
}

async fn send(c: &mut RawClient, p: &Packet) -> bool {
    let mut out = BytesMut::new();
    c.codec.encode(p, &mut out).expect("encode");
    c.try_send_raw(&out).await
}

/// Connects with Clean Start 0 and Session Expiry 3600; `None` if the server is gone.
async fn resume(addr: SocketAddr, client_id: &str) -> Option<(RawClient, bool)> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut c = RawClient::from_stream(stream, ProtocolVersion::V5);
    let connect = Connect {
        clean_start: false,
        properties: ConnectProperties {
            session_expiry_interval: Some(3600),
            ..Default::default()
        },
        ..statehub_test_support::connect_packet(ProtocolVersion::V5, client_id)
    };
    if !send(&mut c, &Packet::Connect(Box::new(connect))).await {
        return None;
    }
    match c.next_event(LONG).await {
        Event::Packet(Packet::ConnAck(a)) if a.reason_code.is_success() => {
            Some((c, a.session_present))
        }
        _ => None,
    }
}

fn topic(qos: QoS, writer: u32) -> String {
    format!("crash/{}/{writer}", qos as u8)
}

/// A publisher's state that survives its reconnects (as a real client keeps it).
#[derive(Default)]
struct Writer {
    next: u64,
    /// The message in flight: its number, QoS, packet id and whether PUBREC came.
    in_flight: Option<(u64, QoS, u16, bool)>,
    completed: Vec<(u64, QoS)>,
}

/// Publishes until the connection dies, finishing the in-flight message first.
async fn write(addr: SocketAddr, id: u32, w: &mut Writer, stop_after: Option<u64>) {
    let Some((mut c, _)) = resume(addr, &format!("writer-{id}")).await else {
        return;
    };
    loop {
        let (n, qos, pid, released) = match w.in_flight {
            Some(f) => f,
            None => {
                if stop_after.is_some_and(|last| w.next > last) {
                    return;
                }
                let qos = if w.next % 2 == 1 {
                    QoS::ExactlyOnce
                } else {
                    QoS::AtLeastOnce
                };
                let pid = (w.next % 60_000) as u16 + 1;
                w.in_flight = Some((w.next, qos, pid, false));
                w.next += 1;
                (w.next - 1, qos, pid, false)
            }
        };
        let dup = false;
        let packet = if released {
            Packet::PubRel(PubResponse::ok(pid))
        } else {
            let payload = bytes::Bytes::from(n.to_string());
            Packet::Publish(Publish {
                dup,
                qos,
                topic: bs(&topic(qos, id)),
                packet_id: Some(pid),
                payload,
                ..Default::default()
            })
        };
        if !send(&mut c, &packet).await {
            return;
        }
        loop {
            match c.next_event(LONG).await {
                Event::Packet(Packet::PubAck(a)) if a.packet_id == pid => break,
                Event::Packet(Packet::PubComp(a)) if a.packet_id == pid => break,
                Event::Packet(Packet::PubRec(a)) if a.packet_id == pid => {
                    w.in_flight = Some((n, qos, pid, true));
                    if !send(&mut c, &Packet::PubRel(PubResponse::ok(pid))).await {
                        return;
                    }
                }
                Event::Packet(_) => {}
                _ => return,
            }
        }
        w.completed.push((n, qos));
        w.in_flight = None;
    }
}

/// What the subscriber received, and the QoS 2 ids it holds until PUBREL.
#[derive(Default)]
struct Reader {
    got: Vec<(u32, u64, QoS)>,
    qos2_pending: HashSet<u16>,
}

/// Consumes until the connection dies or `quiet` passes with nothing.
async fn read(addr: SocketAddr, r: &Arc<Mutex<Reader>>, quiet: Duration) {
    let Some((mut c, present)) = resume(addr, "reader").await else {
        return;
    };
    assert!(
        present,
        "the reader's session (and its subscriptions) survived"
    );
    loop {
        let answer = match c.next_event(quiet).await {
            Event::Packet(Packet::Publish(p)) => {
                let writer: u32 = p.topic.rsplit('/').next().unwrap().parse().unwrap();
                let n: u64 = std::str::from_utf8(&p.payload).unwrap().parse().unwrap();
                let pid = p.packet_id.unwrap();
                let mut r = r.lock().unwrap();
                if p.qos == QoS::AtLeastOnce {
                    r.got.push((writer, n, p.qos));
                    Packet::PubAck(PubResponse::ok(pid))
                } else {
                    if r.qos2_pending.insert(pid) {
                        r.got.push((writer, n, p.qos));
                    }
                    Packet::PubRec(PubResponse::ok(pid))
                }
            }
            Event::Packet(Packet::PubRel(rel)) => {
                r.lock().unwrap().qos2_pending.remove(&rel.packet_id);
                Packet::PubComp(PubResponse::ok(rel.packet_id))
            }
            Event::Packet(_) => continue,
            _ => return,
        };
        if !send(&mut c, &answer).await {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_messages_reach_a_persistent_subscriber_through_sigkills() {
    let (iterations, seed) =
        common::crash_plan("session crash test", "SESSION_CRASH_ITERATIONS", 16);
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let reader = Arc::new(Mutex::new(Reader::default()));
    let mut writers: Vec<Writer> = (0..WRITERS).map(|_| Writer::default()).collect();
    {
        // The reader's session and subscriptions exist before anything is published.
        let server = launch(dir.path(), "always");
        let (mut c, _) = resume(server.mqtt, "reader").await.unwrap();
        for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
            c.subscribe(
                &format!("crash/{}/+", qos as u8),
                SubscriptionOptions {
                    qos,
                    ..Default::default()
                },
            )
            .await;
        }
        c.disconnect().await;
    }
    for iteration in 0..iterations {
        let sync = if iteration % 2 == 0 {
            "always"
        } else {
            "interval=50"
        };
        let mut server = launch(dir.path(), sync);
        let addr = server.mqtt;
        let (stop_tx, _) = watch::channel(());
        let consumer = tokio::spawn({
            let reader = reader.clone();
            async move { read(addr, &reader, Duration::from_secs(30)).await }
        });
        let producers: Vec<_> = writers
            .drain(..)
            .enumerate()
            .map(|(id, mut w)| {
                tokio::spawn(async move {
                    write(addr, id as u32, &mut w, None).await;
                    w
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200 + rng.below(500))).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        drop(stop_tx);
        consumer.await.unwrap();
        for p in producers {
            writers.push(p.await.unwrap());
        }
    }
    // Last run: publishers finish what they had in flight, the reader drains.
    let server = launch(dir.path(), "always");
    let addr = server.mqtt;
    for (id, w) in writers.iter_mut().enumerate() {
        let last = w.next.saturating_sub(1);
        write(addr, id as u32, w, Some(last)).await;
        assert!(
            w.in_flight.is_none(),
            "writer {id} could not finish its in-flight message"
        );
    }
    read(addr, &reader, Duration::from_secs(1)).await;

    let reader = reader.lock().unwrap();
    let mut first: HashMap<(u32, u64), usize> = HashMap::new();
    let mut order: HashMap<u32, Vec<u64>> = HashMap::new();
    for &(w, n, qos) in &reader.got {
        assert!(
            n < writers[w as usize].next,
            "writer {w} never sent {n} (seed {seed})"
        );
        let count = first.entry((w, n)).or_insert(0);
        *count += 1;
        if *count == 1 {
            order.entry(w).or_default().push(n);
        }
        assert!(
            qos != QoS::ExactlyOnce || *count == 1,
            "QoS 2 message {w}/{n} delivered twice (seed {seed})"
        );
    }
    let mut completed = 0;
    for (id, w) in writers.iter().enumerate() {
        for &(n, _) in &w.completed {
            assert!(
                first.contains_key(&(id as u32, n)),
                "acknowledged message {id}/{n} lost (seed {seed})"
            );
        }
        completed += w.completed.len();
        let seen = order.get(&(id as u32)).cloned().unwrap_or_default();
        assert!(
            seen.windows(2).all(|p| p[0] < p[1]),
            "writer {id}'s messages out of order: {seen:?} (seed {seed})"
        );
    }
    assert!(
        completed > (iterations * WRITERS) as usize,
        "the writers wrote ({completed} acknowledged)"
    );
    eprintln!(
        "session crash test: {completed} acknowledged publishes over {iterations} kills, {} deliveries, none lost",
        reader.got.len()
    );
}
