//! Persistent MQTT sessions across statehub nodes on one redis-server (`--redis`): a
//! session kept on one node moves with its client to another, with its subscriptions,
//! queued and unacknowledged messages and QoS 2 state, whether the first node is up
//! (it hands the session over) or was killed (its session is taken as Redis has it,
//! and what was published after its death is replayed into it).

mod common;

use std::time::Duration;

use common::cluster::{node_with_settings, node_with_ttl, publish_acked};
use statehub_broker::codec::{Packet, PubResponse, QoS, ReasonCode};
use statehub_redis_common::test_server::RedisServer;
use statehub_test_support::{opts, persistent_connect, RawClient, V5};

/// A CONNACK a client racing another for its session may get, and retry after.
fn allowed_retry(code: ReasonCode) -> bool {
    [ReasonCode::SERVER_BUSY, ReasonCode::UNSPECIFIED_ERROR].contains(&code)
}

/// Short, so a killed node is found dead within a second or two.
const TTL_MS: u64 = 2000;

/// Connects `client_id` with a persistent session (expiry 300 s); the CONNACK's
/// Session Present.
async fn resume(addr: std::net::SocketAddr, client_id: &str) -> (RawClient, bool) {
    let (c, ack) = RawClient::connect_with(addr, persistent_connect(client_id, 300)).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS, "{ack:?}");
    (c, ack.session_present)
}

/// Publishes QoS 1 messages `prefix0..prefixN` through `c`, each acknowledged.
async fn publish_all(c: &mut RawClient, topic: &str, prefix: &str, n: usize) -> Vec<String> {
    let mut sent = Vec::new();
    for i in 0..n {
        let payload = format!("{prefix}{i}");
        let code = publish_acked(c, topic, QoS::AtLeastOnce, payload.as_bytes()).await;
        assert_eq!(code, ReasonCode::SUCCESS, "{payload}");
        sent.push(payload);
    }
    sent
}

/// The next `n` messages' payloads, each acknowledged.
async fn take(c: &mut RawClient, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        let p = c.expect_publish_ack().await;
        got.push(String::from_utf8(p.payload.to_vec()).unwrap());
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_session_moves_to_a_third_node_with_every_message_queued_meanwhile() {
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let c = node_with_ttl(&redis, "c", TTL_MS);
    let (mut sub, present) = resume(a.mqtt, "roamer").await;
    assert!(!present);
    sub.subscribe("q/#", opts(QoS::AtLeastOnce)).await;
    sub.disconnect().await;
    let mut publisher = RawClient::connect(b.mqtt, V5, "publisher").await;
    let sent = publish_all(&mut publisher, "q/1", "m", 10).await;

    let (mut sub, present) = resume(c.mqtt, "roamer").await;
    assert!(present, "the session moved from a to c");
    assert_eq!(take(&mut sub, 10).await, sent, "all, in order");
    sub.expect_nothing(Duration::from_millis(300)).await;
    // Its subscription works on c, for messages published on any node.
    let mut on_a = RawClient::connect(a.mqtt, V5, "publisher-a").await;
    publish_all(&mut on_a, "q/2", "after", 1).await;
    assert_eq!(take(&mut sub, 1).await, ["after0"]);
    sub.expect_nothing(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_on_another_node_resends_unacknowledged_messages_with_dup() {
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let (mut first, _) = resume(a.mqtt, "mover").await;
    first.subscribe("t", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(b.mqtt, V5, "publisher").await;
    let sent = publish_all(&mut publisher, "t", "u", 3).await;
    // Received on a and never acknowledged.
    let mut ids = Vec::new();
    for want in &sent {
        let p = first.expect_publish().await;
        assert_eq!(String::from_utf8_lossy(&p.payload), *want);
        ids.push(p.packet_id);
    }

    let (mut second, present) = resume(b.mqtt, "mover").await;
    assert!(present);
    first
        .expect_disconnect(ReasonCode::SESSION_TAKEN_OVER)
        .await;
    for (want, id) in sent.iter().zip(&ids) {
        let p = second.expect_publish().await;
        assert_eq!(String::from_utf8_lossy(&p.payload), *want);
        assert!(p.dup, "resent with DUP");
        assert_eq!(p.packet_id, *id, "under the id it had");
        second.ack(&p).await;
    }
    let new = publish_all(&mut publisher, "t", "new", 2).await;
    assert_eq!(take(&mut second, 2).await, new);
    second.expect_nothing(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_session_resumes_elsewhere_with_what_was_published_before_and_after() {
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let c = node_with_ttl(&redis, "c", TTL_MS);
    let (mut sub, _) = resume(a.mqtt, "survivor").await;
    sub.subscribe("k/#", opts(QoS::AtLeastOnce)).await;
    sub.disconnect().await;
    let mut publisher = RawClient::connect(b.mqtt, V5, "publisher").await;
    let mut sent = publish_all(&mut publisher, "k/1", "before", 5).await;
    a.kill();
    sent.extend(publish_all(&mut publisher, "k/1", "after", 5).await);

    let (mut sub, present) = resume(c.mqtt, "survivor").await;
    assert!(present, "the dead node's session");
    assert_eq!(
        take(&mut sub, sent.len()).await,
        sent,
        "every acknowledged message, in order"
    );
    sub.expect_nothing(Duration::from_millis(300)).await;
    publish_all(&mut publisher, "k/2", "live", 1).await;
    assert_eq!(take(&mut sub, 1).await, ["live0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_2_state_moves_with_the_session_and_nothing_is_delivered_twice() {
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let (mut first, _) = resume(a.mqtt, "exact").await;
    first.subscribe("x", opts(QoS::ExactlyOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "publisher").await;
    for payload in [&b"one"[..], b"two"] {
        let code = publish_acked(&mut publisher, "x", QoS::ExactlyOnce, payload).await;
        assert_eq!(code, ReasonCode::SUCCESS);
    }
    // "one" is received (PUBREC sent, PUBREL back, no PUBCOMP); "two" only arrived.
    let one = first.expect_publish().await;
    assert_eq!(&one.payload[..], b"one");
    let one_id = one.packet_id.unwrap();
    first.send(&Packet::PubRec(PubResponse::ok(one_id))).await;
    first
        .expect_reply(
            "PUBREL",
            |p| matches!(p, Packet::PubRel(r) if r.packet_id == one_id),
        )
        .await;
    let two = first.expect_publish().await;
    assert_eq!(&two.payload[..], b"two");

    let (mut second, present) = resume(b.mqtt, "exact").await;
    assert!(present);
    // "one" is only released again (the client has it), "two" is resent under its id.
    match second.expect().await {
        Packet::PubRel(r) => assert_eq!(r.packet_id, one_id),
        other => panic!("expected PUBREL of the first message, got {other:?}"),
    }
    second.send(&Packet::PubComp(PubResponse::ok(one_id))).await;
    let again = second.expect_publish().await;
    assert_eq!((&again.payload[..], again.dup), (&b"two"[..], true));
    assert_eq!(again.packet_id, two.packet_id);
    second.ack(&again).await;
    second.expect_nothing(Duration::from_millis(500)).await;
    // A third node, later: nothing is left to deliver.
    drop(second);
    let c = node_with_ttl(&redis, "c", TTL_MS);
    let (mut third, present) = resume(c.mqtt, "exact").await;
    assert!(present);
    third.expect_nothing(Duration::from_millis(500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_shared_group_members_are_no_longer_picked() {
    use statehub_test_support::Event;
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let mut near = RawClient::connect(a.mqtt, V5, "near").await;
    near.subscribe("$share/g/s/#", opts(QoS::AtLeastOnce)).await;
    let mut far = RawClient::connect(b.mqtt, V5, "far").await;
    far.subscribe("$share/g/s/#", opts(QoS::AtLeastOnce)).await;
    let mut publisher = RawClient::connect(a.mqtt, V5, "publisher").await;
    let quiet = Duration::from_millis(200);
    let arrived = |e: &Event| matches!(e, Event::Packet(Packet::Publish(_)));
    // Until a knows of b's member: some message goes there.
    let mut far_got = false;
    for i in 0..100 {
        publish_acked(
            &mut publisher,
            "s/1",
            QoS::AtLeastOnce,
            format!("w{i}").as_bytes(),
        )
        .await;
        if let Event::Packet(Packet::Publish(p)) = far.next_event(quiet).await {
            far.ack(&p).await;
            far_got = true;
            break;
        }
        while let Event::Packet(Packet::Publish(p)) = near.next_event(Duration::ZERO).await {
            near.ack(&p).await;
        }
    }
    assert!(far_got, "the group spans both nodes");
    b.kill();
    // Once b's liveness key expired, every message goes to the member on a.
    let mut streak = 0;
    for i in 0..100 {
        publish_acked(
            &mut publisher,
            "s/1",
            QoS::AtLeastOnce,
            format!("d{i}").as_bytes(),
        )
        .await;
        let e = near.next_event(quiet).await;
        if let Event::Packet(Packet::Publish(p)) = &e {
            near.ack(p).await;
        }
        streak = if arrived(&e) { streak + 1 } else { 0 };
        if streak == 10 {
            break;
        }
    }
    assert_eq!(streak, 10, "messages are still picked for the dead node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_resuming_one_session_at_once_lose_none_of_its_messages() {
    let redis = RedisServer::start();
    let nodes: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|id| node_with_ttl(&redis, id, TTL_MS))
        .collect();
    let (mut sub, _) = resume(nodes[0].mqtt, "racer").await;
    sub.subscribe("r/#", opts(QoS::AtLeastOnce)).await;
    sub.disconnect().await;
    let mut publisher = RawClient::connect(nodes[0].mqtt, V5, "publisher").await;
    let sent = publish_all(&mut publisher, "r/1", "s", 5).await;
    let mut won = false;
    for round in 0..4 {
        // Two CONNECTs of one client id on two nodes at once; neither acknowledges.
        let (one, two) = tokio::join!(
            RawClient::connect_with(nodes[1].mqtt, persistent_connect("racer", 300)),
            RawClient::connect_with(nodes[2].mqtt, persistent_connect("racer", 300)),
        );
        let codes = [one.1.reason_code, two.1.reason_code];
        // The loser is refused (0x89: its session left while it connected; 0x80: a
        // node stalled past its liveness on this loaded machine was fenced), or taken
        // over later with 0x8E.
        let allowed = [
            ReasonCode::SUCCESS,
            ReasonCode::SERVER_BUSY,
            ReasonCode::UNSPECIFIED_ERROR,
        ];
        assert!(
            codes.iter().all(|c| allowed.contains(c)),
            "round {round}: {codes:?}"
        );
        won |= codes.contains(&ReasonCode::SUCCESS);
    }
    assert!(won, "some connection resumed the session");
    // Whichever won, the session is whole on a fourth node.
    let mut last = None;
    for _ in 0..20 {
        let (c, ack) =
            RawClient::connect_with(nodes[3].mqtt, persistent_connect("racer", 300)).await;
        if ack.reason_code == ReasonCode::SUCCESS {
            assert!(ack.session_present);
            last = Some(c);
            break;
        }
        assert!(allowed_retry(ack.reason_code), "{ack:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut sub = last.expect("the session resumed on d");
    assert_eq!(take(&mut sub, sent.len()).await, sent);
    sub.expect_nothing(Duration::from_millis(300)).await;
}

/// paho (`.venv`, installed by `scripts/install-test-deps.sh`) subscribes on a, its
/// messages are published on b, it resumes on c.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paho_session_moves_between_nodes() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} (scripts/install-test-deps.sh)",
        python.display()
    );
    let script = root.join("crates/statehub/tests/scripts/paho_session.py");
    let run = |port: u16, args: &[&str]| {
        let out = std::process::Command::new(&python)
            .arg(&script)
            .arg(port.to_string())
            .args(args)
            .output()
            .expect("run python");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let c = node_with_ttl(&redis, "c", TTL_MS);
    tokio::task::block_in_place(|| run(a.mqtt.port(), &["subscribe"]));
    let mut publisher = RawClient::connect(b.mqtt, V5, "publisher").await;
    let sent = publish_all(&mut publisher, "p/1", "paho", 4).await;
    let out = tokio::task::block_in_place(|| run(c.mqtt.port(), &["resume", "4"]));
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("PRESENT 1"), "{out}");
    let got: Vec<&str> = lines.filter_map(|l| l.strip_prefix("MSG ")).collect();
    assert_eq!(got, sent, "{out}");
}

/// QoS 1 messages `{name}-0`, `{name}-1`... on `topic` through `addr`, each
/// acknowledged, until `stop` is set; `count` counts them.
async fn publish_until(
    addr: std::net::SocketAddr,
    name: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<String> {
    use std::sync::atomic::Ordering;
    let mut c = RawClient::connect(addr, V5, &name).await;
    let mut sent = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let payload = format!("{name}-{}", sent.len());
        let code = publish_acked(&mut c, "w/1", QoS::AtLeastOnce, payload.as_bytes()).await;
        assert_eq!(code, ReasonCode::SUCCESS, "{payload}");
        sent.push(payload);
        count.fetch_add(1, Ordering::Relaxed);
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_published_on_the_node_a_session_moves_to_while_it_moves_arrive_in_order() {
    // Each message either reaches a's copy, is replayed, or is routed on b to the
    // session installed there.
    published_while_a_session_moves(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_published_on_the_node_a_session_leaves_while_it_moves_arrive_once() {
    // A message routed to a's copy before a read b's request, and appended to the
    // stream after that request, must not also be replayed on b.
    published_while_a_session_moves(false).await;
}

/// Publishers on the node the session moves to (`to_new`) or from, before, while and
/// after it moves from a to b: every message arrives once, each publisher's in order.
async fn published_while_a_session_moves(to_new: bool) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let redis = RedisServer::start();
    let a = node_with_ttl(&redis, "a", TTL_MS);
    let b = node_with_ttl(&redis, "b", TTL_MS);
    let (mut sub, _) = resume(a.mqtt, "arriving").await;
    sub.subscribe("w/#", opts(QoS::AtLeastOnce)).await;
    sub.disconnect().await;
    let on = if to_new { b.mqtt } else { a.mqtt };
    let (count, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let publishers: Vec<_> = (0..3)
        .map(|p| {
            tokio::spawn(publish_until(
                on,
                format!("p{p}"),
                count.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let until = |n: usize| {
        let count = count.clone();
        async move {
            while count.load(Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until(30).await;
    let (mut sub, present) = resume(b.mqtt, "arriving").await;
    assert!(present);
    let at_resume = count.load(Ordering::Relaxed);
    until(at_resume + 30).await;
    stop.store(true, Ordering::Relaxed);
    let mut sent = Vec::new();
    for p in publishers {
        sent.push(p.await.unwrap());
    }
    let total: usize = sent.iter().map(Vec::len).sum();
    let mut got = Vec::new();
    loop {
        // Past the total, only a second copy of some message could come.
        let within = Duration::from_millis(if got.len() < total { 3000 } else { 300 });
        match sub.next_event(within).await {
            statehub_test_support::Event::Packet(Packet::Publish(p)) => {
                sub.ack(&p).await;
                got.push(String::from_utf8(p.payload.to_vec()).unwrap());
            }
            statehub_test_support::Event::Timeout => break,
            other => panic!("expected a PUBLISH, got {other:?}"),
        }
    }
    for (p, sent) in sent.iter().enumerate() {
        let prefix = format!("p{p}-");
        let arrived: Vec<&String> = got.iter().filter(|m| m.starts_with(&prefix)).collect();
        let missed: Vec<&String> = sent.iter().filter(|m| !got.contains(m)).collect();
        assert!(
            missed.is_empty(),
            "acknowledged, never delivered: {missed:?}"
        );
        let expected: Vec<&String> = sent.iter().collect();
        assert_eq!(
            arrived, expected,
            "publisher p{p}'s messages once each, in order"
        );
    }
}

/// The keys of `redis` (every one: a test's server holds one namespace).
fn redis_keys(redis: &RedisServer) -> Vec<String> {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string(), "--scan"])
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What Redis keeps of persistent sessions: their hashes, message bodies, the client
/// id index, deadlines and connected sets.
fn session_keys(redis: &RedisServer) -> Vec<String> {
    redis_keys(redis)
        .into_iter()
        .filter(|k| {
            [":mqtt:s:", ":mqtt:b:", ":mqtt:conn:"]
                .iter()
                .any(|part| k.contains(part))
                || k.ends_with(":mqtt:owners")
                || k.ends_with(":mqtt:dl")
        })
        .collect()
}

/// Waits (up to `within`) until `done` holds of the session keys; the keys last seen.
async fn await_session_keys(
    redis: &RedisServer,
    within: Duration,
    done: impl Fn(&[String]) -> bool,
) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let keys = session_keys(redis);
        if done(&keys) || tokio::time::Instant::now() >= deadline {
            return keys;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_no_node_holds_are_forgotten_at_their_expiry_with_their_messages() {
    let redis = RedisServer::start();
    let settings = "mqtt_node_ttl_ms = 2000\nmqtt_session_sweep_ms = 300";
    let a = node_with_settings(&redis, "a", settings);
    let b = node_with_settings(&redis, "b", settings);
    // On a, a session whose client stays connected and one that left; on b, one that
    // left. Session Expiry 2 s, each with messages queued.
    let expiring = |c: &str| persistent_connect(c, 2);
    let (mut held, _) = RawClient::connect_with(a.mqtt, expiring("held")).await;
    held.subscribe("e/#", opts(QoS::AtLeastOnce)).await;
    for (node, id) in [(a.mqtt, "left-a"), (b.mqtt, "left-b")] {
        let (mut c, _) = RawClient::connect_with(node, expiring(id)).await;
        c.subscribe("e/#", opts(QoS::AtLeastOnce)).await;
        c.disconnect().await;
    }
    let mut publisher = RawClient::connect(b.mqtt, V5, "publisher").await;
    publish_all(&mut publisher, "e/1", "x", 3).await;
    for _ in 0..3 {
        held.expect_publish().await; // and never acknowledged
    }
    // Every session's messages are in Redis before a dies: three sessions, each
    // node's three bodies.
    let count = |keys: &[String], part: &str| keys.iter().filter(|k| k.contains(part)).count();
    let stored = await_session_keys(&redis, Duration::from_secs(20), |keys| {
        count(keys, ":mqtt:s:") == 3 && count(keys, ":mqtt:b:") == 6
    })
    .await;
    assert_eq!(count(&stored, ":mqtt:b:"), 6, "{stored:?}");
    a.kill();
    drop(held);

    // Found dead after 2 s, expired 2 s later, swept within two periods after that.
    let left = await_session_keys(&redis, Duration::from_secs(30), <[String]>::is_empty).await;
    assert!(left.is_empty(), "left behind in redis: {left:?}");
    drop(b);
}
