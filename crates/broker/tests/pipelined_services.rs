//! A client's QoS 1/2 requests to a built-in service that takes them over at once
//! (`Service::start_publish`, as the state store on Redis does): the connection hands
//! each one over as it is read, while the earlier ones are still unanswered, and
//! acknowledges them in the order they came [MQTT-4.6.0-2, MQTT-4.6.0-3], each once
//! the service answered it. A service the test holds decides when (and in which order)
//! each request is answered.

use std::sync::{Arc, Mutex};

use statehub_broker::codec::{Packet, Publish, QoS, ReasonCode};
use statehub_broker::{BoxFuture, Broker, BrokerConfig, ClientInfo, Service};
use statehub_test_support::*;
use tokio::sync::oneshot;

/// A request the service took: its payload, and what answers it.
type Taken = (Vec<u8>, Option<oneshot::Sender<()>>);

/// A service whose answers end when the test says, in any order. Requests awaited in
/// place ([`Service::on_publish`]) are held the same way, so a connection that waited
/// for each answer before reading the next request would show it here.
#[derive(Debug, Default)]
struct Held {
    /// Each request's payload, in the order the service took them, and what ends it.
    taken: Mutex<Vec<Taken>>,
}

impl Held {
    fn count(&self) -> usize {
        self.taken.lock().unwrap().len()
    }

    fn payloads(&self) -> Vec<Vec<u8>> {
        let taken = self.taken.lock().unwrap();
        taken.iter().map(|(p, _)| p.clone()).collect()
    }

    /// Answers the `n`th request taken (from 1).
    fn answer(&self, n: usize) {
        let done = self.taken.lock().unwrap()[n - 1].1.take();
        let _ = done.expect("answered twice").send(());
    }

    fn take(&self, publish: &Publish) -> BoxFuture<'static, ()> {
        let (tx, rx) = oneshot::channel();
        let mut taken = self.taken.lock().unwrap();
        taken.push((publish.payload.to_vec(), Some(tx)));
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

impl Service for Held {
    fn on_publish<'a>(
        &'a self,
        _broker: &'a Broker,
        _from: &'a ClientInfo,
        publish: &'a Publish,
    ) -> BoxFuture<'a, ()> {
        self.take(publish)
    }

    fn start_publish(
        self: Arc<Self>,
        _broker: &Broker,
        _from: &ClientInfo,
        publish: &Publish,
    ) -> Option<BoxFuture<'static, ()>> {
        Some(self.take(publish))
    }
}

async fn with_service(cfg: BrokerConfig) -> (Broker, Arc<Held>, std::net::SocketAddr) {
    let (broker, addr) = start_broker(cfg).await;
    let held = Arc::new(Held::default());
    broker.register_service("svc/#", held.clone());
    (broker, held, addr)
}

/// Every request reaches the service, in order, while none is answered; the
/// connection serves other packets meanwhile; the acknowledgements follow the
/// requests' order whatever order the answers come in.
#[tokio::test]
async fn requests_are_taken_while_earlier_ones_wait_and_acknowledged_in_order() {
    let (_b, held, addr) = with_service(BrokerConfig::default()).await;
    let mut c = RawClient::connect(addr, V5, "asker").await;
    let qos = [
        QoS::AtLeastOnce,
        QoS::ExactlyOnce,
        QoS::AtLeastOnce,
        QoS::AtLeastOnce,
    ];
    c.publish_numbered("svc/req", &qos).await;
    assert!(
        wait_until(WAIT, || held.count() == 4).await,
        "the service took {} of 4 requests while the first was unanswered",
        held.count()
    );
    assert_eq!(held.payloads(), [[1], [2], [3], [4]], "taken in order");
    // Read and answered meanwhile: the connection is not stuck behind the service.
    c.ping().await;
    c.expect_nothing(QUIET).await;

    held.answer(3);
    held.answer(2);
    c.expect_nothing(QUIET).await; // the first still waits
    held.answer(1);
    for id in 1..=3u16 {
        c.expect_pub_ack(qos[usize::from(id) - 1], id, ReasonCode::SUCCESS)
            .await;
    }
    held.answer(4);
    c.expect_pub_ack(QoS::AtLeastOnce, 4, ReasonCode::SUCCESS)
        .await;
}

/// Receive Maximum bounds the requests one connection has waiting for the service: an
/// MQTT 5 client past it is disconnected with 0x93, and the extra request never
/// reaches the service; an MQTT 3.1.1 one is not read past it until one is answered.
#[tokio::test]
async fn waiting_requests_are_bounded_by_receive_maximum() {
    let cfg = BrokerConfig {
        receive_maximum: 2,
        ..Default::default()
    };
    let (_b, held, addr) = with_service(cfg).await;
    let mut v5 = RawClient::connect(addr, V5, "rm5").await;
    v5.publish_numbered("svc/rm5", &[QoS::AtLeastOnce; 3]).await;
    v5.expect_disconnect(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED)
        .await;
    assert_eq!(held.count(), 2, "the third was not taken");

    let mut v3 = RawClient::connect(addr, V311, "rm3").await;
    v3.publish_numbered("svc/rm3", &[QoS::AtLeastOnce; 3]).await;
    assert!(wait_until(WAIT, || held.count() == 4).await);
    v3.expect_nothing(QUIET).await;
    assert_eq!(held.count(), 4, "not read past two waiting");
    held.answer(3);
    v3.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    assert!(wait_until(WAIT, || held.count() == 5).await, "read on");
    held.answer(4);
    held.answer(5);
    v3.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
    v3.expect_pub_ack(QoS::AtLeastOnce, 3, ReasonCode::SUCCESS)
        .await;
}

/// A client that sends requests and disconnects at once still gets their
/// acknowledgements as the service answers them.
#[tokio::test]
async fn requests_before_a_disconnect_are_still_acknowledged() {
    let (_b, held, addr) = with_service(BrokerConfig::default()).await;
    let mut c = RawClient::connect(addr, V5, "bye").await;
    c.publish_numbered("svc/bye", &[QoS::AtLeastOnce; 2]).await;
    c.send(&Packet::Disconnect(Default::default())).await;
    assert!(wait_until(WAIT, || held.count() == 2).await);
    held.answer(2);
    held.answer(1);
    c.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    c.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
    c.expect_closed().await;
}
