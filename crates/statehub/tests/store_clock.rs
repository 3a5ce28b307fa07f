//! The state store's clock against the binary: the wrap attack on the lock
//! pattern. A `__ts` 20 s ahead (inside the 60 s skew) with counter `u64::MAX` made the
//! next tick wrap the counter to 0, so a later lock holder got a lower fencing token than
//! the previous one: the stale holder's fenced write was accepted and the current one's
//! refused. Now such a stamp is `malformed timestamp`, the largest counter the SDKs send
//! (`u64::MAX - 1`) moves the clock to the next millisecond, and tokens keep their order.

mod common;
mod store_client;

use store_client::{now_ms, Call, StoreClient, LOCAL};

const MALFORMED: &[u8] = b"-ERR malformed timestamp\r\n";
const FT_LOWER: &[u8] = b"-ERR the request fencing token is a lower version than the fencing token protecting the resource\r\n";

/// `wall:counter:node` as numbers, for ordering (node ids are the server's own).
fn parse(version: &str) -> (u64, u64) {
    let mut parts = version.split(':');
    let wall = parts.next().unwrap().parse().unwrap();
    let counter = parts.next().unwrap().parse().unwrap();
    (wall, counter)
}

/// The attack: a stamp 20 s ahead with counter `u64::MAX` (in `__ts`, then in `__ft`),
/// then the largest counter in range. Returns the three answers, checked at the end so
/// that code without the fix fails on what the attack does to the lock.
async fn attack(attacker: &mut StoreClient) -> Vec<Vec<u8>> {
    let ahead = now_ms() + 20_000;
    let stamp = |counter: u64| format!("{ahead:015}:{counter}:x");
    let get = || Call::new(&[b"GET", b"anything"]);
    let calls = vec![
        get().ts(stamp(u64::MAX)),
        get().ft(stamp(u64::MAX)),
        get().ts(stamp(u64::MAX - 1)),
    ];
    let mut answers = Vec::new();
    for call in calls {
        answers.push(attacker.call_with(call).await.payload);
    }
    answers
}

async fn acquire(holder: &mut StoreClient, name: &str) -> String {
    let answer = holder
        .call(&[b"SET", b"lock", name.as_bytes(), b"NX", b"PX", b"30000"])
        .await;
    assert_eq!(answer.payload, b"+OK\r\n", "{name} takes the lock");
    answer
        .version
        .expect("the lock's version is the fencing token")
}

async fn fenced_write(holder: &mut StoreClient, name: &str, token: &str) -> Vec<u8> {
    let call = Call::new(&[b"SET", b"resource", name.as_bytes()]).ft(token);
    holder.call_with(call).await.payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_lock_holder_gets_a_higher_fencing_token() {
    let server = common::start(&LOCAL, &[]);
    let mut attacker = StoreClient::connect(server.mqtt, "attacker").await;
    let mut a = StoreClient::connect(server.mqtt, "holder-a").await;
    let mut b = StoreClient::connect(server.mqtt, "holder-b").await;

    let first = attack(&mut attacker).await;
    let token_a = acquire(&mut a, "a").await;
    assert_eq!(fenced_write(&mut a, "a", &token_a).await, b"+OK\r\n");
    assert_eq!(a.call(&[b"DEL", b"lock"]).await.payload, b":1\r\n");

    let second = attack(&mut attacker).await;
    let token_b = acquire(&mut b, "b").await;
    assert!(
        parse(&token_b) > parse(&token_a),
        "later holder's token {token_b} is not above {token_a}"
    );
    assert_eq!(fenced_write(&mut b, "b", &token_b).await, b"+OK\r\n");
    assert_eq!(fenced_write(&mut a, "a", &token_a).await, FT_LOWER);
    let value = b.call(&[b"GET", b"resource"]).await.payload;
    assert_eq!(value, b"$1\r\nb\r\n");
    for answers in [first, second] {
        assert_eq!(answers, [MALFORMED, MALFORMED, b"$-1\r\n"]);
    }
}
