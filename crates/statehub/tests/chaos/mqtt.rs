//! MQTT clients of the chaos test on our codec: a QoS 1 publisher that moves to another
//! node when its node dies and resends the message it had no PUBACK for, and a
//! subscriber that records every message it gets.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use statehub_broker::codec::{Packet, PubResponse, QoS};
use statehub_test_support::{connect_packet, opts, publish, Event, RawClient, V5};
use tokio::net::TcpStream;
use tokio::time::timeout;

use super::{Directory, Progress, PATIENCE};

/// Connects with a clean session; `None` if the node is gone (or goes) meanwhile.
pub async fn try_connect(addr: SocketAddr, client_id: &str) -> Option<RawClient> {
    let stream = timeout(PATIENCE, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let mut c = RawClient::from_stream(stream, V5);
    send(
        &mut c,
        &Packet::Connect(Box::new(connect_packet(V5, client_id))),
    )
    .await?;
    match c.next_event(PATIENCE).await {
        Event::Packet(Packet::ConnAck(ack)) if ack.reason_code.is_success() => Some(c),
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
    let task = tokio::spawn(async move {
        // Ends with its connection (the test's end): anything missing because it ended
        // early fails the checks.
        loop {
            match c.next_event(PATIENCE).await {
                Event::Packet(Packet::Publish(p)) => {
                    let id = p.packet_id.expect("QoS 1 has a packet id");
                    let payload = String::from_utf8(p.payload.to_vec()).unwrap();
                    record.lock().unwrap().push(payload);
                    if send(&mut c, &Packet::PubAck(PubResponse::ok(id)))
                        .await
                        .is_none()
                    {
                        return;
                    }
                }
                Event::Packet(_) | Event::Timeout => {}
                Event::Closed | Event::DecodeError(_) => return,
            }
        }
    });
    (received, task)
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
