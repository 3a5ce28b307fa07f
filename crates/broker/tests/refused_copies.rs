//! A QoS 2 PUBLISH whose forward to the other nodes fails is refused (0x80), and the
//! copies persistent sessions held back for it are taken back rather than given:
//! the fabric gives them again should the message reach the other nodes after all
//! (docs/decisions/0005, "A refused QoS 2 copy"). A fabric the test holds decides
//! how each forward ends and whether it takes the copies on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use statehub_broker::codec::{Packet, QoS, ReasonCode};
use statehub_broker::{
    BoxFuture, Broker, BrokerConfig, Fabric, FabricError, Gate, Message, SessionChange,
    SessionStore, SessionStoreError, SharedPicks,
};
use statehub_test_support::*;

/// Fails every forward; takes withdrawn copies on if `takes` is set.
#[derive(Debug, Default)]
struct Refusing {
    takes: AtomicBool,
    /// What each `withdraw` was asked: the message's payload and the client ids.
    asked: Mutex<Vec<(Vec<u8>, Vec<String>)>>,
}

impl Fabric for Refusing {
    fn is_available(&self) -> bool {
        true
    }
    fn shared_picks(&self, _topic: &str) -> SharedPicks {
        SharedPicks::default()
    }
    fn forward(&self, _: &Message, _: SharedPicks) -> BoxFuture<'static, Result<(), FabricError>> {
        Box::pin(async { Err(FabricError::Unavailable("timed out".into())) })
    }
    fn connected(&self, _: &str, _: bool) -> BoxFuture<'static, Result<(), FabricError>> {
        Box::pin(async { Ok(()) })
    }
    fn announcing(&self, _client_id: &str) -> bool {
        false
    }
    fn shared_group_changed(&self, _filter: &str, _group: &str, _present: bool) {}
    fn withdraw(&self, msg: &Message, clients: &[Arc<str>]) -> bool {
        let clients = clients.iter().map(|c| c.to_string()).collect();
        let asked = (msg.payload.to_vec(), clients);
        self.asked.lock().unwrap().push(asked);
        self.takes.load(Ordering::SeqCst)
    }
}

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
    fabric: Arc<Refusing>,
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
    let fabric = Arc::new(Refusing::default());
    fabric.takes.store(takes, Ordering::SeqCst);
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
    let asked = s.fabric.asked.lock().unwrap().clone();
    assert_eq!(asked, [(b"refused".to_vec(), vec!["kept".to_owned()])]);
    // A session that is not persistent had its copy at once (nothing held it).
    assert_eq!(&s.clean.expect_publish_ack().await.payload[..], b"refused");
    assert_eq!(&s.clean.expect_publish().await.payload[..], b"marker");

    // The message reached the other nodes after all: the fabric gives it once.
    let gate = Arc::new(Gate::default());
    let p = publish("r/1", QoS::ExactlyOnce, b"refused");
    let msg = Message::from_publish(p, Some("publ".into()), std::time::Instant::now());
    let clients: Vec<Arc<str>> = vec!["kept".into()];
    assert_eq!(s.broker.route_withdrawn(msg, &clients, &gate, |_| {}), 1);
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
