//! SUBSCRIBE, SUBACK, UNSUBSCRIBE and UNSUBACK, exact bytes in both versions.

mod common;

use common::*;
use statehub_mqtt_codec::*;

#[test]
fn subscribe_v5_with_options_and_subscription_id() {
    let bytes = [
        0x82, 0x19, // SUBSCRIBE, remaining length 25
        0x00, 0x0A, // packet id 10
        0x0A, // property length 10
        0x0B, 0x80, 0x01, // subscription identifier 128
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property
        0x00, 0x03, b'a', b'/', b'b',
        0x2D, // QoS 1, no local, retain as published, retain handling 2
        0x00, 0x03, b'c', b'/', b'#', 0x02, // QoS 2
    ];
    let sub = Subscribe {
        packet_id: 10,
        subscription_identifier: Some(128),
        user_properties: vec![up("k", "v")],
        filters: vec![
            (
                s("a/b"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    no_local: true,
                    retain_as_published: true,
                    retain_handling: 2,
                },
            ),
            (
                s("c/#"),
                SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                },
            ),
        ],
    };
    exact(V5, &bytes, Packet::Subscribe(sub));
}

#[test]
fn subscribe_v5_retain_handling_1() {
    let bytes = [0x82, 0x08, 0x00, 0x01, 0x00, 0x00, 0x02, b'a', b'b', 0x10];
    let sub = Subscribe {
        packet_id: 1,
        filters: vec![(
            s("ab"),
            SubscriptionOptions {
                retain_handling: 1,
                ..Default::default()
            },
        )],
        ..Default::default()
    };
    exact(V5, &bytes, Packet::Subscribe(sub));
}

#[test]
fn suback_v5() {
    let bytes = [
        0x90, 0x0F, // SUBACK, remaining length 15
        0x00, 0x0A, // packet id
        0x07, 0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // properties: user property
        0x01, 0x00, 0x80, 0x8F, 0xA2, // reason codes
    ];
    let ack = SubAck {
        packet_id: 10,
        reason_codes: vec![
            ReasonCode::GRANTED_QOS_1,
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::UNSPECIFIED_ERROR,
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
        ],
        reason_string: None,
        user_properties: vec![up("k", "v")],
    };
    exact(V5, &bytes, Packet::SubAck(ack));
    let plain = SubAck {
        packet_id: 10,
        reason_codes: vec![ReasonCode::GRANTED_QOS_2],
        ..Default::default()
    };
    exact(
        V5,
        &[0x90, 0x04, 0x00, 0x0A, 0x00, 0x02],
        Packet::SubAck(plain),
    );
}

#[test]
fn unsubscribe_v5() {
    let bytes = [
        0xA2, 0x14, // UNSUBSCRIBE, remaining length 20
        0x00, 0x0A, // packet id
        0x07, 0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // properties: user property
        0x00, 0x03, b'a', b'/', b'b', // filter
        0x00, 0x03, b'c', b'/', b'#', // filter
    ];
    let unsub = Unsubscribe {
        packet_id: 10,
        user_properties: vec![up("k", "v")],
        filters: vec![s("a/b"), s("c/#")],
    };
    exact(V5, &bytes, Packet::Unsubscribe(unsub));
}

#[test]
fn unsuback_v5() {
    let bytes = [
        0xB0, 0x0A, // UNSUBACK, remaining length 10
        0x00, 0x0A, // packet id
        0x05, 0x1F, 0x00, 0x02, b'o', b'k', // properties: reason string
        0x00, 0x11, // success, no subscription existed
    ];
    let ack = UnsubAck {
        packet_id: 10,
        reason_codes: vec![ReasonCode::SUCCESS, ReasonCode::NO_SUBSCRIPTION_EXISTED],
        reason_string: Some(s("ok")),
        user_properties: vec![],
    };
    exact(V5, &bytes, Packet::UnsubAck(ack));
}

#[test]
fn subscribe_v311() {
    let bytes = [
        0x82, 0x12, 0x12, 0x34, // SUBSCRIBE, packet id 0x1234
        0x00, 0x04, b't', b'e', b's', b't', 0x01, // "test" QoS 1
        0x00, 0x06, b'f', b'i', b'l', b't', b'e', b'r', 0x02, // "filter" QoS 2
    ];
    let sub = Subscribe {
        packet_id: 0x1234,
        filters: vec![
            (
                s("test"),
                SubscriptionOptions {
                    qos: QoS::AtLeastOnce,
                    ..Default::default()
                },
            ),
            (
                s("filter"),
                SubscriptionOptions {
                    qos: QoS::ExactlyOnce,
                    ..Default::default()
                },
            ),
        ],
        ..Default::default()
    };
    exact(V311, &bytes, Packet::Subscribe(sub));
}

#[test]
fn suback_v311() {
    let ack = SubAck {
        packet_id: 0x1234,
        reason_codes: vec![
            ReasonCode::GRANTED_QOS_1,
            ReasonCode::UNSPECIFIED_ERROR,
            ReasonCode::GRANTED_QOS_2,
        ],
        ..Default::default()
    };
    exact(
        V311,
        &[0x90, 0x05, 0x12, 0x34, 0x01, 0x80, 0x02],
        Packet::SubAck(ack),
    );
    // Any MQTT 5 failure code becomes 0x80; reason string and properties are dropped.
    let v5_codes = SubAck {
        packet_id: 1,
        reason_codes: vec![
            ReasonCode::TOPIC_FILTER_INVALID,
            ReasonCode::GRANTED_QOS_0,
            ReasonCode::QUOTA_EXCEEDED,
        ],
        reason_string: Some(s("dropped")),
        user_properties: vec![up("k", "v")],
    };
    assert_eq!(
        &encode(V311, &Packet::SubAck(v5_codes))[..],
        &[0x90, 0x05, 0x00, 0x01, 0x80, 0x00, 0x80]
    );
}

#[test]
fn unsubscribe_v311() {
    let bytes = [
        0xA2, 0x10, 0x12, 0x34, // UNSUBSCRIBE, packet id 0x1234
        0x00, 0x04, b't', b'e', b's', b't', // "test"
        0x00, 0x06, b'f', b'i', b'l', b't', b'e', b'r', // "filter"
    ];
    let unsub = Unsubscribe {
        packet_id: 0x1234,
        user_properties: vec![],
        filters: vec![s("test"), s("filter")],
    };
    exact(V311, &bytes, Packet::Unsubscribe(unsub));
}

#[test]
fn unsuback_v311() {
    exact(
        V311,
        &[0xB0, 0x02, 0x43, 0x21],
        Packet::UnsubAck(UnsubAck {
            packet_id: 0x4321,
            ..Default::default()
        }),
    );
    let with_codes = UnsubAck {
        packet_id: 1,
        reason_codes: vec![ReasonCode::SUCCESS],
        ..Default::default()
    };
    assert_eq!(
        &encode(V311, &Packet::UnsubAck(with_codes))[..],
        &[0xB0, 0x02, 0x00, 0x01]
    );
}

#[test]
fn subscribe_v311_drops_v5_options() {
    let sub = Subscribe {
        packet_id: 1,
        subscription_identifier: Some(5),
        user_properties: vec![up("k", "v")],
        filters: vec![(
            s("a"),
            SubscriptionOptions {
                qos: QoS::AtLeastOnce,
                no_local: true,
                ..Default::default()
            },
        )],
    };
    assert_eq!(
        &encode(V311, &Packet::Subscribe(sub))[..],
        &[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x01]
    );
}
