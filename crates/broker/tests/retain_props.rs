//! Retained messages (store, replace, clear, Retain Handling), PUBLISH properties
//! passed through untouched, Message Expiry, and the Payload Format Indicator.

use std::time::Duration;

use bytes::Bytes;
use statehub_broker::codec::{
    ConnectProperties, Packet, PublishProperties, QoS, ReasonCode, SubscriptionOptions,
};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

fn retained(topic: &str, payload: &[u8]) -> statehub_broker::codec::Publish {
    let mut p = publish(topic, QoS::AtLeastOnce, payload);
    p.retain = true;
    p
}

async fn collect(c: &mut RawClient) -> Vec<(String, Vec<u8>, bool)> {
    let mut out = Vec::new();
    loop {
        match c.next_event(QUIET).await {
            Event::Packet(Packet::Publish(p)) => {
                c.ack(&p).await;
                out.push((p.topic.to_string(), p.payload.to_vec(), p.retain));
            }
            Event::Timeout => {
                out.sort();
                return out;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn retained_store_replace_and_clear() {
    let (_b, addr) = start_default().await;
    let mut publ = RawClient::connect(addr, V5, "rpub").await;
    publ.publish(retained("r/a", b"1")).await;
    publ.publish(retained("r/a", b"2")).await;
    publ.publish(retained("r/b", b"b")).await;
    publ.publish_simple("r/c", QoS::AtLeastOnce, b"not retained")
        .await;

    let mut s = RawClient::connect(addr, V5, "rs1").await;
    s.subscribe("r/#", opts(QoS::AtLeastOnce)).await;
    assert_eq!(
        collect(&mut s).await,
        vec![
            ("r/a".into(), b"2".to_vec(), true),
            ("r/b".into(), b"b".to_vec(), true)
        ],
        "latest retained per topic, RETAIN set"
    );

    // An empty retained payload clears; it is still delivered to current subscribers.
    publ.publish(retained("r/a", b"")).await;
    let got = s.expect_publish_ack().await;
    assert_eq!(
        (&*got.topic, got.payload.len(), got.retain),
        ("r/a", 0, false)
    );

    let mut s2 = RawClient::connect(addr, V5, "rs2").await;
    s2.subscribe("r/#", opts(QoS::AtLeastOnce)).await;
    assert_eq!(
        collect(&mut s2).await,
        vec![("r/b".into(), b"b".to_vec(), true)]
    );
}

#[tokio::test]
async fn retained_qos_is_downgraded_and_properties_kept() {
    let (_b, addr) = start_default().await;
    let mut publ = RawClient::connect(addr, V5, "rqpub").await;
    let mut p = retained("rq", b"x");
    p.qos = QoS::ExactlyOnce;
    p.properties = full_properties();
    publ.publish(p).await;
    let mut s = RawClient::connect(addr, V5, "rqs").await;
    s.subscribe("rq", opts(QoS::AtMostOnce)).await;
    let got = s.expect_publish().await;
    assert_eq!(got.qos, QoS::AtMostOnce);
    assert!(got.retain);
    let mut props = got.properties.clone();
    assert!(props
        .message_expiry_interval
        .is_some_and(|e| (3598..=3600).contains(&e)));
    props.message_expiry_interval = Some(3600);
    assert_eq!(props, full_properties());
}

#[tokio::test]
async fn retain_handling_0_1_2() {
    let (_b, addr) = start_default().await;
    let mut publ = RawClient::connect(addr, V5, "rhpub").await;
    publ.publish(retained("rh/t", b"kept")).await;
    let rh = |n: u8| SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        retain_handling: n,
        ..Default::default()
    };

    let mut s0 = RawClient::connect(addr, V5, "rh0").await;
    s0.subscribe("rh/t", rh(0)).await;
    assert_eq!(collect(&mut s0).await.len(), 1, "RH 0: sent on subscribe");
    s0.subscribe("rh/t", rh(0)).await;
    assert_eq!(
        collect(&mut s0).await.len(),
        1,
        "RH 0: sent again on re-subscribe"
    );

    let mut s1 = RawClient::connect(addr, V5, "rh1").await;
    s1.subscribe("rh/t", rh(1)).await;
    assert_eq!(
        collect(&mut s1).await.len(),
        1,
        "RH 1: sent for a new subscription"
    );
    s1.subscribe("rh/t", rh(1)).await;
    assert_eq!(
        collect(&mut s1).await.len(),
        0,
        "RH 1: not sent when the subscription existed"
    );

    let mut s2 = RawClient::connect(addr, V5, "rh2").await;
    s2.subscribe("rh/t", rh(2)).await;
    assert_eq!(
        collect(&mut s2).await.len(),
        0,
        "RH 2: never sent on subscribe"
    );
    // RH 2 still gets new messages.
    publ.publish(retained("rh/t", b"new")).await;
    assert_eq!(collect(&mut s2).await.len(), 1);
}

#[tokio::test]
async fn retained_message_on_subscribe_carries_the_subscription_identifier() {
    let (_b, addr) = start_default().await;
    let mut publ = RawClient::connect(addr, V5, "rsidpub").await;
    publ.publish(retained("rsid/t", b"x")).await;
    let mut s = RawClient::connect(addr, V5, "rsid").await;
    s.subscribe_with(vec![(bs("rsid/+"), opts(QoS::AtLeastOnce))], Some(9))
        .await;
    let got = s.expect_publish_ack().await;
    assert!(got.retain);
    assert_eq!(got.properties.subscription_identifiers, vec![9]);
}

#[tokio::test]
async fn retained_messages_not_sent_on_shared_subscribe() {
    let (_b, addr) = start_default().await;
    let mut publ = RawClient::connect(addr, V5, "rshpub").await;
    publ.publish(retained("rsh/t", b"x")).await;
    let mut s = RawClient::connect(addr, V5, "rsh").await;
    s.subscribe("$share/g/rsh/t", opts(QoS::AtLeastOnce)).await;
    s.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn every_publish_property_is_forwarded_untouched() {
    let (_b, addr) = start_default().await;
    let mut s = RawClient::connect(addr, V5, "props").await;
    s.subscribe("props/t", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "propspub").await;
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let mut p = publish("props/t", qos, "héllo".as_bytes());
        p.properties = full_properties();
        p.properties.user_properties.push((bs("ünï"), bs("")));
        p.properties
            .user_properties
            .push((bs(""), bs("empty name")));
        publ.publish(p.clone()).await;
        let got = s.expect_publish_ack().await;
        let mut want = p.properties.clone();
        want.message_expiry_interval = got.properties.message_expiry_interval;
        assert_eq!(got.properties, want, "QoS {qos:?}");
        assert!(got
            .properties
            .message_expiry_interval
            .is_some_and(|e| (3599..=3600).contains(&e)));
    }
    // No properties in, none out.
    publ.publish_simple("props/t", QoS::AtLeastOnce, b"bare")
        .await;
    assert_eq!(
        s.expect_publish_ack().await.properties,
        PublishProperties::default()
    );
}

#[tokio::test]
async fn message_expiry_is_decremented_and_expired_messages_are_not_delivered() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut connect = connect_packet(V5, "expsub");
    connect.properties = ConnectProperties {
        session_expiry_interval: Some(60),
        ..Default::default()
    };
    let (mut s, _) = RawClient::connect_with(addr, connect.clone()).await;
    s.subscribe("exp/#", opts(QoS::AtLeastOnce)).await;
    s.disconnect().await;

    let mut publ = RawClient::connect(addr, V5, "exppub").await;
    let mut long = publish("exp/long", QoS::AtLeastOnce, b"long");
    long.properties.message_expiry_interval = Some(10);
    let mut short = publish("exp/short", QoS::AtLeastOnce, b"short");
    short.properties.message_expiry_interval = Some(1);
    publ.publish(short).await;
    publ.publish(long).await;
    clock.advance(Duration::from_millis(1300));

    connect.clean_start = false;
    let (mut s, ack) = RawClient::connect_with(addr, connect).await;
    assert!(ack.session_present);
    let got = s.expect_publish_ack().await;
    assert_eq!(
        &*got.topic, "exp/long",
        "the 1 s message expired while the session was offline"
    );
    let left = got
        .properties
        .message_expiry_interval
        .expect("expiry must be forwarded");
    assert!(
        (8..=9).contains(&left),
        "10 s minus ~1.3 s waited, got {left}"
    );
    s.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn expired_retained_message_is_not_sent() {
    let (_b, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    let mut publ = RawClient::connect(addr, V5, "rexp").await;
    let mut p = retained("rexp/t", b"x");
    p.properties.message_expiry_interval = Some(1);
    publ.publish(p).await;
    clock.advance(Duration::from_millis(1200));
    let mut s = RawClient::connect(addr, V5, "rexps").await;
    s.subscribe("rexp/t", opts(QoS::AtLeastOnce)).await;
    s.expect_nothing(QUIET).await;
}

fn bad_utf8(qos: QoS) -> statehub_broker::codec::Publish {
    let mut p = publish("pfi/t", qos, &[0x66, 0xFF, 0xFE, 0x80]);
    p.properties.payload_format_utf8 = true;
    p
}

#[tokio::test]
async fn payload_format_indicator_with_invalid_utf8_is_refused_0x99() {
    let (_b, addr) = start_default().await;
    let mut s = RawClient::connect(addr, V5, "pfisub").await;
    s.subscribe("pfi/#", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "pfipub").await;
    assert_eq!(
        publ.publish(bad_utf8(QoS::AtLeastOnce)).await,
        ReasonCode::PAYLOAD_FORMAT_INVALID
    );
    assert_eq!(
        publ.publish(bad_utf8(QoS::ExactlyOnce)).await,
        ReasonCode::PAYLOAD_FORMAT_INVALID
    );
    s.expect_nothing(QUIET).await;
    // Valid UTF-8 with the indicator passes, and the indicator is forwarded.
    let mut ok = publish("pfi/t", QoS::AtLeastOnce, "ok ✓".as_bytes());
    ok.properties.payload_format_utf8 = true;
    assert_eq!(publ.publish(ok).await, ReasonCode::SUCCESS);
    assert!(s.expect_publish_ack().await.properties.payload_format_utf8);
    // Invalid UTF-8 *without* the indicator is just bytes.
    publ.publish_simple("pfi/t", QoS::AtLeastOnce, &[0xFF])
        .await;
    assert_eq!(&s.expect_publish_ack().await.payload[..], &[0xFF]);
    // QoS 0 has no acknowledgement: the server disconnects with 0x99.
    publ.send(&Packet::Publish(bad_utf8(QoS::AtMostOnce))).await;
    publ.expect_disconnect(ReasonCode::PAYLOAD_FORMAT_INVALID)
        .await;
    let _ = Bytes::new();
}
