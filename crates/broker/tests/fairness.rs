//! Fairness between the connections of one worker: a client that keeps its socket
//! full (more pipelined packets than one read takes) does not hold the worker while
//! another connection has packets waiting.

use statehub_broker::codec::{Codec, Packet, ProtocolVersion, QoS};
use statehub_test_support::*;

/// Packets the busy client has written before the other client writes its one.
const BURST: usize = 150;

/// The busy client's burst (about 30 KB, several reads' worth) and then one PUBLISH
/// of another client land in the broker's sockets together, written without letting
/// the broker run in between (the test and the broker share one thread). Whatever the
/// busy connection's task reads next, the other connection is handled before the busy
/// one's next read: the subscriber sees the other client's message after at most two
/// reads' worth of the burst, not after all of it.
#[tokio::test(flavor = "current_thread")]
async fn a_pipelining_client_does_not_hold_the_worker_while_another_waits() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "watcher").await;
    sub.subscribe("fair/#", opts(QoS::AtMostOnce)).await;
    let mut busy = RawClient::connect(addr, V5, "busy").await;
    let mut other = RawClient::connect(addr, V5, "other").await;

    let codec = Codec::with_version(ProtocolVersion::V5, 0);
    let mut burst = bytes::BytesMut::new();
    for i in 0..BURST {
        let payload = format!("{i:0>200}");
        let p = publish("fair/busy", QoS::AtMostOnce, payload.as_bytes());
        codec.encode(&Packet::Publish(p), &mut burst).unwrap();
    }
    let mut one = bytes::BytesMut::new();
    let p = publish("fair/other", QoS::AtMostOnce, b"other");
    codec.encode(&Packet::Publish(p), &mut one).unwrap();
    // No await from here to the last write: the broker cannot read in between.
    write_now(&busy.stream, &burst);
    write_now(&other.stream, &one);

    let mut before = 0;
    loop {
        let p = sub.expect_publish().await;
        if &*p.topic == "fair/other" {
            break;
        }
        before += 1;
    }
    // A read takes 4 KiB (about 19 of these packets); the whole burst is 150.
    assert!(
        before <= 40,
        "{before} of the busy client's {BURST} packets were handled before the other client's one"
    );
    for _ in before..BURST {
        assert_eq!(&*sub.expect_publish().await.topic, "fair/busy");
    }
    busy.ping().await;
    other.ping().await;
}

/// Writes all of `bytes` without waiting: the socket's buffers take tens of KB at once.
fn write_now(stream: &tokio::net::TcpStream, bytes: &[u8]) {
    let mut at = 0;
    while at < bytes.len() {
        match stream.try_write(&bytes[at..]) {
            Ok(n) => at += n,
            Err(e) => panic!("the socket did not take {} bytes at once: {e}", bytes.len()),
        }
    }
}
