//! Bad input: each case must give the expected error and reason code.

mod common;

use common::*;
use statehub_mqtt_codec::*;

const MALFORMED: ReasonCode = ReasonCode::MALFORMED_PACKET;
const PROTOCOL: ReasonCode = ReasonCode::PROTOCOL_ERROR;

fn v5() -> Codec {
    Codec::with_version(V5, 0)
}

fn v311() -> Codec {
    Codec::with_version(V311, 0)
}

/// A server codec that has already accepted an MQTT 5 CONNECT.
fn v5_server() -> Codec {
    let mut codec = Codec::new_server(0);
    let connect = [
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    assert!(matches!(
        decode_one(&mut codec, &connect),
        Ok(Some(Packet::Connect(_)))
    ));
    codec
}

#[test]
fn wrong_reserved_flags() {
    for bytes in [
        &[0x41, 0x02, 0x00, 0x01][..], // PUBACK with flags 1
        &[0x60, 0x02, 0x00, 0x01],     // PUBREL without its 0b0010
        &[0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x00], // SUBSCRIBE without its 0b0010
        &[0xC1, 0x00],                 // PINGREQ with flags 1
        &[0xE8, 0x00],                 // DISCONNECT with flags 8
    ] {
        rejects_with(&mut v5(), bytes, malformed("MQTT-2.1.3-1"), MALFORMED);
        rejects_with(&mut v311(), bytes, malformed("MQTT-2.1.3-1"), MALFORMED);
    }
    // Checked from the first two bytes, before the body arrives.
    rejects_with(
        &mut v5(),
        &[0x41, 0x02],
        malformed("MQTT-2.1.3-1"),
        MALFORMED,
    );
    rejects_with(
        &mut Codec::new_server(0),
        &[0x11, 0x00],
        malformed("MQTT-2.1.3-1"),
        MALFORMED,
    );
}

#[test]
fn bad_remaining_length() {
    for codec in [v5(), v311(), Codec::new_server(0)] {
        let mut codec = codec;
        let first = if codec.version().is_some() {
            0x30
        } else {
            0x10
        };
        rejects_with(
            &mut codec,
            &[first, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F],
            malformed("MQTT-1.5.5-1"),
            MALFORMED,
        );
    }
    rejects_with(
        &mut v5(),
        &[0x30, 0x80, 0x80, 0x80, 0x80],
        malformed("MQTT-1.5.5-1"),
        MALFORMED,
    );
    // Not in the shortest form.
    rejects_with(
        &mut v5(),
        &[0xC0, 0x80, 0x00],
        malformed("MQTT-1.5.5-1"),
        MALFORMED,
    );
}

#[test]
fn invalid_utf8_topic() {
    let v5_bytes = [0x30, 0x05, 0x00, 0x02, 0xC3, 0x28, 0x00];
    rejects(&mut v5(), &v5_bytes, DecodeError::InvalidUtf8, MALFORMED);
    rejects(
        &mut v311(),
        &[0x30, 0x04, 0x00, 0x02, 0xFF, 0xFE],
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    rejects(
        &mut v311(),
        &[0x30, 0x04, 0x00, 0x02, b'a', 0x00],
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    // Invalid UTF-8 in a field rmqtt-codec decodes (an UNSUBSCRIBE filter).
    rejects(
        &mut v311(),
        &[0xA2, 0x05, 0x00, 0x01, 0x00, 0x01, 0xFF],
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
}

#[test]
fn qos_3() {
    for mut codec in [v5(), v311()] {
        // Refused from the fixed header alone.
        rejects_with(
            &mut codec,
            &[0x36, 0x05],
            malformed("MQTT-3.3.1-4"),
            MALFORMED,
        );
    }
    // Will QoS 3 in CONNECT.
    let connect = [
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x1E, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    rejects_with(
        &mut Codec::new_server(0),
        &connect,
        malformed("MQTT-3.1.2-12"),
        MALFORMED,
    );
    // Subscription QoS 3 in a 3.1.1 SUBSCRIBE.
    rejects_with(
        &mut v311(),
        &[0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b'a', 0x03],
        malformed("MQTT-3.8.3-4"),
        MALFORMED,
    );
}

#[test]
fn oversize_refused_before_the_body_arrives() {
    let too_large =
        |size, max| move |e: &DecodeError| *e == DecodeError::PacketTooLarge { size, max };
    // A peer announcing ~200 MB: refused on the 5 header bytes.
    let mut server = Codec::new_server(1024);
    rejects_with(
        &mut server,
        &[0x10, 0x80, 0x80, 0x80, 0x60],
        too_large(201_326_597, 1024),
        ReasonCode::PACKET_TOO_LARGE,
    );
    // The limit counts the whole packet: 2 header bytes + 99 = 101 > 100.
    rejects_with(
        &mut Codec::with_version(V5, 100),
        &[0x30, 0x63],
        too_large(101, 100),
        ReasonCode::PACKET_TOO_LARGE,
    );
    let mut exactly = Codec::with_version(V5, 100);
    assert_eq!(decode_one(&mut exactly, &[0x30, 0x62, 0x00]), Ok(None));
    let mut raised = Codec::with_version(V311, 4);
    raised.set_max_incoming_packet_size(0);
    assert_eq!(decode_one(&mut raised, &[0x30, 0x62]), Ok(None));
}

#[test]
fn first_packet_not_connect() {
    for bytes in [
        &[0x30, 0x00][..],
        &[0xC0, 0x00],
        &[0x82],
        &[0x20, 0x02, 0x00, 0x00],
    ] {
        rejects(
            &mut Codec::new_server(0),
            bytes,
            DecodeError::ExpectedConnect,
            PROTOCOL,
        );
    }
}

#[test]
fn unknown_protocol_level() {
    let mut server = Codec::new_server(0);
    // Refused as soon as the level byte arrives.
    let partial = [0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x06];
    rejects(
        &mut server,
        &partial,
        DecodeError::UnsupportedProtocolVersion(6),
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
    );
    assert_eq!(server.version(), None);
    let level3_as_mqtt = [
        0x10, 0x0A, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x03, 0x02, 0x00, 0x00,
    ];
    let err = DecodeError::UnsupportedProtocolVersion(3);
    rejects(
        &mut Codec::new_server(0),
        &level3_as_mqtt,
        err,
        ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
    );
    let bad_name = [0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'X', 0x04];
    rejects_with(
        &mut Codec::new_server(0),
        &bad_name,
        protocol("MQTT-3.1.2-1"),
        PROTOCOL,
    );
}

#[test]
fn bad_connect_flags() {
    let connect = |flags: u8| {
        [
            0x10, 0x0C, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, flags, 0x00, 0x00, 0x00, 0x00,
        ]
    };
    rejects_with(
        &mut Codec::new_server(0),
        &connect(0x03),
        malformed("MQTT-3.1.2-3"),
        MALFORMED,
    );
    rejects_with(
        &mut Codec::new_server(0),
        &connect(0x22),
        malformed("MQTT-3.1.2-11"),
        MALFORMED,
    );
    rejects_with(
        &mut Codec::new_server(0),
        &connect(0x42),
        malformed("MQTT-3.1.2-22"),
        MALFORMED,
    );
    // 3.1.1: empty client id without clean session → CONNACK return code 2.
    let mut server = Codec::new_server(0);
    rejects_with(
        &mut server,
        &connect(0x00),
        protocol("MQTT-3.1.3-8"),
        ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
    );
    // The version is known, so the refusal can be encoded.
    assert_eq!(server.version(), Some(V311));
}

#[test]
fn packet_id_zero() {
    rejects_with(
        &mut v5(),
        &[0x40, 0x02, 0x00, 0x00],
        protocol("MQTT-2.2.1-3"),
        PROTOCOL,
    );
    rejects_with(
        &mut v311(),
        &[0x82, 0x06, 0x00, 0x00, 0x00, 0x01, b'a', 0x00],
        protocol("MQTT-2.2.1-3"),
        PROTOCOL,
    );
    rejects_with(
        &mut v5(),
        &[0x32, 0x06, 0x00, 0x01, b't', 0x00, 0x00, 0x00],
        protocol("MQTT-2.2.1-3"),
        PROTOCOL,
    );
}

#[test]
fn publish_checks() {
    // Topic Alias 0.
    let alias0 = [0x30, 0x08, 0x00, 0x01, b't', 0x03, 0x23, 0x00, 0x00, b'x'];
    rejects_with(
        &mut v5(),
        &alias0,
        protocol("MQTT-3.3.2-8"),
        ReasonCode::TOPIC_ALIAS_INVALID,
    );
    // Subscription Identifier from a client, on a server codec only.
    let with_sub_id = [0x30, 0x06, 0x00, 0x01, b't', 0x02, 0x0B, 0x01];
    rejects_with(
        &mut v5_server(),
        &with_sub_id,
        protocol("MQTT-3.3.4-6"),
        PROTOCOL,
    );
    assert!(matches!(
        decode_one(&mut v5(), &with_sub_id),
        Ok(Some(Packet::Publish(_)))
    ));
    // Wildcards in a topic name, empty topic without an alias.
    rejects_with(
        &mut v311(),
        &[0x30, 0x05, 0x00, 0x03, b'a', b'/', b'+'],
        protocol("MQTT-3.3.2-2"),
        ReasonCode::TOPIC_NAME_INVALID,
    );
    rejects_with(
        &mut v5_server(),
        &[0x30, 0x06, 0x00, 0x03, b'a', b'/', b'#', 0x00],
        protocol("MQTT-3.3.2-2"),
        ReasonCode::TOPIC_NAME_INVALID,
    );
    rejects_with(
        &mut v5(),
        &[0x30, 0x03, 0x00, 0x00, 0x00],
        protocol("MQTT-4.7.3-1"),
        PROTOCOL,
    );
    // DUP on QoS 0.
    rejects_with(
        &mut v5(),
        &[0x38, 0x04, 0x00, 0x01, b't', 0x00],
        malformed("MQTT-3.3.1-2"),
        MALFORMED,
    );
    // Duplicated property.
    let twice = [
        0x30, 0x0B, 0x00, 0x01, b't', 0x06, 0x23, 0x00, 0x01, 0x23, 0x00, 0x02, b'x',
    ];
    rejects_with(&mut v5(), &twice, protocol("MQTT-2.2.2"), PROTOCOL);
    // Property length running past the packet.
    rejects_with(
        &mut v5(),
        &[0x30, 0x04, 0x00, 0x01, b't', 0x09],
        malformed("MQTT-3.3.2"),
        MALFORMED,
    );
}

#[test]
fn bad_properties_in_delegated_packets() {
    // CONNACK with a PUBLISH-only property (Topic Alias).
    rejects_with(
        &mut v5(),
        &[0x20, 0x06, 0x00, 0x00, 0x03, 0x23, 0x00, 0x01],
        malformed("MQTT-3.2.2"),
        MALFORMED,
    );
    // SUBSCRIBE with reserved option bits set.
    rejects_with(
        &mut v5(),
        &[0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b'a', 0xC0],
        malformed("MQTT-3.8.3"),
        MALFORMED,
    );
    // SUBSCRIBE without filters.
    rejects_with(
        &mut v5(),
        &[0x82, 0x03, 0x00, 0x01, 0x00],
        protocol("MQTT-3.8.3-2"),
        PROTOCOL,
    );
    // DISCONNECT with an unknown reason code.
    rejects_with(
        &mut v5(),
        &[0xE0, 0x01, 0x03],
        malformed("MQTT-3.14.2"),
        MALFORMED,
    );
    // PINGREQ with a body.
    rejects_with(
        &mut v5(),
        &[0xC0, 0x01, 0x00],
        malformed("MQTT-3.12.1"),
        MALFORMED,
    );
    // PUBACK whose body is too short.
    rejects_with(
        &mut v311(),
        &[0x40, 0x01, 0x01],
        malformed("MQTT-2.1.4"),
        MALFORMED,
    );
}

#[test]
fn reserved_packet_type_zero() {
    rejects_with(&mut v5(), &[0x00, 0x00], malformed("MQTT-2.1.2"), MALFORMED);
}

#[test]
fn null_character_in_strings() {
    // UNSUBSCRIBE filter "a\0" (decoded by rmqtt-codec, checked afterwards).
    rejects(
        &mut v311(),
        &[0xA2, 0x06, 0x00, 0x01, 0x00, 0x02, b'a', 0x00],
        DecodeError::InvalidUtf8,
        MALFORMED,
    );
    // MQTT 5 user property value with U+0000 in a PUBACK.
    let puback = [
        0x40, 0x0B, 0x00, 0x01, 0x00, 0x07, 0x26, 0x00, 0x01, b'k', 0x00, 0x01, 0x00,
    ];
    rejects(&mut v5(), &puback, DecodeError::InvalidUtf8, MALFORMED);
    // A zero byte in a binary field (password) is fine.
    let connect = [
        0x10, 0x13, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0xC2, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x01, b'u', 0x00, 0x01, 0x00,
    ];
    assert!(matches!(
        decode_one(&mut Codec::new_server(0), &connect),
        Ok(Some(Packet::Connect(_)))
    ));
}
