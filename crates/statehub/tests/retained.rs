//! Retained messages on the data directory: they survive a restart and a SIGKILL
//! with their properties, replacements and deletions, expire across a restart, and
//! every one that was acknowledged (PUBACK, PUBREC) is there after a crash at a random
//! moment.
//!
//! `RETAINED_CRASH_ITERATIONS` (default 12) and `CRASH_SEED` extend or reproduce the
//! crash test; the seed is printed.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::{start_on, Rng, Server};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;

fn launch(dir: &Path, sync: &str) -> Server {
    start_on(dir, &["--sync", sync])
}

/// What a client sees: publishes and the packet ids acknowledged.
enum Seen {
    Publish(rumqttc::v5::mqttbytes::v5::Publish),
    Acked,
    SubAck,
    Gone,
}

async fn client(addr: SocketAddr, id: &str) -> (AsyncClient, mpsc::UnboundedReceiver<Seen>) {
    let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(opts, 16);
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let seen = match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => Seen::Publish(p),
                Ok(Event::Incoming(Packet::PubAck(_))) => Seen::Acked,
                Ok(Event::Incoming(Packet::PubComp(_))) => Seen::Acked,
                Ok(Event::Incoming(Packet::SubAck(_))) => Seen::SubAck,
                Ok(_) => continue,
                Err(_) => {
                    let _ = tx.send(Seen::Gone);
                    return;
                }
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    (client, rx)
}

/// Publishes and waits for the acknowledgement; `false` if the connection died first.
async fn publish_acked(
    c: &AsyncClient,
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    topic: &str,
    qos: QoS,
    payload: &str,
    props: PublishProperties,
) -> bool {
    if c.publish_with_properties(topic, qos, true, payload.to_owned(), props)
        .await
        .is_err()
    {
        return false;
    }
    loop {
        match timeout(Duration::from_secs(10), rx.recv()).await {
            Ok(Some(Seen::Acked)) => return true,
            Ok(Some(Seen::Gone) | None) | Err(_) => return false,
            Ok(Some(_)) => {}
        }
    }
}

/// The retained messages under `filter` a new subscriber gets, by topic: waits until
/// at least `at_least` arrived (10 s at most), then for a quiet 300 ms.
async fn retained(
    addr: SocketAddr,
    filter: &str,
    at_least: usize,
) -> HashMap<String, rumqttc::v5::mqttbytes::v5::Publish> {
    let (c, mut rx) = client(addr, "reader").await;
    c.subscribe(filter, QoS::ExactlyOnce).await.unwrap();
    let mut out = HashMap::new();
    let mut subscribed = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let quiet = if subscribed && out.len() >= at_least {
            Duration::from_millis(300)
        } else {
            Duration::from_secs(1)
        };
        let Ok(Some(seen)) = timeout(quiet, rx.recv()).await else {
            if tokio::time::Instant::now() < deadline && !(subscribed && out.len() >= at_least) {
                continue;
            }
            break;
        };
        match seen {
            Seen::SubAck => subscribed = true,
            Seen::Publish(p) => {
                assert!(p.retain, "a message to a new subscriber is a retained one");
                out.insert(String::from_utf8(p.topic.to_vec()).unwrap(), p);
            }
            Seen::Gone => panic!("the reader's connection ended"),
            Seen::Acked => {}
        }
    }
    assert!(subscribed, "no SUBACK");
    let _ = c.disconnect().await;
    out
}

fn text(p: &rumqttc::v5::mqttbytes::v5::Publish) -> String {
    String::from_utf8(p.payload.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_messages_survive_restart_and_sigkill_with_their_properties() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = launch(dir.path(), "always");
    let (c, mut rx) = client(server.mqtt, "writer").await;
    let props = PublishProperties {
        content_type: Some("text/plain".into()),
        user_properties: vec![("k".into(), "v".into())],
        ..PublishProperties::default()
    };
    assert!(publish_acked(&c, &mut rx, "r/1", QoS::AtLeastOnce, "one", props.clone()).await);
    assert!(
        publish_acked(
            &c,
            &mut rx,
            "r/2",
            QoS::AtLeastOnce,
            "two",
            PublishProperties::default()
        )
        .await
    );
    assert!(
        publish_acked(
            &c,
            &mut rx,
            "r/2",
            QoS::ExactlyOnce,
            "two-b",
            PublishProperties::default()
        )
        .await
    );
    assert!(
        publish_acked(
            &c,
            &mut rx,
            "r/3",
            QoS::AtLeastOnce,
            "three",
            PublishProperties::default()
        )
        .await
    );
    assert!(
        publish_acked(
            &c,
            &mut rx,
            "r/3",
            QoS::AtLeastOnce,
            "",
            PublishProperties::default()
        )
        .await
    );
    let short = PublishProperties {
        message_expiry_interval: Some(1),
        ..PublishProperties::default()
    };
    assert!(publish_acked(&c, &mut rx, "r/4", QoS::AtLeastOnce, "short-lived", short).await);
    let long = PublishProperties {
        message_expiry_interval: Some(3600),
        ..PublishProperties::default()
    };
    assert!(publish_acked(&c, &mut rx, "r/5", QoS::AtLeastOnce, "long-lived", long).await);

    server.child.kill().unwrap();
    server.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let server = launch(dir.path(), "always");
    assert!(
        server
            .startup
            .iter()
            .any(|l| l.contains("3 retained messages")),
        "start-up log counts the live retained messages (r/4 expired while down): {:?}",
        server.startup
    );
    let got = retained(server.mqtt, "r/#", 3).await;
    let mut topics: Vec<_> = got.keys().cloned().collect();
    topics.sort();
    assert_eq!(
        topics,
        ["r/1", "r/2", "r/5"],
        "deleted and expired ones are gone"
    );
    assert_eq!(text(&got["r/1"]), "one");
    assert_eq!(
        text(&got["r/2"]),
        "two-b",
        "the replacement, not the original"
    );
    assert_eq!(got["r/2"].qos, QoS::ExactlyOnce);
    let p1 = got["r/1"].properties.as_ref().expect("properties kept");
    assert_eq!(p1.content_type.as_deref(), Some("text/plain"));
    assert_eq!(p1.user_properties, vec![("k".to_owned(), "v".to_owned())]);
    let left = got["r/5"]
        .properties
        .as_ref()
        .and_then(|p| p.message_expiry_interval);
    assert!(
        left.is_some_and(|s| (3590..=3600).contains(&s)),
        "expiry counts down across the restart: {left:?}"
    );

    // A graceful restart keeps them too.
    let mut server = server;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status();
    common::wait_exit(&mut server.child, Duration::from_secs(10));
    let server = launch(dir.path(), "always");
    assert_eq!(retained(server.mqtt, "r/#", 3).await.len(), 3);
}

const TOPICS_PER_WRITER: u64 = 50;

fn crash_topic(writer: u32, n: u64) -> String {
    format!("crash/{writer}/{}", n % TOPICS_PER_WRITER)
}

/// Publishes retained messages one at a time until the connection dies, cycling over
/// the writer's topics so each publish replaces an older one; the payload is `n`,
/// increasing across iterations. Returns (acknowledged, in flight).
async fn publish_until_killed(
    addr: SocketAddr,
    writer: u32,
    iteration: u32,
) -> (Vec<u64>, Option<u64>) {
    let (c, mut rx) = client(addr, &format!("w{writer}")).await;
    let mut acked = Vec::new();
    for n in (u64::from(iteration) * 1_000_000).. {
        let qos = if n % 3 == 2 {
            QoS::ExactlyOnce
        } else {
            QoS::AtLeastOnce
        };
        if !publish_acked(
            &c,
            &mut rx,
            &crash_topic(writer, n),
            qos,
            &n.to_string(),
            PublishProperties::default(),
        )
        .await
        {
            return (acked, Some(n));
        }
        acked.push(n);
    }
    unreachable!()
}

type Got = HashMap<String, rumqttc::v5::mqttbytes::v5::Publish>;

/// Checks what a restart kept against what was acknowledged, then takes it as the new
/// acknowledged state (an in-flight publish either landed or not).
fn check(
    got: &Got,
    acked: &mut HashMap<String, u64>,
    in_flight: &mut HashMap<String, u64>,
    when: &str,
) {
    for (topic, publish) in got {
        let n: u64 = text(publish).parse().unwrap();
        let ok = acked.get(topic) == Some(&n) || in_flight.get(topic) == Some(&n);
        assert!(
            ok,
            "{when}: {topic} holds {n}, acknowledged {:?}, in flight {:?}",
            acked.get(topic),
            in_flight.get(topic)
        );
    }
    for topic in acked.keys() {
        assert!(got.contains_key(topic), "{when}: acknowledged {topic} lost");
    }
    for (topic, publish) in got {
        acked.insert(topic.clone(), text(publish).parse().unwrap());
    }
    in_flight.clear();
}

/// After every SIGKILL each topic holds its last acknowledged payload, or the one
/// that was in flight to it when the kill landed; never an older one, never a lost
/// one. Iterations alternate `--sync always` and `--sync interval=50`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_retained_messages_survive_sigkill() {
    const WRITERS: u32 = 4;
    let (iterations, seed) =
        common::crash_plan("retained crash test", "RETAINED_CRASH_ITERATIONS", 12);
    let mut rng = Rng(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    // Per topic: the last acknowledged payload, and one in flight when the kill landed.
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut in_flight: HashMap<String, u64> = HashMap::new();
    let mut total_acked = 0;
    for iteration in 0..iterations {
        let sync = if iteration % 2 == 0 {
            "always"
        } else {
            "interval=50"
        };
        let mut server = launch(dir.path(), sync);
        let got = retained(server.mqtt, "crash/#", acked.len()).await;
        check(
            &got,
            &mut acked,
            &mut in_flight,
            &format!("iteration {iteration} (seed {seed})"),
        );
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| tokio::spawn(publish_until_killed(server.mqtt, w, iteration)))
            .collect();
        tokio::time::sleep(Duration::from_millis(100 + rng.below(400))).await;
        server.child.kill().unwrap();
        server.child.wait().unwrap();
        for (w, writer) in writers.into_iter().enumerate() {
            let (done, pending) = writer.await.unwrap();
            total_acked += done.len();
            for n in done {
                acked.insert(crash_topic(w as u32, n), n);
            }
            if let Some(n) = pending {
                in_flight.insert(crash_topic(w as u32, n), n);
            }
        }
    }
    let server = launch(dir.path(), "always");
    let got = retained(server.mqtt, "crash/#", acked.len()).await;
    check(
        &got,
        &mut acked,
        &mut in_flight,
        &format!("finally (seed {seed})"),
    );
    assert!(
        total_acked > (iterations * WRITERS) as usize,
        "the writers wrote ({total_acked} acknowledged)"
    );
    eprintln!("retained crash test: {total_acked} acknowledged retained publishes over {iterations} kills, none lost");
}
