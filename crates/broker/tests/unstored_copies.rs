//! A QoS 2 copy for a persistent session reaches its subscriber only once the
//! session store has its record: when the publisher's barrier fails, its gate is
//! left to the store (`SessionStore::open_when_stored`) instead of opening with the
//! failure. A copy given unstored carries a packet id that a node its session moves
//! to knows nothing of (docs/decisions/0005, "No QoS 2 copy goes out unstored").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use statehub_broker::codec::{Packet, QoS};
use statehub_broker::{
    BoxFuture, Broker, BrokerConfig, Gate, SessionChange, SessionStore, SessionStoreError,
};
use statehub_test_support::*;

/// Its barriers fail once `failing` is set; it keeps the gates it is asked to open
/// once stored, for the test to open.
#[derive(Debug, Default)]
struct Failing {
    failing: AtomicBool,
    gates: Mutex<Vec<Arc<Gate>>>,
}

impl SessionStore for Failing {
    fn record(&self, _change: SessionChange<'_>) {}
    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        let failing = self.failing.load(Ordering::SeqCst);
        Box::pin(async move {
            match failing {
                false => Ok(()),
                true => Err(SessionStoreError(Arc::new(std::io::Error::other("down")))),
            }
        })
    }
    fn begin_group(&self) {}
    fn end_group(&self) {}
    fn open_when_stored(&self, gate: Arc<Gate>) {
        self.gates.lock().unwrap().push(gate);
    }
}

#[tokio::test]
async fn a_qos2_copy_whose_publishers_barrier_failed_waits_until_it_is_stored() {
    let broker = Broker::new(BrokerConfig::default());
    let store = Arc::new(Failing::default());
    broker.set_session_store(store.clone(), Vec::new());
    let addr = listen(&broker).await;
    let (mut kept, _) = RawClient::connect_with(addr, persistent_connect("kept", 300)).await;
    kept.subscribe("r/#", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "publ").await;

    store.failing.store(true, Ordering::SeqCst);
    let mut p = publish("r/1", QoS::ExactlyOnce, b"unstored");
    p.packet_id = Some(1);
    publ.send(&Packet::Publish(p)).await;
    // Its acknowledgement is withheld and its connection closed.
    loop {
        match publ.next_event(Duration::from_secs(30)).await {
            Event::Packet(Packet::Disconnect(_)) | Event::Closed => break,
            Event::Packet(Packet::PubRec(rec)) => panic!("acknowledged: {rec:?}"),
            Event::Timeout => panic!("never closed"),
            _ => {}
        }
    }
    kept.expect_nothing(QUIET).await;
    let gates = std::mem::take(&mut *store.gates.lock().unwrap());
    assert_eq!(gates.len(), 1, "the gate is left to the store");
    gates[0].open();
    assert_eq!(&kept.expect_publish().await.payload[..], b"unstored");
}
