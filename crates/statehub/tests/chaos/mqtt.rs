//! MQTT clients of the chaos test on our codec: a QoS 1 publisher that moves to another
//! node when its node dies and resends the message it had no PUBACK for, a subscriber
//! that records every message it gets, and a persistent-session subscriber that
//! resumes its session on another node when its node dies.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use statehub_broker::codec::{ConnAck, Connect, Packet, PubResponse, QoS};
use statehub_test_support::{
    connect_packet, opts, persistent_connect, publish, Event, RawClient, V5,
};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::{Directory, Progress, PATIENCE};

/// Connects with a clean session; `None` if the node is gone (or goes) meanwhile.
pub async fn try_connect(addr: SocketAddr, client_id: &str) -> Option<RawClient> {
    match try_connect_with(addr, connect_packet(V5, client_id)).await? {
        (c, ack) if ack.reason_code.is_success() => Some(c),
        _ => None,
    }
}

/// Sends `connect`; the CONNACK, whatever its code, or `None` if the node is gone (or
/// goes) meanwhile.
pub async fn try_connect_with(addr: SocketAddr, connect: Connect) -> Option<(RawClient, ConnAck)> {
    let stream = timeout(PATIENCE, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut c = RawClient::from_stream(stream, connect.protocol);
    send(&mut c, &Packet::Connect(Box::new(connect))).await?;
    match c.next_event(PATIENCE).await {
        Event::Packet(Packet::ConnAck(ack)) => Some((c, ack)),
        _ => None,
    }
}

async fn send(c: &mut RawClient, packet: &Packet) -> Option<()> {
    let mut out = BytesMut::new();
    c.codec.encode(packet, &mut out).expect("encode");
    c.try_send_raw(&out).await.then_some(())
}

/// Publishes at QoS 1 and waits for the PUBACK; `None` if the connection ended first.
/// A refusal (reason code 0x80 or above) fails the test: every node is on Redis.
async fn publish_once(c: &mut RawClient, topic: &str, payload: &str) -> Option<()> {
    let id = c.next_packet_id();
    let p = statehub_broker::codec::Publish {
        packet_id: Some(id),
        ..publish(topic, QoS::AtLeastOnce, payload.as_bytes())
    };
    send(c, &Packet::Publish(p)).await?;
    loop {
        match c.next_event(PATIENCE).await {
            Event::Packet(Packet::PubAck(ack)) if ack.packet_id == id => {
                assert!(
                    ack.reason_code.0 < 0x80,
                    "{payload}: refused with {:?}",
                    ack.reason_code
                );
                return Some(());
            }
            Event::Packet(_) => {}
            _ => return None,
        }
    }
}

/// Publishes `{name}-{n}` for n = 0, 1, ... on `chaos/{name}` until told to stop, one
/// at a time, on any node of `among`; a message without a PUBACK is sent again on the
/// next node. Returns the acknowledged payloads, in order.
pub async fn publisher(
    directory: Directory,
    among: Vec<usize>,
    name: String,
    progress: Progress,
) -> Vec<String> {
    let topic = format!("chaos/{name}");
    let mut acked = Vec::new();
    let mut client: Option<RawClient> = None;
    for n in 0u32.. {
        if progress.stopping() {
            break;
        }
        let payload = format!("{name}-{n}");
        loop {
            let c = match client.as_mut() {
                Some(c) => c,
                None => {
                    let (_, addrs) = directory.pick(&among).await;
                    match try_connect(addrs.mqtt, &format!("chaos-{name}-{n}")).await {
                        Some(c) => client.insert(c),
                        None => continue,
                    }
                }
            };
            if publish_once(c, &topic, &payload).await.is_some() {
                break;
            }
            client = None;
            progress.moved();
        }
        acked.push(payload);
        progress.ack();
    }
    acked
}

/// What a subscriber received, in order.
pub type Received = Arc<Mutex<Vec<String>>>;

/// A subscriber to `chaos/#` at QoS 1 on `addr` (a node that is not killed), recording
/// every payload and acknowledging it.
pub async fn subscriber(
    addr: SocketAddr,
    client_id: &str,
) -> (Received, tokio::task::JoinHandle<()>) {
    let mut c = RawClient::connect(addr, V5, client_id).await;
    c.subscribe("chaos/#", opts(QoS::AtLeastOnce)).await;
    let received = Received::default();
    let record = received.clone();
    // Ends with its connection (the test's end): anything missing because it ended
    // early fails the checks.
    let task = tokio::spawn(async move { receive(&mut c, &record, None).await });
    (received, task)
}

/// Records and acknowledges every message `c` gets until its connection ends.
async fn receive(c: &mut RawClient, record: &Received, progress: Option<&Progress>) {
    loop {
        match c.next_event(PATIENCE).await {
            Event::Packet(Packet::Publish(p)) => {
                let id = p.packet_id.expect("QoS 1 has a packet id");
                let payload = String::from_utf8(p.payload.to_vec()).unwrap();
                record.lock().unwrap().push(payload);
                if send(c, &Packet::PubAck(PubResponse::ok(id)))
                    .await
                    .is_none()
                {
                    return;
                }
                if let Some(progress) = progress {
                    progress.ack();
                }
            }
            Event::Packet(_) | Event::Timeout => {}
            Event::Closed | Event::DecodeError(_) => return,
        }
    }
}

/// The persistent subscriber's session expiry (seconds): longer than any run.
const SESSION_EXPIRY: u32 = 3600;

/// How a persistent subscriber's reconnections went.
#[derive(Debug, Default)]
pub struct Resumes {
    /// CONNACKs with Session Present 1.
    pub resumed: usize,
    /// The nodes whose CONNACK said Session Present 0: the session was lost.
    pub lost: Vec<usize>,
    /// CONNECTs refused (e.g. 0x89 while another node was taking the session).
    pub refused: usize,
}

/// A persistent-session subscriber and what it saw.
pub struct Persistent {
    pub received: Received,
    pub resumes: Arc<Mutex<Resumes>>,
    /// Runs until aborted: it reconnects whenever its node dies.
    pub task: tokio::task::JoinHandle<()>,
}

/// An MQTT 5 subscriber to `chaos/#` at QoS 1 with a persistent session (Clean Start
/// 0) on a node of `among`: when its node dies it connects to another (Clean Start 0
/// again) and goes on with the session Redis kept. Each message received counts on
/// `progress`.
pub async fn persistent_subscriber(
    directory: Directory,
    among: Vec<usize>,
    client_id: String,
    progress: Progress,
) -> Persistent {
    let (_, addrs) = directory.pick(&among).await;
    let connect = persistent_connect(&client_id, SESSION_EXPIRY);
    let (mut c, ack) = RawClient::connect_with(addrs.mqtt, connect).await;
    assert!(
        ack.reason_code.is_success() && !ack.session_present,
        "{ack:?}"
    );
    c.subscribe("chaos/#", opts(QoS::AtLeastOnce)).await;
    let received = Received::default();
    let resumes = Arc::new(Mutex::new(Resumes::default()));
    let (record, seen) = (received.clone(), resumes.clone());
    let task = tokio::spawn(async move {
        loop {
            receive(&mut c, &record, Some(&progress)).await;
            progress.moved();
            c = resume(&directory, &among, &client_id, &seen).await;
        }
    });
    Persistent {
        received,
        resumes,
        task,
    }
}

/// Connects `client_id` with Clean Start 0 to live nodes of `among` until one accepts.
async fn resume(
    directory: &Directory,
    among: &[usize],
    client_id: &str,
    resumes: &Mutex<Resumes>,
) -> RawClient {
    loop {
        let (node, addrs) = directory.pick(among).await;
        let connect = persistent_connect(client_id, SESSION_EXPIRY);
        match try_connect_with(addrs.mqtt, connect).await {
            Some((c, ack)) if ack.reason_code.is_success() => {
                let mut resumes = resumes.lock().unwrap();
                if ack.session_present {
                    resumes.resumed += 1;
                } else {
                    resumes.lost.push(node);
                }
                return c;
            }
            Some(_) => resumes.lock().unwrap().refused += 1,
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks a subscriber's messages against the publishers': every acknowledged message
/// arrived, and each publisher's messages first arrived in the order they were sent
/// (a message resent after a lost PUBACK may arrive twice: QoS 1 is at least once).
/// Returns how many arrived twice.
pub fn check(received: &[String], published: &[Vec<String>]) -> usize {
    let mut first_seen = std::collections::HashMap::new();
    let mut duplicates = 0;
    for (i, payload) in received.iter().enumerate() {
        if first_seen.insert(payload.as_str(), i).is_some() {
            duplicates += 1;
        }
    }
    for acked in published {
        let mut last = None;
        for payload in acked {
            let at = *first_seen
                .get(payload.as_str())
                .unwrap_or_else(|| panic!("acknowledged {payload} never arrived"));
            assert!(
                last.is_none_or(|l| at > l),
                "{payload} arrived before a message published before it"
            );
            last = Some(at);
        }
    }
    duplicates
}
