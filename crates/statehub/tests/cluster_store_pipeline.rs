//! With `--redis`, one client's state store requests are in Redis at once: those that
//! queue behind a request waiting for Redis go out together, their scripts in one
//! pipeline, before any of them is answered; and they are answered, and acknowledged,
//! in the client's order, each GET seeing the SET before it.

mod common;
mod store_client;

use statehub_redis_common::test_server::RedisServer;
use store_client::held::{held_node, until_held};
use store_client::raw::{acks_and_answers, request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_requests_queued_behind_one_are_in_redis_together_and_answered_in_order() {
    let redis = RedisServer::start();
    // Two store threads: the client's requests queue on the second.
    let (proxy, _node, id, mut c) = held_node(&redis).await;
    c.send(&request(&id, 1, &[b"SET", b"first", b"v"])).await;
    let (acked, _) = acks_and_answers(&mut c, 1).await;
    assert_eq!(acked, [1]);

    // The first request waits at the proxy; the client's next ones queue behind it.
    proxy.hold(true);
    c.send(&request(&id, 2, &[b"SET", b"w", b"0"])).await;
    assert_eq!(until_held(&proxy, 1).await, 1, "the first request's script");
    let keys: Vec<String> = (1..=4).map(|i| format!("k{i}")).collect();
    let mut calls: Vec<Vec<&[u8]>> = Vec::new();
    for key in &keys {
        calls.push(vec![b"SET", key.as_bytes(), key.as_bytes()]);
        calls.push(vec![b"GET", key.as_bytes()]);
    }
    for (i, args) in calls.iter().enumerate() {
        c.send(&request(&id, u16::try_from(i + 3).unwrap(), args))
            .await;
    }
    // Read and queued (the PINGREQ behind them is answered).
    c.ping().await;

    // Once the first is answered, the eight go out together, none answered yet.
    proxy.release();
    let together = until_held(&proxy, calls.len()).await;
    assert!(
        together == calls.len(),
        "{together} of the {} queued requests were in Redis at once",
        calls.len()
    );
    proxy.hold(false);
    proxy.release();

    let (acked, answers) = acks_and_answers(&mut c, calls.len() + 1).await;
    let ids: Vec<u16> = (2..=u16::try_from(calls.len() + 2).unwrap()).collect();
    assert_eq!(acked, ids, "PUBACKs in the order of the requests");
    assert_eq!(answers[&2], b"+OK\r\n");
    for (i, key) in keys.iter().enumerate() {
        let set = u16::try_from(2 * i + 3).unwrap();
        assert_eq!(answers[&set], b"+OK\r\n");
        let got = format!("${}\r\n{key}\r\n", key.len());
        assert_eq!(answers[&(set + 1)], got.as_bytes(), "the GET saw its SET");
    }
}

/// A request of a run whose reply shows the store corrupt fails the store: the ones
/// after it in the same run answer 503, as each would alone once the store failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_of_a_run_after_one_that_fails_the_store_answer_503() {
    let redis = RedisServer::start();
    let (proxy, _node, id, mut c) = held_node(&redis).await;
    c.send(&request(&id, 1, &[b"SET", b"first", b"v"])).await;
    let (acked, _) = acks_and_answers(&mut c, 1).await;
    assert_eq!(acked, [1]);
    // An entry the engine never writes: its version is no number.
    redis.command(&[
        "HSET",
        "{statehub}:e:bad",
        "v",
        "x",
        "vw",
        "garbage",
        "vc",
        "0",
    ]);

    proxy.hold(true);
    c.send(&request(&id, 2, &[b"SET", b"w", b"0"])).await;
    assert_eq!(until_held(&proxy, 1).await, 1, "the first request's script");
    let calls: [&[&[u8]]; 4] = [
        &[b"SET", b"k1", b"v"],
        &[b"GET", b"bad"],
        &[b"SET", b"k2", b"v"],
        &[b"GET", b"k2"],
    ];
    for (i, args) in calls.iter().enumerate() {
        c.send(&request(&id, u16::try_from(i + 3).unwrap(), args))
            .await;
    }
    c.ping().await;
    proxy.release();
    assert_eq!(until_held(&proxy, calls.len()).await, calls.len());
    proxy.hold(false);
    proxy.release();

    let (_, answers) = acks_and_answers(&mut c, calls.len() + 1).await;
    assert_eq!(answers[&3], b"+OK\r\n");
    for id in 4..=6 {
        assert!(
            answers[&id].is_empty(),
            "request {id} answered 503, got {:?}",
            String::from_utf8_lossy(&answers[&id])
        );
    }
}
