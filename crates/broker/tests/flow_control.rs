//! Flow control and per-connection limits: Receive Maximum both ways, the
//! client's Maximum Packet Size, topic aliases both ways, shared subscriptions.

use std::sync::atomic::Ordering;
use std::time::Duration;

use statehub_broker::codec::{ConnectProperties, Packet, PubResponse, Publish, QoS, ReasonCode};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

fn with_props(id: &str, props: ConnectProperties) -> statehub_broker::codec::Connect {
    let mut c = connect_packet(V5, id);
    c.properties = props;
    c
}

#[tokio::test]
async fn client_receive_maximum_bounds_unacknowledged_qos1() {
    let (_b, addr) = start_default().await;
    let props = ConnectProperties {
        receive_maximum: Some(2),
        ..Default::default()
    };
    let (mut s, _) = RawClient::connect_with(addr, with_props("rm", props)).await;
    s.subscribe("rm/t", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "rmpub").await;
    for i in 0..5u8 {
        publ.publish_simple("rm/t", QoS::AtLeastOnce, &[i]).await;
    }
    let a = s.expect_publish().await;
    let b = s.expect_publish().await;
    s.expect_nothing(QUIET).await; // window full
    s.ack(&a).await;
    let c = s.expect_publish().await;
    s.expect_nothing(QUIET).await;
    s.ack(&b).await;
    s.ack(&c).await;
    let d = s.expect_publish_ack().await;
    let e = s.expect_publish_ack().await;
    let order: Vec<u8> = [a, b, c, d, e].iter().map(|p| p.payload[0]).collect();
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
}

#[tokio::test]
async fn server_receive_maximum_exceeded_with_qos2_is_0x93() {
    let cfg = BrokerConfig {
        receive_maximum: 2,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let (mut c, ack) = RawClient::connect_with(addr, connect_packet(V5, "srm")).await;
    assert_eq!(ack.properties.receive_maximum, Some(2));
    for id in 1..=2u16 {
        let mut p = publish("srm/t", QoS::ExactlyOnce, b"x");
        p.packet_id = Some(id);
        c.send(&Packet::Publish(p)).await;
        assert!(matches!(c.expect().await, Packet::PubRec(r) if r.packet_id == id));
    }
    let mut p = publish("srm/t", QoS::ExactlyOnce, b"x");
    p.packet_id = Some(3);
    c.send(&Packet::Publish(p)).await;
    c.expect_disconnect(ReasonCode::RECEIVE_MAXIMUM_EXCEEDED)
        .await;
}

#[tokio::test]
async fn server_receive_maximum_frees_up_after_pubrel() {
    let cfg = BrokerConfig {
        receive_maximum: 1,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let mut c = RawClient::connect(addr, V5, "srm2").await;
    for _ in 0..3 {
        c.publish_simple("srm2/t", QoS::ExactlyOnce, b"x").await; // full exchange each time
    }
    c.ping().await;
}

#[tokio::test]
async fn client_maximum_packet_size_drops_oversize_messages() {
    let (broker, addr) = start_default().await;
    let props = ConnectProperties {
        maximum_packet_size: Some(100),
        ..Default::default()
    };
    let (mut s, _) = RawClient::connect_with(addr, with_props("mps", props)).await;
    s.subscribe("mps/t", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "mpspub").await;
    publ.publish_simple("mps/t", QoS::AtLeastOnce, &[7u8; 500])
        .await;
    publ.publish_simple("mps/t", QoS::AtMostOnce, &[8u8; 500])
        .await;
    publ.publish_simple("mps/t", QoS::AtLeastOnce, b"small")
        .await;
    let got = s.expect_publish_ack().await;
    assert_eq!(
        &got.payload[..],
        b"small",
        "oversize messages are discarded [MQTT-3.1.2-25]"
    );
    s.expect_nothing(QUIET).await;
    assert_eq!(broker.metrics().oversize_dropped.load(Ordering::Relaxed), 2);
}

fn aliased(topic: &str, alias: u16, payload: &[u8]) -> Publish {
    let mut p = publish(topic, QoS::AtLeastOnce, payload);
    p.properties.topic_alias = Some(alias);
    p
}

#[tokio::test]
async fn topic_alias_from_the_client_is_resolved() {
    let (_b, addr) = start_default().await;
    let mut s = RawClient::connect(addr, V5, "tasub").await;
    s.subscribe("ta/#", opts(QoS::AtLeastOnce)).await;
    let (mut publ, ack) = RawClient::connect_with(addr, connect_packet(V5, "tapub")).await;
    assert_eq!(ack.properties.topic_alias_maximum, Some(64));
    publ.publish(aliased("ta/one", 1, b"set")).await;
    publ.publish(aliased("", 1, b"use")).await;
    publ.publish(aliased("ta/two", 1, b"reset")).await;
    publ.publish(aliased("", 1, b"use2")).await;
    for (topic, payload) in [
        ("ta/one", "set"),
        ("ta/one", "use"),
        ("ta/two", "reset"),
        ("ta/two", "use2"),
    ] {
        let got = s.expect_publish_ack().await;
        assert_eq!((&*got.topic, &got.payload[..]), (topic, payload.as_bytes()));
        assert_eq!(
            got.properties.topic_alias, None,
            "the client's alias is not forwarded"
        );
    }
}

#[tokio::test]
async fn topic_alias_over_the_maximum_is_0x94() {
    let cfg = BrokerConfig {
        topic_alias_maximum: 4,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let (mut c, ack) = RawClient::connect_with(addr, connect_packet(V5, "tamax")).await;
    assert_eq!(ack.properties.topic_alias_maximum, Some(4));
    c.publish(aliased("ok/t", 4, b"x")).await;
    c.send(&Packet::Publish(aliased("bad/t", 5, b"x"))).await;
    c.expect_disconnect(ReasonCode::TOPIC_ALIAS_INVALID).await;
}

#[tokio::test]
async fn unknown_topic_alias_is_a_protocol_error() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "taunk").await;
    c.send(&Packet::Publish(aliased("", 3, b"x"))).await;
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn server_assigns_topic_aliases_when_allowed() {
    let cfg = BrokerConfig {
        server_topic_aliases: true,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    let props = ConnectProperties {
        topic_alias_maximum: Some(2),
        ..Default::default()
    };
    let (mut s, _) = RawClient::connect_with(addr, with_props("sta", props)).await;
    s.subscribe("sta/#", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "stapub").await;
    for t in ["sta/a", "sta/a", "sta/b", "sta/c", "sta/b", "sta/c"] {
        publ.publish_simple(t, QoS::AtLeastOnce, t.as_bytes()).await;
    }
    let mut aliases = std::collections::HashMap::new();
    for t in ["sta/a", "sta/a", "sta/b", "sta/c", "sta/b", "sta/c"] {
        let got = s.expect_publish_ack().await;
        assert_eq!(&got.payload[..], t.as_bytes());
        match got.properties.topic_alias {
            Some(a) => {
                assert!(
                    (1..=2).contains(&a),
                    "alias {a} over the client's maximum 2"
                );
                if got.topic.is_empty() {
                    assert_eq!(
                        aliases.get(&a).map(String::as_str),
                        Some(t),
                        "alias {a} maps to the wrong topic"
                    );
                } else {
                    assert_eq!(&*got.topic, t);
                    aliases.insert(a, t.to_owned());
                }
            }
            None => assert_eq!(&*got.topic, t),
        }
    }
    assert_eq!(
        aliases.len(),
        2,
        "two aliases should have been assigned: {aliases:?}"
    );
}

#[tokio::test]
async fn no_server_aliases_for_clients_with_alias_maximum_zero() {
    let cfg = BrokerConfig {
        server_topic_aliases: true,
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    for (id, max) in [("zero", Some(0)), ("none", None)] {
        let props = ConnectProperties {
            topic_alias_maximum: max,
            ..Default::default()
        };
        let (mut s, _) = RawClient::connect_with(addr, with_props(id, props)).await;
        s.subscribe("z/t", opts(QoS::AtMostOnce)).await;
        let mut publ = RawClient::connect(addr, V5, &format!("{id}-pub")).await;
        for _ in 0..3 {
            publ.publish_simple("z/t", QoS::AtMostOnce, b"x").await;
            let got = s.expect_publish().await;
            assert_eq!(got.properties.topic_alias, None);
            assert_eq!(&*got.topic, "z/t");
        }
        s.unsubscribe(&["z/t"]).await;
    }
}

async fn count(c: &mut RawClient) -> Vec<u8> {
    let mut v = Vec::new();
    while let Event::Packet(Packet::Publish(p)) = c.next_event(QUIET).await {
        c.ack(&p).await;
        v.push(p.payload[0]);
    }
    v
}

#[tokio::test]
async fn shared_subscription_delivers_each_message_to_one_member() {
    let (_b, addr) = start_default().await;
    let mut m1 = RawClient::connect(addr, V5, "m1").await;
    let mut m2 = RawClient::connect(addr, V5, "m2").await;
    m1.subscribe("$share/g/sh/t", opts(QoS::AtLeastOnce)).await;
    m2.subscribe("$share/g/sh/t", opts(QoS::AtLeastOnce)).await;
    let mut other = RawClient::connect(addr, V5, "m3").await;
    other
        .subscribe("$share/h/sh/+", opts(QoS::AtLeastOnce))
        .await;
    let mut plain = RawClient::connect(addr, V5, "plain").await;
    plain.subscribe("sh/t", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "shpub").await;
    for i in 0..10u8 {
        publ.publish_simple("sh/t", QoS::AtLeastOnce, &[i]).await;
    }
    let a = count(&mut m1).await;
    let b = count(&mut m2).await;
    let mut all: Vec<u8> = a.iter().chain(&b).copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..10).collect::<Vec<_>>(),
        "each message to exactly one member of g: {a:?} {b:?}"
    );
    assert!(
        !a.is_empty() && !b.is_empty(),
        "round robin should use both members: {a:?} {b:?}"
    );
    assert_eq!(
        count(&mut other).await.len(),
        10,
        "group h gets its own copy"
    );
    assert_eq!(count(&mut plain).await.len(), 10);
}

#[tokio::test]
async fn unacknowledged_shared_message_goes_to_another_member_when_one_drops() {
    let (_b, addr) = start_default().await;
    let mut m1 = RawClient::connect(addr, V5, "sd1").await;
    let mut m2 = RawClient::connect(addr, V5, "sd2").await;
    m1.subscribe("$share/g/sd/t", opts(QoS::AtLeastOnce)).await;
    m2.subscribe("$share/g/sd/t", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "sdpub").await;
    publ.publish_simple("sd/t", QoS::AtLeastOnce, b"hand over")
        .await;
    let (got, first_is_m1) = tokio::select! {
        e = m1.next_event(WAIT) => (e, true),
        e = m2.next_event(WAIT) => (e, false),
    };
    let Event::Packet(Packet::Publish(first)) = got else {
        panic!("expected a PUBLISH, got {got:?}")
    };
    assert_eq!(&first.payload[..], b"hand over");
    let (dropped, mut survivor) = if first_is_m1 { (m1, m2) } else { (m2, m1) };
    drop(dropped); // no PUBACK
    let again = survivor.expect_publish().await;
    assert_eq!(&again.payload[..], b"hand over");
    survivor
        .send(&Packet::PubAck(PubResponse::ok(again.packet_id.unwrap())))
        .await;
    survivor.expect_nothing(QUIET).await;
    let _ = Duration::ZERO;
}

#[tokio::test]
async fn no_local_on_shared_subscription_is_a_protocol_error() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "shnl").await;
    let o = statehub_broker::codec::SubscriptionOptions {
        qos: QoS::AtMostOnce,
        no_local: true,
        ..Default::default()
    };
    c.send(&Packet::Subscribe(statehub_broker::codec::Subscribe {
        packet_id: 1,
        filters: vec![(bs("$share/g/x"), o)],
        ..Default::default()
    }))
    .await;
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}
