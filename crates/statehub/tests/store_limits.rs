//! The state store's default limits against the binary, each with the server's
//! resident memory (VmRSS) measured while a client tries to exceed it: before the
//! limits, each of these grew the server by tens or hundreds of megabytes.
//!
//! Sizes are small enough to run in seconds and large enough that the growth without
//! the limit is well past the bound asserted.

mod common;
mod store_client;

use std::time::Duration;

use store_client::{rss_kib, Call, StoreClient, LOCAL, QUOTA};

const MIB: u64 = 1024;

/// Sends `calls` in batches of `batch` (so the server never holds many at once) and
/// returns every answer's payload.
async fn send_all(client: &mut StoreClient, calls: Vec<Call>, batch: usize) -> Vec<Vec<u8>> {
    let mut payloads = Vec::with_capacity(calls.len());
    let mut calls = calls.into_iter().peekable();
    while calls.peek().is_some() {
        let chunk: Vec<Call> = calls.by_ref().take(batch).collect();
        for answer in client.call_many(chunk).await {
            payloads.push(answer.payload);
        }
    }
    payloads
}

/// How many answers are `+OK` and how many the quota refusal; anything else fails.
fn tally(payloads: &[Vec<u8>]) -> (usize, usize) {
    let ok = payloads
        .iter()
        .filter(|p| p.as_slice() == b"+OK\r\n")
        .count();
    let refused = payloads.iter().filter(|p| p.as_slice() == QUOTA).count();
    assert_eq!(ok + refused, payloads.len(), "unexpected answers");
    (ok, refused)
}

fn numbered_key(i: usize, len: usize) -> Vec<u8> {
    let mut key = format!("{i:08}").into_bytes();
    key.resize(len, b'k');
    key
}

/// Keys over 16 KiB are refused: 1,000 SETs of 32 KiB keys stored them twice over
/// (+64 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_over_the_size_limit_are_refused() {
    let server = common::start(&LOCAL, &[]);
    let pid = server.child.id();
    let mut client = StoreClient::connect(server.mqtt, "long-keys").await;
    let before = rss_kib(pid);
    let calls = (0..1_000)
        .map(|i| Call::new(&[b"SET", &numbered_key(i, 32 << 10), b"v"]))
        .collect();
    let payloads = send_all(&mut client, calls, 50).await;
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    assert!(grown < 24 * MIB, "the server grew by {grown} KiB");
    assert_eq!(tally(&payloads), (0, 1_000));
}

/// The byte quota (128 MiB of keys and values) holds: 300 values of 1 MB grew the
/// server by over 300 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_byte_quota_bounds_memory() {
    let server = common::start(&LOCAL, &[]);
    let pid = server.child.id();
    let mut client = StoreClient::connect(server.mqtt, "big-values").await;
    let before = rss_kib(pid);
    let value = vec![b'v'; 1_000_000];
    let calls = (0..300)
        .map(|i| Call::new(&[b"SET", &numbered_key(i, 8), &value]))
        .collect();
    let payloads = send_all(&mut client, calls, 10).await;
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    assert!(grown < 200 * MIB, "the server grew by {grown} KiB");
    let stored = (128 << 20) / 1_000_008;
    assert_eq!(tally(&payloads), (stored, 300 - stored));
}

/// One client observes at most 1,000 keys: 20,000 KEYNOTIFYs of 1 KiB keys grew the
/// server by about 30 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_observes_at_most_a_thousand_keys() {
    let server = common::start(&LOCAL, &[]);
    let pid = server.child.id();
    let mut client = StoreClient::connect(server.mqtt, "observer").await;
    let before = rss_kib(pid);
    let calls = (0..20_000)
        .map(|i| Call::new(&[b"KEYNOTIFY", &numbered_key(i, 1 << 10)]))
        .collect();
    let payloads = send_all(&mut client, calls, 200).await;
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    assert!(grown < 12 * MIB, "the server grew by {grown} KiB");
    assert_eq!(tally(&payloads), (1_000, 19_000));
}

/// All clients together observe at most 16 MiB of keys: 20 clients observing 1,000
/// keys of 4 KiB each grew the server by about 100 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_of_all_clients_are_bounded() {
    let server = common::start(&LOCAL, &[]);
    let pid = server.child.id();
    let mut clients = Vec::new();
    for c in 0..20 {
        clients.push(StoreClient::connect(server.mqtt, &format!("observer-{c}")).await);
    }
    let before = rss_kib(pid);
    let mut tasks = Vec::new();
    for (c, mut client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let calls = (0..1_000)
                .map(|i| Call::new(&[b"KEYNOTIFY", &numbered_key(c * 1_000 + i, 4 << 10)]))
                .collect();
            let payloads = send_all(&mut client, calls, 100).await;
            (tally(&payloads), client)
        }));
    }
    let mut clients = Vec::new();
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        let ((o, r), client) = task.await.expect("observer task");
        ok += o;
        refused += r;
        clients.push(client);
    }
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    assert!(grown < 60 * MIB, "the server grew by {grown} KiB");
    assert_eq!((ok, refused), (4_096, 20_000 - 4_096));
}

/// A notification topic carries the client id and the key in hex and must fit in an
/// MQTT topic name (65,535 bytes). KEYNOTIFY and SET of a 32,741-byte key both answered
/// `+OK` and the notification was dropped unseen; now a KEYNOTIFY whose topic could not
/// be sent is refused up front, and one that fits is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_whose_topic_cannot_fit_is_refused() {
    let server = common::start(&LOCAL, &[]);
    let mut short = StoreClient::connect(server.mqtt, "s").await;
    let huge_key = vec![b'k'; 32_741];
    assert_eq!(short.call(&[b"KEYNOTIFY", &huge_key]).await.payload, QUOTA);
    assert_eq!(short.call(&[b"SET", &huge_key, b"v"]).await.payload, QUOTA);

    // A client id of 25,000 bytes leaves room for keys of up to 7,730 bytes.
    let long_id = "c".repeat(25_000);
    let mut long = StoreClient::connect(server.mqtt, &long_id).await;
    let too_long = vec![b'k'; 7_731];
    let fits = vec![b'k'; 7_730];
    assert_eq!(long.call(&[b"KEYNOTIFY", &too_long]).await.payload, QUOTA);
    assert_eq!(long.call(&[b"KEYNOTIFY", &fits]).await.payload, b"+OK\r\n");
    assert_eq!(
        short.call(&[b"KEYNOTIFY", &too_long]).await.payload,
        b"+OK\r\n"
    );

    assert_eq!(short.call(&[b"SET", &fits, b"1"]).await.payload, b"+OK\r\n");
    assert_eq!(
        short.call(&[b"SET", &too_long, b"2"]).await.payload,
        b"+OK\r\n"
    );
    let wait = Duration::from_secs(30);
    let to_long = long
        .notification(wait)
        .await
        .expect("the long id's notification");
    assert_eq!(to_long.topic.len(), 65_535);
    assert!(to_long.payload.ends_with(b"$1\r\n1\r\n"));
    let to_short = short
        .notification(wait)
        .await
        .expect("the short id's notification");
    assert!(to_short.payload.ends_with(b"$1\r\n2\r\n"));
}

/// The key quota (100,000 keys) holds: tiny keys cost the server about 300 bytes each,
/// so 200,000 of them grew it by about 60 MB (100,000 by about 35 MB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_quota_bounds_memory() {
    let server = common::start(&LOCAL, &[]);
    let pid = server.child.id();
    let mut clients = Vec::new();
    for c in 0..4 {
        clients.push(StoreClient::connect(server.mqtt, &format!("many-keys-{c}")).await);
    }
    let before = rss_kib(pid);
    let mut tasks = Vec::new();
    for (c, mut client) in clients.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let calls = (0..50_000)
                .map(|i| Call::new(&[b"SET", &numbered_key(c * 50_000 + i, 8), b"v"]))
                .collect();
            let payloads = send_all(&mut client, calls, 500).await;
            tally(&payloads)
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for task in tasks {
        let (o, r) = task.await.expect("writer task");
        ok += o;
        refused += r;
    }
    let grown = rss_kib(pid).saturating_sub(before);
    eprintln!("the server grew by {grown} KiB");
    assert!(grown < 46 * MIB, "the server grew by {grown} KiB");
    assert_eq!((ok, refused), (100_000, 100_000));
}
