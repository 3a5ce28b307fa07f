//! Session takeover under contention: many CONNECTs of one client id at once, on a
//! multi-threaded runtime, resume one session; exactly one connection keeps it, with
//! its subscriptions and queued messages, and every other one is closed with 0x8E.

use std::collections::BTreeSet;
use std::time::Duration;

use statehub_broker::codec::{Connect, ConnectProperties, Packet, QoS, ReasonCode};
use statehub_test_support::*;
use tokio::sync::{mpsc, watch};

/// Concurrent CONNECTs per client id.
const CONTENDERS: usize = 32;
/// Client ids raced at once.
const IDS: usize = 8;
const ROUNDS: usize = 8;

fn resume(id: &str, clean_start: bool) -> Connect {
    Connect {
        clean_start,
        properties: ConnectProperties {
            session_expiry_interval: Some(60),
            ..Default::default()
        },
        ..connect_packet(V5, id)
    }
}

/// How one contender's connection ended up.
#[derive(Debug)]
enum Outcome {
    /// Closed by the server with this DISCONNECT reason code (`None`: without one).
    Closed(Option<ReasonCode>),
    /// Still connected when told it was the last one: the client and the payloads of
    /// the PUBLISHes it received (not acknowledged).
    Kept(RawClient, Vec<Vec<u8>>),
}

/// Connects, then reads until the server closes the connection or the test says stop.
async fn contend(
    addr: std::net::SocketAddr,
    id: String,
    clean_start: bool,
    mut stop: watch::Receiver<bool>,
    out: mpsc::UnboundedSender<Outcome>,
) {
    let (mut c, ack) = RawClient::connect_with(addr, resume(&id, clean_start)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    if !clean_start {
        assert!(ack.session_present, "every contender resumes the session");
    }
    let mut received = Vec::new();
    let outcome = loop {
        tokio::select! {
            _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
                break Outcome::Kept(c, received)
            }
            event = c.next_event(Duration::from_secs(3600)) => match event {
                Event::Packet(Packet::Publish(p)) => received.push(p.payload.to_vec()),
                Event::Packet(Packet::Disconnect(d)) => {
                    c.expect_closed().await;
                    break Outcome::Closed(Some(d.reason_code));
                }
                Event::Closed => break Outcome::Closed(None),
                other => panic!("contender {id}: unexpected {other:?}"),
            },
        }
    };
    let _ = out.send(outcome);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_connects_of_one_client_id_leave_exactly_one_connection_with_the_session() {
    race_rounds("contended", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clean_starts_of_one_client_id_leave_exactly_one_connection() {
    race_rounds("replaced", true).await;
}

/// `ROUNDS` rounds of `IDS` concurrent [`race`]s, each on its own client id
/// (`{prefix}-{round}-{i}`); after each round, once every client left, no connection is
/// left.
async fn race_rounds(prefix: &str, clean_start: bool) {
    let (broker, addr) = start_default().await;
    for round in 0..ROUNDS {
        let races: Vec<_> = (0..IDS)
            .map(|i| tokio::spawn(race(addr, format!("{prefix}-{round}-{i}"), clean_start)))
            .collect();
        for race in races {
            race.await.unwrap();
        }
        assert!(
            wait_until(WAIT, || broker.connection_count() == 0).await,
            "round {round}: {} connections left after every client left",
            broker.connection_count()
        );
    }
}

/// One client id's race: its session is set up with a subscription and two queued
/// messages, then [`CONTENDERS`] connections resume it at once (or, `clean_start`,
/// replace it at once: then the survivor's session is new, and empty).
async fn race(addr: std::net::SocketAddr, id: String, clean_start: bool) {
    let topic = format!("to/{id}");
    let mut publisher = RawClient::connect(addr, V5, &format!("{id}-publisher")).await;
    let (mut first, _) = RawClient::connect_with(addr, resume(&id, true)).await;
    first.subscribe(&topic, opts(QoS::AtLeastOnce)).await;
    first.disconnect().await;
    for payload in ["queued-1", "queued-2"] {
        publisher
            .publish_simple(&topic, QoS::AtLeastOnce, payload.as_bytes())
            .await;
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let (out_tx, mut out_rx) = mpsc::unbounded_channel();
    for _ in 0..CONTENDERS {
        let (stop, out) = (stop_rx.clone(), out_tx.clone());
        tokio::spawn(contend(addr, id.clone(), clean_start, stop, out));
    }
    let mut closed = Vec::new();
    while closed.len() < CONTENDERS - 1 {
        match tokio::time::timeout(4 * WAIT, out_rx.recv()).await {
            Ok(Some(Outcome::Closed(code))) => closed.push(code),
            other => panic!(
                "{id}: {} of {} connections closed, then {other:?}: a connection that lost \
                 the session was not told",
                closed.len(),
                CONTENDERS - 1
            ),
        }
    }
    assert!(
        closed
            .iter()
            .all(|c| *c == Some(ReasonCode::SESSION_TAKEN_OVER)),
        "{id}: every loser gets DISCONNECT 0x8E: {closed:?}"
    );
    stop_tx.send_replace(true);
    let (mut kept, mut received) = match out_rx.recv().await {
        Some(Outcome::Kept(c, received)) => (c, received),
        other => panic!("{id}: the last connection was closed too: {other:?}"),
    };
    kept.ping().await;
    if clean_start {
        kept.subscribe(&topic, opts(QoS::AtLeastOnce)).await;
        publisher
            .publish_simple(&topic, QoS::AtMostOnce, b"after")
            .await;
        assert_eq!(&kept.expect_publish().await.payload[..], b"after");
        kept.disconnect().await;
        publisher.disconnect().await;
        return;
    }

    // Its state is intact: the queued messages (resent from whichever connection held
    // them in flight) and the subscription.
    while received.iter().collect::<BTreeSet<_>>().len() < 2 {
        let p = kept.expect_publish().await;
        received.push(p.payload.to_vec());
        kept.ack(&p).await;
    }
    let expected: BTreeSet<&[u8]> = [&b"queued-1"[..], b"queued-2"].into();
    let got: BTreeSet<&[u8]> = received.iter().map(|p| &p[..]).collect();
    assert_eq!(got, expected, "{id}");
    publisher
        .publish_simple(&topic, QoS::AtMostOnce, b"after")
        .await;
    loop {
        let p = kept.expect_publish().await;
        kept.ack(&p).await;
        if &p.payload[..] == b"after" {
            break;
        }
    }
    kept.disconnect().await;
    publisher.disconnect().await;
}
