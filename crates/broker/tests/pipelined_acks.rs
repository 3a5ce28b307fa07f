//! A publisher's QoS 1/2 PUBLISHes in a cluster: each is routed at once while the
//! earlier ones' forwards to the other nodes are still pending, and the
//! acknowledgements go out in the order the PUBLISHes came, each once its own forward
//! is done [MQTT-4.6.0-2, MQTT-4.6.0-3]. A fabric the test holds decides when (and
//! how) each forward ends; a session store the test holds, when its writes do.

use std::sync::{Arc, Mutex};

use statehub_broker::codec::{Packet, PubResponse, QoS, ReasonCode, Subscribe, Unsubscribe};
use statehub_broker::{
    BoxFuture, Broker, BrokerConfig, FabricError, SessionChange, SessionStore, SessionStoreError,
};
use statehub_test_support::*;
use tokio::sync::oneshot;

async fn cluster(cfg: BrokerConfig) -> (Broker, Arc<FakeFabric>, std::net::SocketAddr) {
    let broker = Broker::new(cfg);
    let held = FakeFabric::new(ForwardOutcome::Hold);
    assert!(broker.set_fabric(held.clone()));
    let addr = listen(&broker).await;
    (broker, held, addr)
}

/// Every PUBLISH is routed to the local subscriber while no forward has ended, and
/// the acknowledgements follow the PUBLISHes' order, whatever order the forwards end in.
#[tokio::test]
async fn publishes_are_routed_while_forwards_wait_and_acknowledged_in_order() {
    let (_b, held, addr) = cluster(BrokerConfig::default()).await;
    let mut sub = RawClient::connect(addr, V5, "sub").await;
    sub.subscribe("pipe/t", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "pub").await;
    let qos = [
        QoS::AtLeastOnce,
        QoS::ExactlyOnce,
        QoS::AtLeastOnce,
        QoS::ExactlyOnce,
        QoS::AtLeastOnce,
    ];
    publ.publish_numbered("pipe/t", &qos).await;

    for id in 1..=5u8 {
        let p = sub.expect_publish().await;
        assert_eq!(p.payload[..], [id], "delivered in the publisher's order");
    }
    assert!(
        wait_until(WAIT, || held.held() == 5).await,
        "all five forwarded"
    );
    publ.expect_nothing(QUIET).await;

    held.end(3, Ok(()));
    held.end(2, Ok(()));
    publ.expect_nothing(QUIET).await; // the first still waits
    held.end(1, Ok(()));
    for id in 1..=3u16 {
        publ.expect_pub_ack(qos[usize::from(id) - 1], id, ReasonCode::SUCCESS)
            .await;
    }
    held.end(5, Ok(()));
    publ.expect_nothing(QUIET).await;
    held.end(4, Ok(()));
    publ.expect_pub_ack(QoS::ExactlyOnce, 4, ReasonCode::SUCCESS)
        .await;
    publ.expect_pub_ack(QoS::AtLeastOnce, 5, ReasonCode::SUCCESS)
        .await;
}

/// A failed forward is refused (MQTT 5: 0x80) in its place; the ones behind it are
/// answered after it, each as its own forward ended.
#[tokio::test]
async fn a_failed_forward_is_refused_in_its_place() {
    let (_b, held, addr) = cluster(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V5, "pub5").await;
    let qos = [QoS::AtLeastOnce, QoS::ExactlyOnce, QoS::AtLeastOnce];
    publ.publish_numbered("pipe/f", &qos).await;
    assert!(wait_until(WAIT, || held.held() == 3).await);
    held.end(3, Ok(()));
    held.end(2, Err(FabricError::Unavailable("down".into())));
    publ.expect_nothing(QUIET).await;
    held.end(1, Ok(()));
    publ.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    publ.expect_pub_ack(QoS::ExactlyOnce, 2, ReasonCode::UNSPECIFIED_ERROR)
        .await;
    publ.expect_pub_ack(QoS::AtLeastOnce, 3, ReasonCode::SUCCESS)
        .await;
    // The refused QoS 2 message was not received: its id may be used again.
    let mut again = publish("pipe/f", QoS::ExactlyOnce, b"again");
    again.packet_id = Some(2);
    publ.send(&Packet::Publish(again)).await;
    assert!(
        wait_until(WAIT, || held.held() == 4).await,
        "routed again, not a duplicate"
    );
    held.end(4, Ok(()));
    publ.expect_pub_ack(QoS::ExactlyOnce, 2, ReasonCode::SUCCESS)
        .await;
}

/// MQTT 3.1.1 cannot be told of a refusal: its connection closes at the failed one,
/// and nothing behind it is acknowledged, though its forward succeeded.
#[tokio::test]
async fn a_failed_forward_closes_an_mqtt311_connection_before_later_acks() {
    let (_b, held, addr) = cluster(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V311, "pub3").await;
    publ.publish_numbered("pipe/c", &[QoS::AtLeastOnce; 3])
        .await;
    assert!(wait_until(WAIT, || held.held() == 3).await);
    held.end(1, Ok(()));
    held.end(3, Ok(()));
    publ.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    publ.expect_nothing(QUIET).await;
    held.end(2, Err(FabricError::Unavailable("down".into())));
    publ.expect_closed().await;
}

/// Receive Maximum bounds what one connection has pending: an MQTT 5 client past it
/// is disconnected with 0x93, an MQTT 3.1.1 one is not read past it.
#[tokio::test]
async fn pending_acknowledgements_are_bounded_by_receive_maximum() {
    let cfg = BrokerConfig {
        receive_maximum: 2,
        ..Default::default()
    };
    let (_b, held, addr) = cluster(cfg).await;
    let mut v5 = RawClient::connect(addr, V5, "rm5").await;
    v5.publish_numbered("pipe/rm5", &[QoS::AtLeastOnce; 3])
        .await;
    v5.expect_disconnect(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED)
        .await;
    assert_eq!(held.held(), 2, "the third was not routed");

    let mut sub = RawClient::connect(addr, V5, "rmsub").await;
    sub.subscribe("pipe/rm3", opts(QoS::AtMostOnce)).await;
    let mut v3 = RawClient::connect(addr, V311, "rm3").await;
    v3.publish_numbered("pipe/rm3", &[QoS::AtLeastOnce; 4])
        .await;
    for id in 1..=2u8 {
        assert_eq!(sub.expect_publish().await.payload[..], [id]);
    }
    sub.expect_nothing(QUIET).await;
    assert_eq!(held.held(), 4, "two routed, not the rest");
    held.end(1, Ok(()));
    held.end(2, Ok(()));
    // Each acknowledgement lets one more in.
    for id in 1..=2u8 {
        held.end(usize::from(id) + 2, Ok(()));
        v3.expect_pub_ack(QoS::AtLeastOnce, id.into(), ReasonCode::SUCCESS)
            .await;
        assert_eq!(sub.expect_publish().await.payload[..], [id + 2]);
        sub.expect_nothing(QUIET).await;
    }
    held.end(5, Ok(()));
    held.end(6, Ok(()));
    for id in 3..=4u16 {
        v3.expect_pub_ack(QoS::AtLeastOnce, id, ReasonCode::SUCCESS)
            .await;
    }
}

/// A client that publishes and disconnects at once still gets the acknowledgements
/// of what it published before its DISCONNECT, as the writes end.
#[tokio::test]
async fn publishes_before_a_disconnect_are_still_acknowledged() {
    let (_b, held, addr) = cluster(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V5, "bye").await;
    publ.publish_numbered("pipe/bye", &[QoS::AtLeastOnce; 2])
        .await;
    publ.send(&Packet::Disconnect(Default::default())).await;
    assert!(wait_until(WAIT, || held.held() == 2).await);
    held.end(2, Ok(()));
    held.end(1, Ok(()));
    publ.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    publ.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
    publ.expect_closed().await;
}

/// A packet the server closes the connection for (here a second CONNECT) comes after
/// PUBLISHes still waiting: those are acknowledged first, then the DISCONNECT.
#[tokio::test]
async fn publishes_before_a_closing_packet_are_acknowledged_first() {
    let (_b, held, addr) = cluster(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V5, "bad").await;
    publ.publish_numbered("pipe/bad", &[QoS::AtLeastOnce; 2])
        .await;
    publ.send(&Packet::Connect(Box::new(connect_packet(V5, "bad"))))
        .await;
    assert!(wait_until(WAIT, || held.held() == 2).await);
    held.end(1, Ok(()));
    held.end(2, Ok(()));
    publ.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    publ.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
    publ.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

/// A session store whose barriers end at once, or, while held, when the test says.
#[derive(Debug, Default)]
struct Barriers {
    hold: std::sync::atomic::AtomicBool,
    held: Mutex<Vec<oneshot::Sender<()>>>,
}

impl Barriers {
    fn end_held(&self) -> usize {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        let n = held.len();
        held.into_iter().for_each(|tx| {
            let _ = tx.send(());
        });
        n
    }
}

/// A broker on a [`Barriers`] session store, listening.
async fn with_barriers(cfg: BrokerConfig) -> (Arc<Barriers>, std::net::SocketAddr) {
    let broker = Broker::new(cfg);
    let store = Arc::new(Barriers::default());
    broker.set_session_store(store.clone(), Vec::new());
    (store, listen(&broker).await)
}

impl SessionStore for Barriers {
    fn record(&self, _change: SessionChange<'_>) {}
    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        if !self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(async { Ok(()) });
        }
        let (tx, rx) = oneshot::channel();
        self.held.lock().unwrap().push(tx);
        Box::pin(async move { rx.await.map_err(|e| SessionStoreError(Arc::new(e))) })
    }
    fn begin_group(&self) {}
    fn end_group(&self) {}
}

/// A persistent session's PUBCOMP waits until the receipt's release is stored; the
/// connection reads and routes the next PUBLISH meanwhile, whose PUBACK follows it.
#[tokio::test]
async fn a_pubcomp_waiting_for_the_store_holds_back_no_publish() {
    let (store, addr) = with_barriers(BrokerConfig::default()).await;
    let mut sub = RawClient::connect(addr, V5, "q2sub").await;
    sub.subscribe("q2/t", opts(QoS::AtLeastOnce)).await;
    let (mut publ, _) = RawClient::connect_with(addr, persistent_connect("q2pub", 300)).await;
    publ.publish_numbered("q2/t", &[QoS::ExactlyOnce]).await;
    publ.expect_pub_ack(QoS::ExactlyOnce, 1, ReasonCode::SUCCESS)
        .await;
    assert_eq!(sub.expect_publish_ack().await.payload[..], [1]);

    store.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    publ.send(&Packet::PubRel(PubResponse::ok(1))).await;
    let mut p = publish("q2/t", QoS::AtLeastOnce, &[2]);
    p.packet_id = Some(2);
    publ.send(&Packet::Publish(p)).await;
    assert_eq!(
        sub.expect_publish().await.payload[..],
        [2],
        "routed meanwhile"
    );
    publ.expect_nothing(QUIET).await;
    assert_eq!(store.end_held(), 1);
    assert!(matches!(publ.expect().await, Packet::PubComp(c) if c.packet_id == 1));
    publ.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
}

/// A persistent subscriber's PUBREL waits until the session store holds that the
/// message was released; the connection serves the subscriber's next packets
/// meanwhile (here a PINGREQ and a second PUBREC), and the PUBRELs follow in the
/// order of the PUBRECs [MQTT-4.6.0-4].
#[tokio::test]
async fn a_pubrel_waiting_for_the_store_holds_back_no_packet() {
    let (store, addr) = with_barriers(BrokerConfig::default()).await;
    let (mut sub, _) = RawClient::connect_with(addr, persistent_connect("relsub", 300)).await;
    sub.subscribe("rel/t", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "relpub").await;
    for id in 1..=2u8 {
        assert_eq!(
            publ.publish_simple("rel/t", QoS::ExactlyOnce, &[id]).await,
            ReasonCode::SUCCESS
        );
    }
    let first = sub.expect_publish().await;
    let second = sub.expect_publish().await;
    assert_eq!(
        (&first.payload[..], &second.payload[..]),
        (&[1u8][..], &[2u8][..])
    );

    store.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    for p in [&first, &second] {
        let id = p.packet_id.unwrap();
        sub.send(&Packet::PubRec(PubResponse::ok(id))).await;
    }
    sub.ping().await; // answered while the releases wait for the store
    sub.expect_nothing(QUIET).await;
    for p in [&first, &second] {
        let id = p.packet_id.unwrap();
        // The first one's write is waited for, then the second's.
        assert!(wait_until(WAIT, || store.end_held() > 0).await);
        match sub.expect().await {
            Packet::PubRel(r) => assert_eq!(r.packet_id, id, "PUBRELs in PUBREC order"),
            other => panic!("expected PUBREL {id}, got {other:?}"),
        }
        sub.send(&Packet::PubComp(PubResponse::ok(id))).await;
    }
}

/// PUBRELs waiting for the store are not counted by Receive Maximum (the client did
/// not exceed it), but everything a connection has queued is bounded: at twice
/// Receive Maximum it is not read until the oldest goes.
#[tokio::test]
async fn waiting_pubrels_are_bounded_apart_from_receive_maximum() {
    let cfg = BrokerConfig {
        receive_maximum: 2,
        ..Default::default()
    };
    let (store, addr) = with_barriers(cfg).await;
    let (mut sub, _) = RawClient::connect_with(addr, persistent_connect("bndsub", 300)).await;
    sub.subscribe("bnd/t", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "bndpub").await;
    for id in 1..=3u8 {
        publ.publish_simple("bnd/t", QoS::ExactlyOnce, &[id]).await;
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(sub.expect_publish().await.packet_id.unwrap());
    }
    store.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    for id in &ids {
        sub.send(&Packet::PubRec(PubResponse::ok(*id))).await;
    }
    // Three PUBRELs wait: the first PUBLISH is taken (four queued), the second is
    // not read yet; no DISCONNECT 0x93.
    let mut watch = RawClient::connect(addr, V5, "bndwatch").await;
    watch.subscribe("bnd/other", opts(QoS::AtMostOnce)).await;
    sub.publish_numbered("bnd/other", &[QoS::AtLeastOnce; 2])
        .await;
    assert_eq!(watch.expect_publish().await.payload[..], [1]);
    watch.expect_nothing(QUIET).await;
    sub.expect_nothing(QUIET).await;
    for id in &ids {
        assert!(wait_until(WAIT, || store.end_held() > 0).await);
        assert!(matches!(sub.expect().await, Packet::PubRel(r) if r.packet_id == *id));
    }
    assert_eq!(watch.expect_publish().await.payload[..], [2], "read on");
    sub.expect_pub_ack(QoS::AtLeastOnce, 1, ReasonCode::SUCCESS)
        .await;
    sub.expect_pub_ack(QoS::AtLeastOnce, 2, ReasonCode::SUCCESS)
        .await;
}

/// A persistent session's SUBACK and UNSUBACK wait until the session store has the
/// change; the connection serves the client's next packets meanwhile (a PINGREQ), the
/// SUBACK comes before its subscription's retained message, and the UNSUBACK after
/// the SUBACK, in the order of the packets.
#[tokio::test]
async fn a_suback_waiting_for_the_store_holds_back_no_packet() {
    let (store, addr) = with_barriers(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V5, "subret").await;
    let mut kept = publish("sub/kept", QoS::AtMostOnce, b"kept");
    kept.retain = true;
    publ.send(&Packet::Publish(kept)).await;
    publ.ping().await;
    let (mut c, _) = RawClient::connect_with(addr, persistent_connect("subber", 300)).await;

    store.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    c.send(&Packet::Subscribe(Subscribe {
        packet_id: 1,
        filters: vec![(bs("sub/kept"), opts(QoS::AtLeastOnce))],
        ..Default::default()
    }))
    .await;
    c.send(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 2,
        filters: vec![bs("sub/kept")],
        ..Default::default()
    }))
    .await;
    c.ping().await; // answered while both wait for the store
    c.expect_nothing(QUIET).await;
    assert!(wait_until(WAIT, || store.end_held() > 0).await);
    assert!(matches!(c.expect().await, Packet::SubAck(a) if a.packet_id == 1));
    let retained = c.expect_publish().await;
    assert_eq!(&retained.payload[..], b"kept");
    assert!(wait_until(WAIT, || store.end_held() > 0).await);
    assert!(matches!(c.expect().await, Packet::UnsubAck(a) if a.packet_id == 2));
}
