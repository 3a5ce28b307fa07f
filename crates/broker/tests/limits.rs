//! The broker's per-packet and per-client limits, each answered with the protocol's
//! own reason code: filters per SUBSCRIBE, subscriptions per client, topic levels;
//! and the reason codes of a few refusals the spec names.

use statehub_broker::codec::{
    ByteString, Connect, LastWill, Packet, QoS, ReasonCode, SubscriptionOptions,
};
use statehub_broker::BrokerConfig;
use statehub_test_support::*;

fn filters(names: &[&str]) -> Vec<(ByteString, SubscriptionOptions)> {
    names
        .iter()
        .map(|f| (bs(f), opts(QoS::AtLeastOnce)))
        .collect()
}

#[tokio::test]
async fn filters_past_the_per_subscribe_limit_get_0x97() {
    let (broker, addr) = start_broker(BrokerConfig {
        max_filters_per_subscribe: 3,
        ..Default::default()
    })
    .await;
    let mut c = RawClient::connect(addr, V5, "many").await;
    let ack = c
        .subscribe_with(filters(&["a", "b/+", "c/#", "d", "e/#"]), None)
        .await;
    let q = ReasonCode::QUOTA_EXCEEDED;
    let one = ReasonCode::GRANTED_QOS_1;
    assert_eq!(ack.reason_codes, [one, one, one, q, q]);
    assert_eq!(broker.subscription_count(), 3);
    // 3.1.1 has one failure code.
    let mut old = RawClient::connect(addr, V311, "many-311").await;
    let ack = old
        .subscribe_with(filters(&["a", "b", "c", "d"]), None)
        .await;
    assert_eq!(ack.reason_codes[3], ReasonCode(0x80));
}

#[tokio::test]
async fn a_session_holds_at_most_the_per_client_limit() {
    let (broker, addr) = start_broker(BrokerConfig {
        max_subscriptions_per_client: 2,
        ..Default::default()
    })
    .await;
    let mut c = RawClient::connect(addr, V5, "capped").await;
    let one = ReasonCode::GRANTED_QOS_1;
    let ack = c.subscribe_with(filters(&["a/#", "b/+", "c"]), None).await;
    assert_eq!(ack.reason_codes, [one, one, ReasonCode::QUOTA_EXCEEDED]);
    // Replacing one it holds is no new subscription.
    assert_eq!(
        c.subscribe("a/#", opts(QoS::AtMostOnce)).await.reason_codes,
        [ReasonCode::GRANTED_QOS_0]
    );
    c.unsubscribe(&["b/+"]).await;
    assert_eq!(
        c.subscribe("c", opts(QoS::AtLeastOnce)).await.reason_codes,
        [one]
    );
    assert_eq!(broker.subscription_count(), 2);
    let refused = &broker.metrics().subscriptions_refused;
    assert_eq!(refused.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn topics_and_filters_over_the_level_limit_are_refused() {
    let (_broker, addr) = start_broker(BrokerConfig {
        max_topic_levels: 4,
        ..Default::default()
    })
    .await;
    let mut c = RawClient::connect(addr, V5, "deep").await;
    let ack = c
        .subscribe_with(
            filters(&["a/b/c/#", "a/b/c/d/#", "$share/g/a/b/c/d/e"]),
            None,
        )
        .await;
    let invalid = ReasonCode::TOPIC_FILTER_INVALID;
    assert_eq!(
        ack.reason_codes,
        [ReasonCode::GRANTED_QOS_1, invalid, invalid]
    );
    assert_eq!(
        c.publish_simple("a/b/c/d/e", QoS::AtLeastOnce, b"x").await,
        ReasonCode::TOPIC_NAME_INVALID
    );
    assert_eq!(
        c.publish_simple("x/y/z/w", QoS::ExactlyOnce, b"x").await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    c.send(&Packet::Publish(publish(
        "a/b/c/d/e",
        QoS::AtMostOnce,
        b"x",
    )))
    .await;
    c.expect_disconnect(ReasonCode::TOPIC_NAME_INVALID).await;
    // A will whose topic is too deep is refused at CONNECT.
    let connect = Connect {
        will: Some(LastWill {
            qos: QoS::AtMostOnce,
            retain: false,
            topic: bs("w/w/w/w/w"),
            payload: Default::default(),
            properties: Default::default(),
        }),
        ..connect_packet(V5, "deep-will")
    };
    let (_c, ack) = RawClient::connect_with(addr, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::TOPIC_NAME_INVALID);
}

#[tokio::test]
async fn wildcard_topic_and_topic_alias_0_have_their_own_codes() {
    let (_broker, addr) = start_default().await;
    let mut c = RawClient::connect(addr, V5, "wild").await;
    c.send(&Packet::Publish(publish("a/+", QoS::AtLeastOnce, b"x")))
        .await;
    c.expect_disconnect(ReasonCode::TOPIC_NAME_INVALID).await;
    let mut c = RawClient::connect(addr, V5, "alias0").await;
    // PUBLISH QoS 0 "t" with Topic Alias 0 (the encoder refuses to write it).
    c.send_raw(&[0x30, 0x08, 0x00, 0x01, b't', 0x03, 0x23, 0x00, 0x00, b'x'])
        .await;
    c.expect_disconnect(ReasonCode::TOPIC_ALIAS_INVALID).await;
}

#[tokio::test]
async fn connect_refusals_carry_the_spec_codes() {
    let (_broker, addr) = start_default().await;
    let cases: [(&[u8], ReasonCode); 3] = [
        // CONNECT v5, client id "c", one byte after the payload.
        (
            &[
                0x10, 0x0F, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00, 0x00, 0x00,
                0x01, b'c', 0xFF,
            ],
            ReasonCode::MALFORMED_PACKET,
        ),
        // CONNECT v5 with Receive Maximum 0.
        (
            &[
                0x10, 0x11, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00, 0x03, 0x21,
                0x00, 0x00, 0x00, 0x01, b'c',
            ],
            ReasonCode::PROTOCOL_ERROR,
        ),
        // CONNECT v5 with Session Expiry Interval twice.
        (
            &[
                0x10, 0x18, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00, 0x0A, 0x11,
                0x00, 0x00, 0x00, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x14, 0x00, 0x01, b'c',
            ],
            ReasonCode::PROTOCOL_ERROR,
        ),
    ];
    for (bytes, code) in cases {
        let mut c = RawClient::open(addr, V5).await;
        c.send_raw(bytes).await;
        match c.expect().await {
            Packet::ConnAck(a) => assert_eq!(a.reason_code, code, "{bytes:02X?}"),
            other => panic!("expected CONNACK, got {other:?}"),
        }
        c.expect_closed().await;
    }
}

/// Each topic alias the server assigns keeps its topic for the connection's life: a
/// client allowing 65,535 of them gets no more than the server's own maximum.
#[tokio::test]
async fn server_assigned_aliases_stop_at_the_servers_maximum() {
    let (_broker, addr) = start_broker(BrokerConfig {
        server_topic_aliases: true,
        topic_alias_maximum: 2,
        ..Default::default()
    })
    .await;
    let mut connect = connect_packet(V5, "many-aliases");
    connect.properties.topic_alias_maximum = Some(u16::MAX);
    let (mut s, _) = RawClient::connect_with(addr, connect).await;
    s.subscribe("al/#", opts(QoS::AtMostOnce)).await;
    let mut publisher = RawClient::connect(addr, V5, "al-pub").await;
    for i in 0..5 {
        publisher
            .publish_simple(&format!("al/{i}"), QoS::AtMostOnce, b"x")
            .await;
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(s.expect_publish().await.properties.topic_alias);
    }
    assert_eq!(got, [Some(1), Some(2), None, None, None]);
}

/// `$statehub/...` is the server's own (the admin view's state store answers travel
/// there): filters into it are refused with 0x87 (0x80 for 3.1.1), shared or not;
/// look-alikes are not.
#[tokio::test]
async fn filters_into_the_reserved_statehub_level_get_0x87() {
    let (_broker, addr) = start_broker(BrokerConfig::default()).await;
    let mut c = RawClient::connect(addr, V5, "curious").await;
    let ack = c
        .subscribe_with(
            filters(&[
                "$statehub/#",
                "$statehub/admin/+",
                "$share/g/$statehub/admin/x",
                "$statehubx/#",
                "#",
            ]),
            None,
        )
        .await;
    let no = ReasonCode::NOT_AUTHORIZED;
    let one = ReasonCode::GRANTED_QOS_1;
    assert_eq!(ack.reason_codes, [no, no, no, one, one]);
}
