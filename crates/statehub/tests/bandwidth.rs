//! The per-connection bandwidth limit against the binary (`[mqtt] max_bytes_per_second`,
//! `max_bytes_burst`, and a `[[mqtt.listeners]]` entry's own): a client sending past
//! it is slowed (its socket is not read until its budget is back), not refused; what
//! it sent arrives whole; its keep alive does not expire during our pause; other
//! clients are served meanwhile; the pauses are counted in /metrics.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_test_support::{connect_packet, opts, publish, Event, RawClient, V5};
use tokio::time::Instant;

/// The throttled listener's rate and burst, and what the client sends.
const RATE: usize = 16 * 1024;
const BURST: usize = 8 * 1024;
const PAYLOAD: usize = 48 * 1024;
const MESSAGES: usize = 2;
/// Generous bound on every wait (a loaded machine runs 3-5x slower).
const PATIENCE: Duration = Duration::from_secs(60);

/// The MQTT listeners' addresses, in the order of the config file.
fn listeners(server: &common::Server) -> Vec<SocketAddr> {
    let marker = "mqtt listening on ";
    let addrs = server.startup.iter().filter_map(|line| {
        let rest = &line[line.find(marker)? + marker.len()..];
        rest.split_whitespace().next()?.parse().ok()
    });
    addrs.collect()
}

/// The next PUBLISH a subscriber gets, acknowledged.
async fn delivered(sub: &mut RawClient) -> statehub_broker::codec::Publish {
    match sub.next_event(PATIENCE).await {
        Event::Packet(Packet::Publish(p)) => {
            sub.ack(&p).await;
            p
        }
        other => panic!("expected a PUBLISH, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_bandwidth_is_slowed_not_dropped_and_others_are_served() {
    // The [mqtt] limit applies to the first listener; the second lifts it.
    let config = format!(
        "[mqtt]\nmax_bytes_per_second = {RATE}\nmax_bytes_burst = {BURST}\n\n\
         [[mqtt.listeners]]\naddress = \"127.0.0.1:0\"\n\n\
         [[mqtt.listeners]]\naddress = \"127.0.0.1:0\"\nmax_bytes_per_second = 0\n"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bandwidth.toml");
    std::fs::write(&path, config).unwrap();
    let server = common::start(
        &[
            "--config",
            path.to_str().unwrap(),
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    let addrs = listeners(&server);
    let (throttled, open) = (addrs[0], addrs[1]);

    let mut sub = RawClient::connect(open, V5, "bw-sub").await;
    sub.subscribe("bw/#", opts(QoS::AtLeastOnce)).await;

    // Keep alive 1 s (closed after 1.5 s of silence): each 48 KiB read at 16 KiB/s
    // pauses reading for longer than that.
    let mut connect = connect_packet(V5, "bw-heavy");
    connect.keep_alive = 1;
    let (mut heavy, ack) = RawClient::connect_with(throttled, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    let start = Instant::now();
    for i in 0..MESSAGES {
        let payload = vec![b'a' + i as u8; PAYLOAD];
        heavy
            .send(&Packet::Publish(publish(
                "bw/heavy",
                QoS::AtLeastOnce,
                &payload,
            )))
            .await;
    }

    // Another client of the same listener is served while the first is held back.
    let mut light = RawClient::connect(throttled, V5, "bw-light").await;
    light
        .send(&Packet::Publish(publish(
            "bw/light",
            QoS::AtLeastOnce,
            b"hi",
        )))
        .await;
    let mut got = Vec::new();
    while got.len() < MESSAGES + 1 {
        got.push(delivered(&mut sub).await);
    }
    let elapsed = start.elapsed();
    let light_at = got.iter().position(|p| &p.topic[..] == "bw/light");
    assert!(
        light_at.is_some_and(|i| i < MESSAGES),
        "the light client's message came before the heavy one's last: {:?}",
        got.iter().map(|p| &p.topic).collect::<Vec<_>>()
    );
    // Nothing lost or damaged, in order.
    let heavy_got: Vec<_> = got.iter().filter(|p| &p.topic[..] == "bw/heavy").collect();
    for (i, p) in heavy_got.iter().enumerate() {
        assert_eq!(p.payload.len(), PAYLOAD);
        assert!(
            p.payload.iter().all(|&b| b == b'a' + i as u8),
            "message {i}"
        );
    }
    // At least the bytes past the burst, less the last read (the server may read the
    // last packet whole before pausing), at the rate.
    let sent = MESSAGES * PAYLOAD;
    let floor = Duration::from_secs_f64((sent - BURST - PAYLOAD) as f64 / RATE as f64);
    assert!(
        elapsed >= floor,
        "{sent} bytes at {RATE} B/s took {elapsed:?}, less than {floor:?}"
    );
    // Both acknowledged, no DISCONNECT: the pauses did not count as keep-alive silence.
    for _ in 0..MESSAGES {
        match heavy.next_event(PATIENCE).await {
            Event::Packet(Packet::PubAck(a)) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
    heavy.send(&Packet::PingReq).await;
    match heavy.next_event(PATIENCE).await {
        Event::Packet(Packet::PingResp) => {}
        other => panic!("expected PINGRESP, got {other:?}"),
    }

    let throttles = common::metric(server.http, "statehub_mqtt_bandwidth_throttles_total");
    assert!(throttles >= 1.0, "throttles counted: {throttles}");
    let seconds = common::metric(
        server.http,
        "statehub_mqtt_bandwidth_throttled_seconds_total",
    );
    assert!(
        seconds >= floor.as_secs_f64() * 0.9,
        "throttled {seconds} s"
    );

    // The second listener's clients are not limited: the same bytes cost no pause.
    let mut free = RawClient::connect(open, V5, "bw-free").await;
    for _ in 0..MESSAGES {
        let payload = vec![b'z'; PAYLOAD];
        free.send(&Packet::Publish(publish(
            "bw/free",
            QoS::AtLeastOnce,
            &payload,
        )))
        .await;
    }
    for _ in 0..MESSAGES {
        assert_eq!(&delivered(&mut sub).await.topic[..], "bw/free");
    }
    let after = common::metric(server.http, "statehub_mqtt_bandwidth_throttles_total");
    assert_eq!(after, throttles, "no pause on the listener without a limit");
}
