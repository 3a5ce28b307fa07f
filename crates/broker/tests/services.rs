//! The built-in service API: a test service on `svc/#` answering with
//! `Broker::deliver_to`, `on_connection_closed`, and `disconnect_client`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use statehub_broker::codec::{Packet, Publish, PublishProperties, QoS, ReasonCode};
use statehub_broker::{BoxFuture, Broker, ClientInfo, DeliverError, Service};
use statehub_test_support::*;

#[derive(Debug, Default)]
struct Echo {
    requests: Mutex<Vec<(String, Publish)>>,
    closed: Mutex<Vec<String>>,
    delay: Option<Duration>,
}

impl Service for Echo {
    fn on_publish<'a>(
        &'a self,
        broker: &'a Broker,
        from: &'a ClientInfo,
        publish: &'a Publish,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(d) = self.delay {
                tokio::time::sleep(d).await;
            }
            self.requests
                .lock()
                .push((from.client_id.to_string(), publish.clone()));
            let reply = Publish {
                topic: bs(&format!("answers/{}", from.client_id)),
                qos: QoS::AtLeastOnce,
                payload: publish.payload.clone(),
                properties: PublishProperties {
                    correlation_data: publish.properties.correlation_data.clone(),
                    ..Default::default()
                },
                ..Default::default()
            };
            broker
                .deliver_to(&from.client_id, reply)
                .expect("deliver_to");
        })
    }

    fn on_connection_closed(&self, _broker: &Broker, client_id: &str) {
        self.closed.lock().push(client_id.to_owned());
    }
}

async fn with_service(svc: Echo) -> (Broker, std::net::SocketAddr, Arc<Echo>) {
    let (broker, addr) = start_default().await;
    let svc = Arc::new(svc);
    broker.register_service("svc/#", svc.clone());
    (broker, addr, svc)
}

#[tokio::test]
async fn service_answer_reaches_the_sender_exactly_once() {
    let (_b, addr, svc) = with_service(Echo::default()).await;
    let mut snoop = RawClient::connect(addr, V5, "snoop").await;
    snoop.subscribe("#", opts(QoS::AtLeastOnce)).await;
    let mut c = RawClient::connect(addr, V5, "asker").await;
    let mut req = publish("svc/echo", QoS::AtLeastOnce, b"ping");
    req.properties.correlation_data = Some(Bytes::from_static(b"c1"));
    req.properties.user_properties = vec![(bs("x"), bs("y"))];
    assert_eq!(
        c.publish(req).await,
        ReasonCode::SUCCESS,
        "a service-owned topic is acknowledged with success"
    );
    let got = c.expect_publish_ack().await;
    assert_eq!(&*got.topic, "answers/asker");
    assert_eq!(&got.payload[..], b"ping");
    assert_eq!(got.properties.correlation_data.as_deref(), Some(&b"c1"[..]));
    assert_eq!(got.qos, QoS::AtLeastOnce);
    c.expect_nothing(QUIET).await;
    let reqs = svc.requests.lock().clone();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].0, "asker");
    assert_eq!(
        reqs[0].1.properties.user_properties,
        vec![(bs("x"), bs("y"))],
        "properties reach the service"
    );
    // Requests go to the service, not to subscribers; the answer only to the sender.
    snoop.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn service_answers_each_of_many_requests_once() {
    let (_b, addr, _svc) = with_service(Echo::default()).await;
    let mut c = RawClient::connect(addr, V5, "many").await;
    for i in 0..20u8 {
        c.publish_simple("svc/x", QoS::AtMostOnce, &[i]).await;
    }
    for i in 0..20u8 {
        assert_eq!(c.expect_publish_ack().await.payload[..], [i]);
    }
    c.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn service_works_for_v311_clients_and_qos2() {
    let (_b, addr, _svc) = with_service(Echo::default()).await;
    let mut c = RawClient::connect(addr, V311, "v3asker").await;
    assert_eq!(
        c.publish_simple("svc/q2", QoS::ExactlyOnce, b"two").await,
        ReasonCode::SUCCESS
    );
    let got = c.expect_publish_ack().await;
    assert_eq!(&*got.topic, "answers/v3asker");
}

#[tokio::test]
async fn publish_is_acknowledged_after_the_service_finished() {
    let (_b, addr, svc) = with_service(Echo {
        delay: Some(Duration::from_millis(300)),
        ..Default::default()
    })
    .await;
    let mut c = RawClient::connect(addr, V5, "slowsvc").await;
    let start = Instant::now();
    c.publish_simple("svc/slow", QoS::AtLeastOnce, b"x").await;
    assert!(
        start.elapsed() >= Duration::from_millis(250),
        "PUBACK came before on_publish finished"
    );
    assert_eq!(svc.requests.lock().len(), 1);
    c.expect_publish_ack().await;
}

#[tokio::test]
async fn on_connection_closed_is_called_for_every_way_of_leaving() {
    let (_b, addr, svc) = with_service(Echo::default()).await;
    let c = RawClient::connect(addr, V5, "leaves-normally").await;
    c.disconnect().await;
    let c = RawClient::connect(addr, V311, "drops").await;
    drop(c);
    let mut old = RawClient::connect(addr, V5, "taken-over").await;
    let _new = RawClient::connect(addr, V5, "taken-over").await;
    old.expect_disconnect(ReasonCode::SESSION_TAKEN_OVER).await;
    let ok = wait_until(Duration::from_secs(3), || svc.closed.lock().len() >= 3).await;
    let mut closed = svc.closed.lock().clone();
    closed.sort();
    assert!(ok, "on_connection_closed calls: {closed:?}");
    assert_eq!(closed, vec!["drops", "leaves-normally", "taken-over"]);
}

#[tokio::test]
async fn disconnect_client_closes_with_the_given_reason() {
    let (broker, addr, svc) = with_service(Echo::default()).await;
    let mut c = RawClient::connect(addr, V5, "kicked").await;
    assert!(broker.disconnect_client("kicked", ReasonCode::ADMINISTRATIVE_ACTION));
    c.expect_disconnect(ReasonCode::ADMINISTRATIVE_ACTION).await;
    assert!(
        wait_until(Duration::from_secs(2), || svc
            .closed
            .lock()
            .contains(&"kicked".to_owned()))
        .await
    );
    assert!(!broker.disconnect_client("nobody", ReasonCode::ADMINISTRATIVE_ACTION));
    // v3.1.1 clients are just closed.
    let mut c = RawClient::connect(addr, V311, "kicked3").await;
    assert!(broker.disconnect_client("kicked3", ReasonCode::NOT_AUTHORIZED));
    c.expect_closed().await;
}

#[tokio::test]
async fn deliver_to_an_unknown_client_fails() {
    let (broker, _addr, _svc) = with_service(Echo::default()).await;
    let err = broker
        .deliver_to("ghost", publish("x", QoS::AtLeastOnce, b""))
        .unwrap_err();
    assert_eq!(err, DeliverError::NoSession("ghost".into()));
}

#[tokio::test]
async fn deliver_to_an_offline_persistent_session_is_queued() {
    let (broker, addr, _svc) = with_service(Echo::default()).await;
    let mut connect = connect_packet(V5, "away");
    connect.properties.session_expiry_interval = Some(60);
    let (c, _) = RawClient::connect_with(addr, connect.clone()).await;
    c.disconnect().await;
    broker
        .deliver_to("away", publish("note/for/you", QoS::AtLeastOnce, b"later"))
        .unwrap();
    connect.clean_start = false;
    let (mut c, _) = RawClient::connect_with(addr, connect).await;
    let got = c.expect_publish_ack().await;
    assert_eq!(
        (&*got.topic, &got.payload[..]),
        ("note/for/you", &b"later"[..])
    );
    let _ = Packet::PingReq;
}

/// A service that says it answers in place: its PUBLISHes are handled on the
/// connection's stack (`Service::answers_in_place`). `pending` breaks that promise.
#[derive(Debug, Default)]
struct InPlace {
    calls: Mutex<usize>,
    pending: bool,
}

impl Service for InPlace {
    fn on_publish<'a>(
        &'a self,
        broker: &'a Broker,
        from: &'a ClientInfo,
        publish: &'a Publish,
    ) -> BoxFuture<'a, ()> {
        *self.calls.lock() += 1;
        if self.pending {
            return Box::pin(std::future::pending());
        }
        let reply = Publish {
            topic: bs(&format!("answers/{}", from.client_id)),
            qos: QoS::AtLeastOnce,
            payload: publish.payload.clone(),
            ..Default::default()
        };
        broker
            .deliver_to(&from.client_id, reply)
            .expect("deliver_to");
        statehub_broker::done()
    }

    fn answers_in_place(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn a_service_answering_in_place_answers_every_request_once_in_order() {
    let (broker, addr) = start_default().await;
    let svc = Arc::new(InPlace::default());
    broker.register_service("svc/#", svc.clone());
    let mut c = RawClient::connect(addr, V5, "inplace").await;
    // Pipelined, so that one read holds several requests.
    for i in 0..20u8 {
        let mut p = publish("svc/x", QoS::AtLeastOnce, &[i]);
        p.packet_id = Some(u16::from(i) + 1);
        c.send(&Packet::Publish(p)).await;
    }
    let (mut acks, mut answers) = (Vec::new(), Vec::new());
    while acks.len() < 20 || answers.len() < 20 {
        match c.expect().await {
            Packet::PubAck(a) => {
                assert_eq!(a.reason_code, ReasonCode::SUCCESS);
                acks.push(a.packet_id);
            }
            Packet::Publish(p) => {
                c.ack(&p).await;
                answers.push(p.payload[0]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(acks, (1..=20).collect::<Vec<u16>>());
    assert_eq!(answers, (0..20).collect::<Vec<u8>>());
    assert_eq!(*svc.calls.lock(), 20, "one call per request");
    c.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn a_service_that_waits_after_promising_to_answer_in_place_closes_the_publisher() {
    let (broker, addr) = start_default().await;
    let svc = Arc::new(InPlace {
        pending: true,
        ..Default::default()
    });
    broker.register_service("svc/#", svc.clone());
    let mut c = RawClient::connect(addr, V5, "broken-promise").await;
    c.send(&Packet::Publish(publish("svc/x", QoS::AtMostOnce, b"x")))
        .await;
    c.expect_disconnect(ReasonCode::IMPLEMENTATION_SPECIFIC_ERROR)
        .await;
    assert_eq!(*svc.calls.lock(), 1);
}
