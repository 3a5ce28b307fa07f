//! Publish/subscribe: QoS in both directions, 3.1.1/5 interop, downgrade,
//! wildcards, `$` topics, overlapping subscriptions, subscription identifiers,
//! No Local, Retain As Published and UNSUBSCRIBE.

use std::time::Duration;

use bytes::Bytes;
use statehub_broker::codec::{Packet, PubResponse, QoS, ReasonCode, SubscriptionOptions};
use statehub_test_support::*;

#[tokio::test]
async fn qos_0_1_2_both_directions_raw_v5() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "sub").await;
    let ack = sub.subscribe("q/#", opts(QoS::ExactlyOnce)).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::GRANTED_QOS_2]);
    let mut publ = RawClient::connect(addr, V5, "pub").await;
    for (i, qos) in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce]
        .into_iter()
        .enumerate()
    {
        let code = publ
            .publish_simple(&format!("q/{i}"), qos, format!("m{i}").as_bytes())
            .await;
        assert_eq!(code, ReasonCode::SUCCESS);
        let got = sub.expect_publish_ack().await;
        assert_eq!(got.qos, qos);
        assert_eq!(&*got.topic, format!("q/{i}"));
        assert_eq!(&got.payload[..], format!("m{i}").as_bytes());
        assert_eq!(got.packet_id.is_some(), qos != QoS::AtMostOnce);
        assert!(!got.dup && !got.retain);
    }
    sub.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn qos_0_1_2_raw_v311() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V311, "sub3").await;
    let ack = sub.subscribe("q/#", opts(QoS::ExactlyOnce)).await;
    assert_eq!(ack.reason_codes, vec![ReasonCode::GRANTED_QOS_2]);
    let mut publ = RawClient::connect(addr, V311, "pub3").await;
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        publ.publish_simple("q/x", qos, b"v3").await;
        let got = sub.expect_publish_ack().await;
        assert_eq!(got.qos, qos);
        assert_eq!(&got.payload[..], b"v3");
    }
}

#[tokio::test]
async fn rumqttc_v5_round_trip_all_qos() {
    let (_b, addr) = start_default().await;
    let (sub, mut rx) = v5c::connect(v5c::options(addr, "r5sub")).await;
    sub.subscribe("r5/#", v5c::QoS::ExactlyOnce).await.unwrap();
    v5c::next_suback(&mut rx).await;
    let (publ, _prx) = v5c::connect(v5c::options(addr, "r5pub")).await;
    for (i, qos) in [
        v5c::QoS::AtMostOnce,
        v5c::QoS::AtLeastOnce,
        v5c::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        publ.publish(format!("r5/{i}"), qos, false, format!("p{i}"))
            .await
            .unwrap();
        let got = v5c::next_publish(&mut rx).await;
        assert_eq!(got.qos, qos);
        assert_eq!(&got.topic[..], format!("r5/{i}").as_bytes());
        assert_eq!(&got.payload[..], format!("p{i}").as_bytes());
    }
}

#[tokio::test]
async fn rumqttc_v311_round_trip_all_qos() {
    let (_b, addr) = start_default().await;
    let (sub, mut rx) = v4c::connect(v4c::options(addr, "r4sub")).await;
    sub.subscribe("r4/#", v4c::QoS::ExactlyOnce).await.unwrap();
    v4c::next_suback(&mut rx).await;
    let (publ, _prx) = v4c::connect(v4c::options(addr, "r4pub")).await;
    for (i, qos) in [
        v4c::QoS::AtMostOnce,
        v4c::QoS::AtLeastOnce,
        v4c::QoS::ExactlyOnce,
    ]
    .into_iter()
    .enumerate()
    {
        publ.publish(format!("r4/{i}"), qos, false, format!("p{i}"))
            .await
            .unwrap();
        let got = v4c::next_publish(&mut rx).await;
        assert_eq!(got.qos, qos);
        assert_eq!(got.topic, format!("r4/{i}"));
        assert_eq!(&got.payload[..], format!("p{i}").as_bytes());
    }
}

#[tokio::test]
async fn v311_publisher_to_v5_subscriber() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "i5sub").await;
    sub.subscribe("interop/#", opts(QoS::AtLeastOnce)).await;
    let (publ, _prx) = v4c::connect(v4c::options(addr, "i3pub")).await;
    publ.publish("interop/a", v4c::QoS::AtLeastOnce, false, "from v3")
        .await
        .unwrap();
    let got = sub.expect_publish_ack().await;
    assert_eq!(&*got.topic, "interop/a");
    assert_eq!(&got.payload[..], b"from v3");
    assert_eq!(got.qos, QoS::AtLeastOnce);
    assert!(got.properties.user_properties.is_empty());
}

#[tokio::test]
async fn v5_publisher_with_properties_to_v311_subscriber() {
    let (_b, addr) = start_default().await;
    let (sub, mut rx) = v4c::connect(v4c::options(addr, "i3sub")).await;
    sub.subscribe("interop/#", v4c::QoS::ExactlyOnce)
        .await
        .unwrap();
    v4c::next_suback(&mut rx).await;
    let mut publ = RawClient::connect(addr, V5, "i5pub").await;
    let mut p = publish("interop/b", QoS::ExactlyOnce, b"from v5");
    p.properties = full_properties();
    assert_eq!(publ.publish(p).await, ReasonCode::SUCCESS);
    let got = v4c::next_publish(&mut rx).await;
    assert_eq!(got.topic, "interop/b");
    assert_eq!(&got.payload[..], b"from v5");
    assert_eq!(got.qos, v4c::QoS::ExactlyOnce);
}

#[tokio::test]
async fn qos_is_downgraded_to_the_subscription_maximum() {
    let (_b, addr) = start_default().await;
    let mut s0 = RawClient::connect(addr, V5, "s0").await;
    s0.subscribe("dg", opts(QoS::AtMostOnce)).await;
    let mut s1 = RawClient::connect(addr, V5, "s1").await;
    s1.subscribe("dg", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "dgpub").await;
    publ.publish_simple("dg", QoS::ExactlyOnce, b"x").await;
    assert_eq!(s0.expect_publish_ack().await.qos, QoS::AtMostOnce);
    assert_eq!(s1.expect_publish_ack().await.qos, QoS::AtLeastOnce);
    // ... and never upgraded.
    publ.publish_simple("dg", QoS::AtMostOnce, b"y").await;
    assert_eq!(s1.expect_publish_ack().await.qos, QoS::AtMostOnce);
}

async fn received_topics(c: &mut RawClient) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        match c.next_event(QUIET).await {
            Event::Packet(Packet::Publish(p)) => {
                c.ack(&p).await;
                out.push(p.topic.to_string());
            }
            Event::Timeout => return out,
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn single_and_multi_level_wildcards() {
    let (_b, addr) = start_default().await;
    let mut plus = RawClient::connect(addr, V5, "plus").await;
    plus.subscribe("a/+/c", opts(QoS::AtMostOnce)).await;
    let mut hash = RawClient::connect(addr, V5, "hash").await;
    hash.subscribe("w/#", opts(QoS::AtMostOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "wpub").await;
    for t in [
        "a/b/c", "a/b/c/d", "a/c", "a//c", "w", "w/x", "w/x/y/z", "ww/x", "x/w",
    ] {
        publ.publish_simple(t, QoS::AtMostOnce, b"").await;
    }
    publ.ping().await;
    assert_eq!(received_topics(&mut plus).await, vec!["a/b/c", "a//c"]);
    assert_eq!(
        received_topics(&mut hash).await,
        vec!["w", "w/x", "w/x/y/z"]
    );
}

#[tokio::test]
async fn dollar_topics_are_not_matched_by_leading_wildcards() {
    let (b, addr) = start_default().await;
    let mut all = RawClient::connect(addr, V5, "all").await;
    all.subscribe_with(
        vec![
            (bs("#"), opts(QoS::AtMostOnce)),
            (bs("+/x"), opts(QoS::AtMostOnce)),
        ],
        None,
    )
    .await;
    let mut sys = RawClient::connect(addr, V5, "sys").await;
    sys.subscribe("$SYS/#", opts(QoS::AtMostOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "dpub").await;
    // Only the server publishes on `$` topics (a client's PUBLISH there is refused).
    let sys_msg = statehub_broker::Message::from_publish(
        publish("$SYS/x", QoS::AtMostOnce, b"1"),
        None,
        b.now(),
    );
    b.publish(sys_msg);
    publ.publish_simple("n/x", QoS::AtMostOnce, b"2").await;
    publ.ping().await;
    assert_eq!(
        received_topics(&mut all).await,
        vec!["n/x"],
        "one copy of n/x, no $SYS/x"
    );
    assert_eq!(received_topics(&mut sys).await, vec!["$SYS/x"]);
}

#[tokio::test]
async fn overlapping_subscriptions_give_one_copy_with_max_qos_and_all_identifiers() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "ovl").await;
    sub.subscribe_with(vec![(bs("o/+"), opts(QoS::AtMostOnce))], Some(1))
        .await;
    sub.subscribe_with(vec![(bs("o/#"), opts(QoS::AtLeastOnce))], Some(2))
        .await;
    sub.subscribe_with(vec![(bs("o/x"), opts(QoS::AtMostOnce))], Some(3))
        .await;
    let mut publ = RawClient::connect(addr, V5, "ovlpub").await;
    publ.publish_simple("o/x", QoS::ExactlyOnce, b"once").await;
    let got = sub.expect_publish_ack().await;
    assert_eq!(
        got.qos,
        QoS::AtLeastOnce,
        "highest QoS of the matching subscriptions"
    );
    let mut ids = got.properties.subscription_identifiers.clone();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3]);
    sub.expect_nothing(QUIET).await;
}

/// Past a handful of matching subscriptions the merge looks clients up by hash (a
/// broadcast topic matches thousands): the same one copy per client there.
#[tokio::test]
async fn overlapping_subscriptions_merge_among_many_subscribers() {
    let (_b, addr) = start_default().await;
    let mut others = Vec::new();
    for i in 0..9 {
        let mut c = RawClient::connect(addr, V5, &format!("many{i}")).await;
        c.subscribe_with(vec![(bs("m/x"), opts(QoS::AtMostOnce))], None)
            .await;
        others.push(c);
    }
    let mut sub = RawClient::connect(addr, V5, "many-ovl").await;
    for (i, filter) in ["m/+", "m/#", "m/x", "+/x", "#"].into_iter().enumerate() {
        let qos = if i == 3 {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        sub.subscribe_with(vec![(bs(filter), opts(qos))], Some(i as u32 + 1))
            .await;
    }
    let mut publ = RawClient::connect(addr, V5, "manypub").await;
    publ.publish_simple("m/x", QoS::ExactlyOnce, b"once").await;
    let got = sub.expect_publish_ack().await;
    assert_eq!(got.qos, QoS::AtLeastOnce);
    let mut ids = got.properties.subscription_identifiers.clone();
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    sub.expect_nothing(QUIET).await;
    for mut c in others {
        assert_eq!(&c.expect_publish().await.payload[..], b"once");
        c.expect_nothing(QUIET).await;
    }
}

#[tokio::test]
async fn subscription_identifier_is_sent_and_updated() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "sid").await;
    sub.subscribe_with(vec![(bs("sid/t"), opts(QoS::AtMostOnce))], Some(42))
        .await;
    let mut publ = RawClient::connect(addr, V5, "sidpub").await;
    publ.publish_simple("sid/t", QoS::AtMostOnce, b"1").await;
    assert_eq!(
        sub.expect_publish()
            .await
            .properties
            .subscription_identifiers,
        vec![42]
    );
    // Re-subscribing without an identifier removes it.
    sub.subscribe_with(vec![(bs("sid/t"), opts(QoS::AtMostOnce))], None)
        .await;
    publ.publish_simple("sid/t", QoS::AtMostOnce, b"2").await;
    assert!(sub
        .expect_publish()
        .await
        .properties
        .subscription_identifiers
        .is_empty());
}

#[tokio::test]
async fn no_local_suppresses_own_messages_only() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "nl").await;
    c.subscribe(
        "nl/t",
        SubscriptionOptions {
            qos: QoS::AtLeastOnce,
            no_local: true,
            ..Default::default()
        },
    )
    .await;
    let code = c.publish_simple("nl/t", QoS::AtLeastOnce, b"mine").await;
    assert!(code.is_success());
    c.expect_nothing(QUIET).await;
    let mut other = RawClient::connect(addr, V5, "nl-other").await;
    other
        .publish_simple("nl/t", QoS::AtLeastOnce, b"theirs")
        .await;
    assert_eq!(&c.expect_publish_ack().await.payload[..], b"theirs");
}

#[tokio::test]
async fn retain_as_published() {
    let (_b, addr) = start_default().await;
    let mut rap = RawClient::connect(addr, V5, "rap").await;
    rap.subscribe(
        "rap/t",
        SubscriptionOptions {
            qos: QoS::AtMostOnce,
            retain_as_published: true,
            ..Default::default()
        },
    )
    .await;
    let mut plain = RawClient::connect(addr, V5, "norap").await;
    plain.subscribe("rap/t", opts(QoS::AtMostOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "rappub").await;
    let mut p = publish("rap/t", QoS::AtMostOnce, b"r");
    p.retain = true;
    publ.publish(p).await;
    assert!(
        rap.expect_publish().await.retain,
        "Retain As Published keeps RETAIN"
    );
    assert!(
        !plain.expect_publish().await.retain,
        "RETAIN cleared on normal delivery [MQTT-3.3.1-12]"
    );
    publ.publish_simple("rap/t", QoS::AtMostOnce, b"n").await;
    assert!(!rap.expect_publish().await.retain);
}

#[tokio::test]
async fn unsubscribe_reports_0x11_when_nothing_existed_and_stops_delivery() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "unsub").await;
    c.subscribe("u/1", opts(QoS::AtMostOnce)).await;
    let ack = c.unsubscribe(&["u/1", "u/none"]).await;
    assert_eq!(
        ack.reason_codes,
        vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED]
    );
    let mut publ = RawClient::connect(addr, V5, "unsubpub").await;
    let code = publ.publish_simple("u/1", QoS::AtLeastOnce, b"x").await;
    assert_eq!(code, ReasonCode::NO_MATCHING_SUBSCRIBERS);
    c.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn invalid_filters_get_0x8f_and_valid_ones_in_the_same_subscribe_work() {
    let (_b, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "badfilter").await;
    let ack = c
        .subscribe_with(
            vec![
                (bs("a/#/b"), opts(QoS::AtMostOnce)),
                (bs("a+"), opts(QoS::AtMostOnce)),
                (bs("ok"), opts(QoS::AtLeastOnce)),
            ],
            None,
        )
        .await;
    assert_eq!(
        ack.reason_codes,
        vec![
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::GRANTED_QOS_1
        ]
    );
}

#[tokio::test]
async fn qos2_duplicate_publish_is_delivered_once() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "q2sub").await;
    sub.subscribe("q2", opts(QoS::ExactlyOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "q2pub").await;
    let mut p = publish("q2", QoS::ExactlyOnce, b"once");
    p.packet_id = Some(7);
    publ.send(&Packet::Publish(p.clone())).await;
    assert!(matches!(publ.expect().await, Packet::PubRec(r) if r.packet_id == 7));
    p.dup = true;
    publ.send(&Packet::Publish(p)).await;
    assert!(matches!(publ.expect().await, Packet::PubRec(r) if r.packet_id == 7));
    publ.send(&Packet::PubRel(PubResponse::ok(7))).await;
    assert!(
        matches!(publ.expect().await, Packet::PubComp(r) if r.packet_id == 7 && r.reason_code == ReasonCode::SUCCESS)
    );
    assert_eq!(&sub.expect_publish_ack().await.payload[..], b"once");
    sub.expect_nothing(QUIET).await;
    // An unknown PUBREL gets PUBCOMP 0x92.
    publ.send(&Packet::PubRel(PubResponse::ok(99))).await;
    match publ.expect().await {
        Packet::PubComp(c) => assert_eq!(c.reason_code, ReasonCode::PACKET_IDENTIFIER_NOT_FOUND),
        other => panic!("expected PUBCOMP, got {other:?}"),
    }
}

#[tokio::test]
async fn empty_and_large_payloads_pass_through() {
    let (_b, addr) = start_default().await;
    let mut sub = RawClient::connect(addr, V5, "sz").await;
    sub.subscribe("sz", opts(QoS::AtLeastOnce)).await;
    let mut publ = RawClient::connect(addr, V5, "szpub").await;
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    for payload in [Bytes::new(), Bytes::from(big)] {
        let mut p = publish("sz", QoS::AtLeastOnce, &payload);
        p.payload = payload.clone();
        publ.publish(p).await;
        assert_eq!(sub.expect_publish_ack().await.payload, payload);
    }
    let _ = Duration::ZERO;
}

#[tokio::test]
async fn refused_filters_get_0x80_v5_and_v311() {
    let cfg = statehub_broker::BrokerConfig {
        refused_filters: vec!["test/nosubscribe".into()],
        ..Default::default()
    };
    let (_b, addr) = start_broker(cfg).await;
    for (v, id) in [(V5, "ref5"), (V311, "ref3")] {
        let mut c = RawClient::connect(addr, v, id).await;
        let ack = c
            .subscribe_with(
                vec![
                    (bs("test/nosubscribe"), opts(QoS::AtLeastOnce)),
                    (bs("test/ok"), opts(QoS::AtLeastOnce)),
                ],
                None,
            )
            .await;
        assert_eq!(
            ack.reason_codes,
            vec![ReasonCode::UNSPECIFIED_ERROR, ReasonCode::GRANTED_QOS_1],
            "{v:?}"
        );
    }
}
