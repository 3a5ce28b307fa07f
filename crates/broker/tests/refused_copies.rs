//! A QoS 1/2 PUBLISH whose forward to the other nodes fails is refused (0x80), and
//! the copies local sessions held back for it (persistent or not, of any QoS) are
//! taken back rather than given: the fabric gives them again should the message
//! reach the other nodes after all (docs/decisions/0005, "A refused copy"). A fabric
//! the test holds decides how each forward ends and whether it takes the copies on.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_broker::{
    BoxFuture, Broker, BrokerConfig, Gate, Message, SessionChange, SessionStore, SessionStoreError,
};
use statehub_test_support::*;

/// Counts the copies recorded and taken back, and the gates left to it.
#[derive(Debug, Default)]
struct Counting {
    withdrawn: Mutex<Vec<u64>>,
    left: std::sync::atomic::AtomicUsize,
}

impl SessionStore for Counting {
    fn record(&self, change: SessionChange<'_>) {
        if let SessionChange::MessageWithdrawn { seq, .. } = change {
            self.withdrawn.lock().unwrap().push(seq);
        }
    }
    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        Box::pin(async { Ok(()) })
    }
    fn begin_group(&self) {}
    fn end_group(&self) {}
    fn open_when_stored(&self, gate: Arc<Gate>) {
        self.left.fetch_add(1, Ordering::SeqCst);
        gate.open();
    }
}

struct Setup {
    broker: Broker,
    fabric: Arc<FakeFabric>,
    store: Arc<Counting>,
    /// Persistent, QoS 2.
    kept: RawClient,
    /// Not persistent, QoS 2.
    clean: RawClient,
    publ: RawClient,
}

async fn setup(takes: bool) -> Setup {
    let broker = Broker::new(BrokerConfig::default());
    let store = Arc::new(Counting::default());
    broker.set_session_store(store.clone(), Vec::new());
    let fabric = FakeFabric::new(ForwardOutcome::Refuse);
    fabric.set_takes(takes);
    assert!(broker.set_fabric(fabric.clone()));
    let addr = listen(&broker).await;
    let (mut kept, _) = RawClient::connect_with(addr, persistent_connect("kept", 300)).await;
    kept.subscribe("r/#", opts(QoS::ExactlyOnce)).await;
    let mut clean = RawClient::connect(addr, V5, "clean").await;
    clean.subscribe("r/#", opts(QoS::ExactlyOnce)).await;
    let publ = RawClient::connect(addr, V5, "publ").await;
    Setup {
        broker,
        fabric,
        store,
        kept,
        clean,
        publ,
    }
}

/// Publishes `payload` at QoS 2; the PUBREC's reason code.
async fn refused(publ: &mut RawClient, payload: &[u8]) -> ReasonCode {
    let mut p = publish("r/1", QoS::ExactlyOnce, payload);
    p.packet_id = Some(1);
    publ.send(&Packet::Publish(p)).await;
    match publ.expect().await {
        Packet::PubRec(rec) => rec.reason_code,
        other => panic!("expected PUBREC, got {other:?}"),
    }
}

/// Publishes a QoS 0 marker: whatever a subscriber got before it came first.
async fn marker(publ: &mut RawClient) {
    publ.send(&Packet::Publish(publish("r/1", QoS::AtMostOnce, b"marker")))
        .await;
}

#[tokio::test]
async fn a_refused_qos2_copy_held_back_is_taken_back_and_its_queue_goes_on() {
    let mut s = setup(true).await;
    assert_eq!(
        refused(&mut s.publ, b"refused").await,
        ReasonCode::UNSPECIFIED_ERROR
    );
    marker(&mut s.publ).await;
    let first = s.kept.expect_publish().await;
    assert_eq!(
        &first.payload[..],
        b"marker",
        "the refused copy is not given"
    );
    assert_eq!(
        s.store.withdrawn.lock().unwrap().len(),
        1,
        "its record goes"
    );
    let asked = s.fabric.asked();
    let both = vec!["clean".to_owned(), "kept".to_owned()];
    assert_eq!(asked, [(b"refused".to_vec(), both)]);
    // A session that is not persistent had its copy held back and taken back too.
    assert_eq!(&s.clean.expect_publish().await.payload[..], b"marker");

    // The message reached the other nodes after all: the fabric gives it once.
    let gate = Arc::new(Gate::default());
    let p = publish("r/1", QoS::ExactlyOnce, b"refused");
    let msg = Message::from_publish(p, Some("publ".into()), std::time::Instant::now());
    let clients: Vec<Arc<str>> = vec!["kept".into(), "clean".into()];
    assert_eq!(s.broker.route_withdrawn(msg, &clients, &gate, |_| {}), 2);
    // The clean session's copy is not stored: only a stored QoS 2 copy waits.
    assert_eq!(&s.clean.expect_publish_ack().await.payload[..], b"refused");
    s.kept.expect_nothing(QUIET).await;
    gate.open();
    assert_eq!(&s.kept.expect_publish().await.payload[..], b"refused");
    s.clean.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn a_refused_qos2_copy_the_fabric_cannot_give_again_is_given() {
    let mut s = setup(false).await;
    assert_eq!(
        refused(&mut s.publ, b"refused").await,
        ReasonCode::UNSPECIFIED_ERROR
    );
    marker(&mut s.publ).await;
    assert_eq!(&s.kept.expect_publish().await.payload[..], b"refused");
    assert!(s.store.withdrawn.lock().unwrap().is_empty());
}

/// Once its copies are taken back no session holds one behind the gate: it opens at
/// once instead of being left to the store, so a store that cannot write keeps
/// nothing for the PUBLISHes refused meanwhile (only for copies sessions queue).
#[tokio::test]
async fn a_gate_whose_copies_were_all_taken_back_is_not_left_to_the_store() {
    let mut s = setup(true).await;
    assert_eq!(refused(&mut s.publ, b"refused").await, ReasonCode(0x80));
    assert_eq!(
        s.store.withdrawn.lock().unwrap().len(),
        1,
        "kept's copy taken back"
    );
    assert_eq!(
        s.store.left.load(Ordering::SeqCst),
        0,
        "nothing behind the gate: not left to the store"
    );
}

/// Publishes `payload` at QoS 1 under packet id `id`; the PUBACK's reason code.
async fn published_qos1(publ: &mut RawClient, payload: &[u8], id: u16) -> ReasonCode {
    let mut p = publish("r/1", QoS::AtLeastOnce, payload);
    p.packet_id = Some(id);
    publ.send(&Packet::Publish(p)).await;
    match publ.expect().await {
        Packet::PubAck(ack) => ack.reason_code,
        other => panic!("expected PUBACK, got {other:?}"),
    }
}

/// In a cluster every local copy of a QoS 1 PUBLISH waits for its forward's outcome:
/// refused, none reaches a subscriber, whether its session is persistent or not and
/// whatever the copy's QoS, and what was queued behind it goes on.
#[tokio::test]
async fn a_refused_qos1_publish_reaches_no_local_subscriber_and_their_queues_go_on() {
    let mut s = setup(true).await;
    let addr = listen(&s.broker).await;
    let mut zero = RawClient::connect(addr, V5, "zero").await;
    zero.subscribe("r/#", opts(QoS::AtMostOnce)).await;
    let code = published_qos1(&mut s.publ, b"refused", 1).await;
    assert_eq!(code, ReasonCode::UNSPECIFIED_ERROR);
    marker(&mut s.publ).await;
    for (name, sub) in [
        ("kept", &mut s.kept),
        ("clean", &mut s.clean),
        ("zero", &mut zero),
    ] {
        let first = sub.expect_publish().await;
        assert_eq!(&first.payload[..], b"marker", "{name} got the refused copy");
    }
    assert_eq!(
        s.store.withdrawn.lock().unwrap().len(),
        1,
        "kept's record goes"
    );
    let all = ["clean", "kept", "zero"].map(str::to_owned).to_vec();
    assert_eq!(s.fabric.asked(), [(b"refused".to_vec(), all)]);

    // Resent and accepted: each gets it once.
    s.fabric.set_outcome(ForwardOutcome::Accept);
    let code = published_qos1(&mut s.publ, b"again", 2).await;
    assert_eq!(code, ReasonCode::SUCCESS);
    for sub in [&mut s.kept, &mut s.clean, &mut zero] {
        assert_eq!(&sub.expect_publish_ack().await.payload[..], b"again");
        sub.expect_nothing(QUIET).await;
    }
}

/// The copies wait while the forward is pending and go once it is accepted.
#[tokio::test]
async fn copies_of_a_qos1_publish_wait_for_its_forward_and_go_once_it_is_accepted() {
    let mut s = setup(true).await;
    s.fabric.set_outcome(ForwardOutcome::Hold);
    let mut p = publish("r/1", QoS::AtLeastOnce, b"held");
    p.packet_id = Some(1);
    s.publ.send(&Packet::Publish(p)).await;
    assert!(wait_until(WAIT, || s.fabric.held() == 1).await);
    s.kept.expect_nothing(QUIET).await;
    s.clean.expect_nothing(QUIET).await;
    s.fabric.end(1, Ok(()));
    s.publ
        .expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    assert_eq!(&s.kept.expect_publish_ack().await.payload[..], b"held");
    assert_eq!(&s.clean.expect_publish_ack().await.payload[..], b"held");
    assert!(s.store.withdrawn.lock().unwrap().is_empty());
}

/// A publisher whose connection is lost while its forward is pending leaves the
/// outcome unknown to this node: its copies are taken back as a refused one's, so the
/// fabric gives them once if the message reaches the other nodes and none reach a
/// subscriber here before that.
#[tokio::test]
async fn copies_of_a_publish_whose_connection_is_lost_before_its_outcome_are_taken_back() {
    let mut s = setup(true).await;
    s.fabric.set_outcome(ForwardOutcome::Hold);
    let mut p = publish("r/1", QoS::AtLeastOnce, b"orphan");
    p.packet_id = Some(1);
    s.publ.send(&Packet::Publish(p)).await;
    assert!(wait_until(WAIT, || s.fabric.held() == 1).await);
    drop(s.publ);
    let both = vec!["clean".to_owned(), "kept".to_owned()];
    assert!(
        wait_until(WAIT, || s.fabric.asked()
            == [(b"orphan".to_vec(), both.clone())])
        .await
    );
    s.kept.expect_nothing(QUIET).await;
    s.clean.expect_nothing(QUIET).await;
    assert_eq!(
        s.store.withdrawn.lock().unwrap().len(),
        1,
        "kept's record goes"
    );
}
