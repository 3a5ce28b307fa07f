//! PUBLISH and its acknowledgements (PUBACK, PUBREC, PUBREL, PUBCOMP), exact bytes.

mod common;

use common::*;
use statehub_mqtt_codec::*;

const PUBLISH_V5_FULL: &[u8] = &[
    0x3B, 0x39, // PUBLISH dup, QoS 1, retain; remaining length 57
    0x00, 0x03, b'a', b'/', b'b', // topic
    0x00, 0x0A, // packet id 10
    0x2F, // property length 47
    0x01, 0x01, // payload format indicator
    0x02, 0x00, 0x00, 0x00, 0x64, // message expiry interval 100
    0x03, 0x00, 0x04, b't', b'e', b'x', b't', // content type
    0x08, 0x00, 0x03, b'r', b'/', b't', // response topic
    0x09, 0x00, 0x02, 0x0A, 0x0B, // correlation data
    0x0B, 0x05, // subscription identifier 5
    0x0B, 0x80, 0x01, // subscription identifier 128
    0x23, 0x00, 0x07, // topic alias 7
    0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property k=v
    0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'w', // user property k=w
    b'h', b'i', // payload
];

fn publish_v5_full() -> Publish {
    Publish {
        dup: true,
        qos: QoS::AtLeastOnce,
        retain: true,
        topic: s("a/b"),
        packet_id: Some(10),
        payload: b(b"hi"),
        properties: PublishProperties {
            payload_format_utf8: true,
            message_expiry_interval: Some(100),
            topic_alias: Some(7),
            response_topic: Some(s("r/t")),
            correlation_data: Some(b(&[0x0A, 0x0B])),
            user_properties: vec![up("k", "v"), up("k", "w")],
            subscription_identifiers: vec![5, 128],
            content_type: Some(s("text")),
        },
    }
}

#[test]
fn publish_v5_every_property() {
    exact(V5, PUBLISH_V5_FULL, Packet::Publish(publish_v5_full()));
}

#[test]
fn publish_v5_user_property_order_is_kept() {
    let Some(Packet::Publish(p)) =
        decode_one(&mut Codec::with_version(V5, 0), PUBLISH_V5_FULL).unwrap()
    else {
        panic!("not PUBLISH")
    };
    assert_eq!(
        p.properties.user_properties,
        vec![up("k", "v"), up("k", "w")]
    );
}

#[test]
fn publish_v5_qos0_minimal() {
    let p = Publish {
        topic: s("a/b"),
        payload: b(b"x"),
        ..Default::default()
    };
    exact(
        V5,
        &[0x30, 0x07, 0x00, 0x03, b'a', b'/', b'b', 0x00, b'x'],
        Packet::Publish(p),
    );
}

#[test]
fn publish_v5_topic_alias_only() {
    let p = Publish {
        qos: QoS::AtLeastOnce,
        packet_id: Some(1),
        payload: b(b"p"),
        properties: PublishProperties {
            topic_alias: Some(7),
            ..Default::default()
        },
        ..Default::default()
    };
    exact(
        V5,
        &[
            0x32, 0x09, 0x00, 0x00, 0x00, 0x01, 0x03, 0x23, 0x00, 0x07, b'p',
        ],
        Packet::Publish(p),
    );
}

#[test]
fn publish_v5_message_expiry_zero() {
    // rmqtt-codec refuses this (NonZeroU32); it is legal on the wire.
    let p = Publish {
        topic: s("a/b"),
        payload: b(b"x"),
        properties: PublishProperties {
            message_expiry_interval: Some(0),
            ..Default::default()
        },
        ..Default::default()
    };
    let bytes = [
        0x30, 0x0C, 0x00, 0x03, b'a', b'/', b'b', 0x05, 0x02, 0x00, 0x00, 0x00, 0x00, b'x',
    ];
    exact(V5, &bytes, Packet::Publish(p));
}

#[test]
fn publish_v5_empty_payload() {
    let p = Publish {
        qos: QoS::ExactlyOnce,
        topic: s("t"),
        packet_id: Some(0xFFFF),
        ..Default::default()
    };
    exact(
        V5,
        &[0x34, 0x06, 0x00, 0x01, b't', 0xFF, 0xFF, 0x00],
        Packet::Publish(p),
    );
}

#[test]
fn publish_v311() {
    let p = Publish {
        dup: true,
        qos: QoS::ExactlyOnce,
        retain: true,
        topic: s("topic"),
        packet_id: Some(0x4321),
        payload: b(b"data"),
        properties: PublishProperties::default(),
    };
    let bytes = [
        0x3D, 0x0D, 0x00, 0x05, b't', b'o', b'p', b'i', b'c', 0x43, 0x21, b'd', b'a', b't', b'a',
    ];
    exact(V311, &bytes, Packet::Publish(p));
    let p0 = Publish {
        topic: s("topic"),
        payload: b(b"data"),
        ..Default::default()
    };
    exact(
        V311,
        &[
            0x30, 0x0B, 0x00, 0x05, b't', b'o', b'p', b'i', b'c', b'd', b'a', b't', b'a',
        ],
        Packet::Publish(p0),
    );
}

#[test]
fn publish_v311_drops_properties() {
    let mut p = publish_v5_full();
    p.properties.topic_alias = None;
    let out = encode(V311, &Packet::Publish(p));
    assert_eq!(
        hex(&out),
        hex(&[0x3B, 0x09, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i'])
    );
}

#[test]
fn publish_encode_rejects_inconsistent_packets() {
    let mut out = bytes::BytesMut::new();
    let codec = Codec::with_version(V5, 0);
    let no_id = Publish {
        qos: QoS::AtLeastOnce,
        topic: s("t"),
        ..Default::default()
    };
    assert!(codec.encode(&Packet::Publish(no_id), &mut out).is_err());
    let id_on_qos0 = Publish {
        topic: s("t"),
        packet_id: Some(1),
        ..Default::default()
    };
    assert!(codec
        .encode(&Packet::Publish(id_on_qos0), &mut out)
        .is_err());
    let empty_topic = Publish {
        topic: s(""),
        ..Default::default()
    };
    assert!(codec
        .encode(&Packet::Publish(empty_topic), &mut out)
        .is_err());
    assert!(out.is_empty());
}

#[test]
fn puback_family_short_form_v5() {
    exact(
        V5,
        &[0x40, 0x02, 0x00, 0x0A],
        Packet::PubAck(PubResponse::ok(10)),
    );
    exact(
        V5,
        &[0x50, 0x02, 0x00, 0x0A],
        Packet::PubRec(PubResponse::ok(10)),
    );
    exact(
        V5,
        &[0x62, 0x02, 0x00, 0x0A],
        Packet::PubRel(PubResponse::ok(10)),
    );
    exact(
        V5,
        &[0x70, 0x02, 0x00, 0x0A],
        Packet::PubComp(PubResponse::ok(10)),
    );
}

#[test]
fn puback_long_form_v5() {
    let ack = PubResponse {
        packet_id: 10,
        reason_code: ReasonCode::NO_MATCHING_SUBSCRIBERS,
        reason_string: Some(s("no")),
        user_properties: vec![up("k", "v")],
    };
    let bytes = [
        0x40, 0x10, 0x00, 0x0A, 0x10, // PUBACK, id 10, no matching subscribers
        0x0C, // property length 12
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property
        0x1F, 0x00, 0x02, b'n', b'o', // reason string
    ];
    exact(V5, &bytes, Packet::PubAck(ack));
}

#[test]
fn pubrec_pubrel_pubcomp_long_form_v5() {
    let rec = PubResponse {
        reason_code: ReasonCode::QUOTA_EXCEEDED,
        reason_string: Some(s("q")),
        ..PubResponse::ok(3)
    };
    exact(
        V5,
        &[0x50, 0x08, 0x00, 0x03, 0x97, 0x04, 0x1F, 0x00, 0x01, b'q'],
        Packet::PubRec(rec),
    );
    let rel = PubResponse {
        reason_code: ReasonCode::PACKET_IDENTIFIER_NOT_FOUND,
        ..PubResponse::ok(3)
    };
    let rel_props = PubResponse {
        user_properties: vec![up("a", "b")],
        ..rel.clone()
    };
    let rel_bytes = [
        0x62, 0x0B, 0x00, 0x03, 0x92, 0x07, 0x26, 0x00, 0x01, b'a', 0x00, 0x01, b'b',
    ];
    exact(V5, &rel_bytes, Packet::PubRel(rel_props));
    exact(
        V5,
        &[0x70, 0x04, 0x00, 0x03, 0x92, 0x00],
        Packet::PubComp(rel.clone()),
    );
    // Reason code without a property length (Remaining Length 3) is accepted too.
    decodes_to(V5, &[0x70, 0x03, 0x00, 0x03, 0x92], Packet::PubComp(rel));
}

#[test]
fn puback_family_v311() {
    exact(
        V311,
        &[0x40, 0x02, 0x00, 0x0A],
        Packet::PubAck(PubResponse::ok(10)),
    );
    exact(
        V311,
        &[0x50, 0x02, 0x00, 0x0A],
        Packet::PubRec(PubResponse::ok(10)),
    );
    exact(
        V311,
        &[0x62, 0x02, 0x00, 0x0A],
        Packet::PubRel(PubResponse::ok(10)),
    );
    exact(
        V311,
        &[0x70, 0x02, 0x00, 0x0A],
        Packet::PubComp(PubResponse::ok(10)),
    );
    let with_reason = PubResponse {
        reason_code: ReasonCode(0x80),
        reason_string: Some(s("x")),
        ..PubResponse::ok(10)
    };
    assert_eq!(
        &encode(V311, &Packet::PubAck(with_reason))[..],
        &[0x40, 0x02, 0x00, 0x0A]
    );
}

#[test]
fn payload_utf8_check() {
    let mut p = Publish {
        topic: s("t"),
        payload: b(&[0xC3, 0x28]),
        ..Default::default()
    };
    assert_eq!(validate::payload_utf8(&p), Ok(()));
    p.properties.payload_format_utf8 = true;
    assert_eq!(
        validate::payload_utf8(&p),
        Err(ReasonCode::PAYLOAD_FORMAT_INVALID)
    );
    p.payload = b("héllo".as_bytes());
    assert_eq!(validate::payload_utf8(&p), Ok(()));
}

#[test]
fn payload_is_not_copied() {
    let mut buf = bytes::BytesMut::from(PUBLISH_V5_FULL);
    let start = buf.as_ptr() as usize;
    let Some(Packet::Publish(p)) = Codec::with_version(V5, 0).decode(&mut buf).unwrap() else {
        panic!()
    };
    assert_eq!(
        p.payload.as_ptr() as usize,
        start + PUBLISH_V5_FULL.len() - 2
    );
}

/// A shared message written with another delivery's per-hop fields gives exactly the
/// bytes of the whole PUBLISH with those fields; the message's own per-hop fields are
/// ignored.
#[test]
fn publish_ref_overrides_the_per_hop_fields() {
    let full = publish_v5_full();
    let mut shared = full.properties.clone();
    shared.message_expiry_interval = Some(9_999);
    shared.topic_alias = Some(1);
    shared.subscription_identifiers = vec![77];
    let view = PublishRef {
        dup: full.dup,
        qos: full.qos,
        retain: full.retain,
        topic: &full.topic,
        packet_id: full.packet_id,
        payload: &full.payload,
        properties: &shared,
        message_expiry_interval: full.properties.message_expiry_interval,
        topic_alias: full.properties.topic_alias,
        subscription_identifiers: &full.properties.subscription_identifiers,
    };
    let codec = Codec::with_version(ProtocolVersion::V5, 0);
    let mut out = bytes::BytesMut::new();
    codec.encode_publish(&view, &mut out).unwrap();
    assert_eq!(&out[..], PUBLISH_V5_FULL);
    let alias_only = PublishRef { topic: "", ..view };
    assert!(codec
        .encode_publish(
            &PublishRef {
                topic_alias: None,
                ..alias_only
            },
            &mut out
        )
        .is_err());
    // A refused packet leaves the buffer as it was; the next is appended after it.
    assert_eq!(&out[..], PUBLISH_V5_FULL);
    codec.encode_publish(&view, &mut out).unwrap();
    assert_eq!(&out[..], [PUBLISH_V5_FULL, PUBLISH_V5_FULL].concat());
}
