//! A subscriber that never reads its socket while a publisher floods QoS 1: the
//! broker must cut it off (0x97, counted in metrics) and keep its memory bounded
//! by the session queue limits.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use statehub_broker::codec::{Codec, ConnectProperties, Packet, PubResponse, QoS, ReasonCode};
use statehub_broker::{Broker, BrokerConfig};
use statehub_test_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const MAX_QUEUED: usize = 50;

fn config() -> BrokerConfig {
    BrokerConfig {
        max_queued_messages: MAX_QUEUED,
        socket_write_high_water: 16 * 1024,
        // The flooder waits for the stalled subscriber this long before it is cut off
        // (publisher back-pressure, see backpressure.rs).
        slow_consumer_timeout_secs: 1,
        ..Default::default()
    }
}

/// Connects a v5 subscriber with a tiny receive buffer, subscribes QoS 1 to
/// `slow/t`, and from then on never reads.
async fn stalled_subscriber(addr: SocketAddr, id: &str, expiry: u32) -> RawClient {
    let sock = TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let stream = tokio::time::timeout(WAIT, sock.connect(addr))
        .await
        .unwrap()
        .unwrap();
    let mut c = RawClient::from_stream(stream, V5);
    let mut connect = connect_packet(V5, id);
    connect.properties = ConnectProperties {
        session_expiry_interval: Some(expiry),
        ..Default::default()
    };
    c.send(&Packet::Connect(Box::new(connect))).await;
    assert!(matches!(c.expect().await, Packet::ConnAck(a) if a.reason_code.is_success()));
    c.subscribe("slow/t", opts(QoS::AtLeastOnce)).await;
    c
}

/// Floods QoS 1 PUBLISHes on `slow/t` (acks read and discarded by a separate task)
/// until `stop` is set. Returns how many were written.
fn flood(addr: SocketAddr, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let c = RawClient::connect(addr, V5, "flooder").await;
        let (mut rd, mut wr) = c.stream.into_split();
        tokio::spawn(async move {
            let mut sink = vec![0u8; 65536];
            while let Ok(n) = rd.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        });
        let codec = Codec::with_version(V5, 0);
        let mut sent = 0u64;
        let mut buf = BytesMut::new();
        while !stop.load(Ordering::Relaxed) {
            buf.clear();
            for _ in 0..64 {
                sent += 1;
                let mut p = publish("slow/t", QoS::AtLeastOnce, &[0xAB; 256]);
                p.packet_id = Some((sent % 60_000) as u16 + 1);
                codec.encode(&Packet::Publish(p), &mut buf).unwrap();
            }
            if tokio::time::timeout(WAIT, wr.write_all(&buf))
                .await
                .is_err()
            {
                break;
            }
            tokio::task::yield_now().await;
        }
        sent
    })
}

/// Floods until the broker has cut the slow subscriber off (its DISCONNECT then waits
/// for the subscriber to read that far), at most `limit`.
async fn flood_until_cut_off(broker: &Broker, addr: SocketAddr, limit: Duration) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let task = flood(addr, stop.clone());
    let cut = wait_until(limit, || {
        broker.metrics().slow_consumers.load(Ordering::Relaxed) > 0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let sent = tokio::time::timeout(WAIT, task)
        .await
        .expect("flooder stuck")
        .unwrap();
    assert!(
        cut,
        "slow consumer not cut off within {limit:?} ({sent} messages flooded, slow_consumers={})",
        broker.metrics().slow_consumers.load(Ordering::Relaxed)
    );
    // Let the broker finish the PUBLISHes still buffered from the flooder.
    let mut last = u64::MAX;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        let now = broker.metrics().messages_in.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_is_disconnected_and_counted() {
    let (broker, addr) = start_broker(config()).await;
    let mut s = stalled_subscriber(addr, "slow", 0).await;
    flood_until_cut_off(&broker, addr, Duration::from_secs(6)).await;
    assert!(broker.metrics().slow_consumers.load(Ordering::Relaxed) >= 1);
    // The socket was closed: reading what is buffered ends in EOF (or reset).
    let mut sink = vec![0u8; 65536];
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match s.stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "slow consumer's socket still open");
    // Everyone else is fine.
    let mut c = RawClient::connect(addr, V5, "after-slow").await;
    c.ping().await;
}

/// The DISCONNECT 0x97 the docs promise reaches a QoS 1 subscriber that stalls for
/// a couple of seconds and then reads (and acknowledges) again: the backlog it could
/// not read is dropped, the DISCONNECT follows the packet part-written, and the
/// server waits for the subscriber to read that far before it closes. (The
/// DISCONNECT used to queue behind up to 4 x the write high-water mark of packets,
/// the write was given up after a second and the stream ended mid-packet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_qos1_subscriber_that_reads_again_gets_disconnect_0x97() {
    let (broker, addr) = start_broker(BrokerConfig {
        // Room for the subscriber to take some of the flood before it is cut off, so
        // its socket and the write buffer behind it are full.
        max_queued_messages: 1000,
        ..config()
    })
    .await;
    let mut s = stalled_subscriber(addr, "slow-late", 0).await;
    flood_until_cut_off(&broker, addr, Duration::from_secs(6)).await;
    // Longer than the second the close used to wait for the write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut last = None;
    let mut read = 0;
    loop {
        match s.next_event(Duration::from_secs(10)).await {
            Event::Packet(Packet::Publish(p)) => {
                read += 1;
                let ack = PubResponse::ok(p.packet_id.unwrap());
                let mut out = BytesMut::new();
                s.codec.encode(&Packet::PubAck(ack), &mut out).unwrap();
                let _ = s.stream.write_all(&out).await;
                last = Some(Packet::Publish(p));
            }
            Event::Packet(p) => last = Some(p),
            Event::Closed => break,
            other => panic!("expected packets then the close, got {other:?} after {read}"),
        }
    }
    match last {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason_code, ReasonCode::QUOTA_EXCEEDED),
        other => {
            panic!("after {read} PUBLISHes the last packet was {other:?}, not DISCONNECT 0x97")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_metric_counts_connections_not_messages() {
    let (broker, addr) = start_broker(config()).await;
    let _s = stalled_subscriber(addr, "slow-count", 0).await;
    flood_until_cut_off(&broker, addr, Duration::from_secs(6)).await;
    let n = broker.metrics().slow_consumers.load(Ordering::Relaxed);
    assert_eq!(
        n, 1,
        "one slow connection was closed with 0x97, but metrics().slow_consumers = {n} \
        (documented as 'Connections closed with 0x97')"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_consumer_session_queue_stays_bounded() {
    let (broker, addr) = start_broker(config()).await;
    let _s = stalled_subscriber(addr, "slow-bound", 60).await;
    let sent = flood_until_cut_off(&broker, addr, Duration::from_secs(6)).await;
    // Everything the session still holds (in flight + queued) is resent on resume:
    // it must stay within the configured limit.
    let mut connect = connect_packet(V5, "slow-bound");
    connect.clean_start = false;
    connect.properties = ConnectProperties {
        session_expiry_interval: Some(60),
        ..Default::default()
    };
    let (mut c, ack) = RawClient::connect_with(addr, connect).await;
    assert!(ack.session_present);
    let mut held = 0usize;
    loop {
        match c.next_event(Duration::from_millis(500)).await {
            Event::Packet(Packet::Publish(p)) => {
                held += 1;
                c.ack(&p).await;
                if held > 10 * MAX_QUEUED {
                    break; // clearly unbounded; no need to read it all
                }
            }
            Event::Packet(_) => {}
            _ => break,
        }
    }
    assert!(
        held <= 2 * MAX_QUEUED,
        "max_queued_messages = {MAX_QUEUED} but the session held {held}{} messages ({sent} flooded, \
         slow_consumers = {})",
        if held > 10 * MAX_QUEUED { "+" } else { "" },
        broker.metrics().slow_consumers.load(Ordering::Relaxed)
    );
}

/// A persistent session whose queue filled to the bound while it was offline must be
/// able to resume and drain it while new messages keep arriving: resuming is not
/// being slow.
#[tokio::test]
async fn a_session_resuming_with_a_full_queue_is_not_cut_off() {
    let (broker, addr) = start_broker(config()).await;
    let mut sub = RawClient::connect_with(addr, {
        let mut c = connect_packet(V5, "resume-full");
        c.clean_start = false;
        c.properties = ConnectProperties {
            session_expiry_interval: Some(60),
            ..Default::default()
        };
        c
    })
    .await
    .0;
    sub.subscribe("resume/full", opts(QoS::AtLeastOnce)).await;
    sub.send(&Packet::Disconnect(Default::default())).await;
    sub.expect_closed().await;

    // Fill the offline queue to its bound.
    let mut publisher = RawClient::connect(addr, V5, "resume-pub").await;
    for i in 0..MAX_QUEUED {
        publisher
            .publish(publish(
                "resume/full",
                QoS::AtLeastOnce,
                format!("old {i}").as_bytes(),
            ))
            .await;
    }

    // Resume, and keep publishing while the backlog drains.
    let mut connect = connect_packet(V5, "resume-full");
    connect.clean_start = false;
    connect.properties = ConnectProperties {
        session_expiry_interval: Some(60),
        ..Default::default()
    };
    let (mut sub, ack) = RawClient::connect_with(addr, connect).await;
    assert!(ack.session_present);
    // Concurrently: a session past its high-water mark holds its publishers back
    // until it drains.
    let publishing = tokio::spawn(async move {
        for i in 0..10 {
            publisher
                .publish(publish(
                    "resume/full",
                    QoS::AtLeastOnce,
                    format!("new {i}").as_bytes(),
                ))
                .await;
        }
    });
    let mut received = 0;
    while received < MAX_QUEUED + 10 {
        match sub.next_event(Duration::from_secs(3)).await {
            Event::Packet(Packet::Publish(p)) => {
                received += 1;
                sub.ack(&p).await;
            }
            Event::Packet(Packet::Disconnect(d)) => {
                panic!("resumed session was cut off: {d:?} after {received}")
            }
            Event::Packet(_) => {}
            other => panic!("expected the backlog, got {other:?} after {received}"),
        }
    }
    publishing.await.unwrap();
    assert_eq!(broker.metrics().slow_consumers.load(Ordering::Relaxed), 0);
}
