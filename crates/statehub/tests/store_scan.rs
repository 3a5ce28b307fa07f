//! SCAN against the binary: the pathological pattern must not freeze the broker.
//!
//! One key of `[` and SCANs with pattern `*` + 2,000 `[` + `b` took ~29 s each under
//! the state store's lock, on an MQTT worker thread: meanwhile no client anywhere got a
//! CONNACK and no state store request was answered. Here an attacker pipelines such
//! SCANs while another client's GET and SET and a fresh CONNECT must be answered; every
//! wait is bounded generously (the old matcher needed minutes for what is sent here).

mod common;
mod store_client;

use store_client::{Call, StoreClient, LOCAL, PATIENCE};
use tokio::time::timeout;

/// The issue used a 20 KB key; the default key limit is 16 KiB.
const KEY_LEN: usize = 16_000;
const SCANS: usize = 20;

fn pattern() -> Vec<u8> {
    let mut pattern = vec![b'*'];
    pattern.extend(std::iter::repeat_n(b'[', 2_000));
    pattern.push(b'b');
    pattern
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pathological_scan_does_not_stop_other_clients() {
    let server = common::start(&LOCAL, &[]);
    let mut attacker = StoreClient::connect(server.mqtt, "scanner").await;
    let mut other = StoreClient::connect(server.mqtt, "other").await;
    let key = vec![b'['; KEY_LEN];
    assert_eq!(
        attacker.call(&[b"SET", &key, b"v"]).await.payload,
        b"+OK\r\n"
    );

    let pattern = pattern();
    let mut first = None;
    for _ in 0..SCANS {
        let sent = attacker.send(Call::new(&[b"SCAN", &pattern])).await;
        first.get_or_insert(sent);
    }
    // While the SCANs are queued or running: another client's SET and GET, and a new
    // connection's CONNACK and first request.
    let served = async {
        let set = other.call(&[b"SET", b"k", b"v"]).await;
        let get = other.call(&[b"GET", b"k"]).await;
        let mut fresh = StoreClient::connect(server.mqtt, "fresh").await;
        let fresh_get = fresh.call(&[b"GET", b"k"]).await;
        (set.payload, get.payload, fresh_get.payload)
    };
    let (set, get, fresh_get) = timeout(PATIENCE, served)
        .await
        .expect("other clients served while the SCANs are outstanding");
    assert_eq!(set, b"+OK\r\n");
    assert_eq!(get, b"$1\r\nv\r\n");
    assert_eq!(fresh_get, b"$1\r\nv\r\n");

    // And the SCANs themselves are answered: no key matches.
    let answers = attacker.answers(first.unwrap(), SCANS).await;
    for answer in answers {
        assert_eq!(answer.payload, b"*1\r\n*0\r\n");
    }
    // Without the final `b` the key matches.
    let matching = &pattern[..pattern.len() - 1];
    let page = attacker.call(&[b"SCAN", matching]).await.payload;
    assert!(
        page.ends_with(&[&key[..], b"\r\n"].concat()),
        "{} bytes",
        page.len()
    );
}

/// A pattern longer than the limit (4 KiB) is refused with the store's quota error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pattern_over_the_limit_is_refused() {
    let server = common::start(&LOCAL, &[]);
    let mut client = StoreClient::connect(server.mqtt, "long-pattern").await;
    let pattern = vec![b'?'; 4_097];
    let answer = client.call(&[b"SCAN", &pattern]).await;
    assert_eq!(answer.payload, store_client::QUOTA);
    let pattern = vec![b'*'; 4_096];
    assert_eq!(
        client.call(&[b"SCAN", &pattern]).await.payload,
        b"*1\r\n*0\r\n"
    );
}
