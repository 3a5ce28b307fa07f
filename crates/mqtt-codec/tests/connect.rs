//! CONNECT and CONNACK, exact bytes in both versions, and version negotiation.

mod common;

use common::*;
use statehub_mqtt_codec::*;

/// MQTT 5 CONNECT with every CONNECT property and a will with every will property.
const CONNECT_V5_FULL: &[u8] = &[
    0x10, 0x7A, // CONNECT, remaining length 122
    0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, // protocol name, level 5
    0xEE, // user name, password, will retain, will QoS 1, will, clean start
    0x00, 0x3C, // keep alive 60
    0x2E, // property length 46
    0x11, 0x00, 0x00, 0x00, 0x78, // session expiry interval 120
    0x15, 0x00, 0x04, b'S', b'C', b'R', b'M', // authentication method
    0x16, 0x00, 0x02, 0x01, 0x02, // authentication data
    0x17, 0x00, // request problem information 0
    0x19, 0x01, // request response information 1
    0x21, 0x00, 0x0A, // receive maximum 10
    0x27, 0x00, 0x00, 0x10, 0x00, // maximum packet size 4096
    0x22, 0x00, 0x05, // topic alias maximum 5
    0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property k=v
    0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'w', // user property k=w (same name, kept)
    0x00, 0x03, b'c', b'i', b'd', // client id
    0x25, // will property length 37
    0x18, 0x00, 0x00, 0x00, 0x0A, // will delay interval 10
    0x01, 0x01, // payload format indicator: UTF-8
    0x02, 0x00, 0x00, 0x00, 0x3C, // message expiry interval 60
    0x03, 0x00, 0x04, b't', b'e', b'x', b't', // content type
    0x08, 0x00, 0x03, b'r', b'/', b't', // response topic
    0x09, 0x00, 0x02, 0x0A, 0x0B, // correlation data
    0x26, 0x00, 0x01, b'a', 0x00, 0x01, b'b', // will user property
    0x00, 0x03, b'w', b'/', b't', // will topic
    0x00, 0x03, b'b', b'y', b'e', // will payload
    0x00, 0x04, b'u', b's', b'e', b'r', // user name
    0x00, 0x04, b'p', b'a', b's', b's', // password
];

fn connect_v5_full() -> Packet {
    Packet::Connect(Box::new(Connect {
        protocol: V5,
        clean_start: true,
        keep_alive: 60,
        client_id: s("cid"),
        username: Some(s("user")),
        password: Some(b(b"pass")),
        will: Some(LastWill {
            qos: QoS::AtLeastOnce,
            retain: true,
            topic: s("w/t"),
            payload: b(b"bye"),
            properties: WillProperties {
                will_delay_interval: Some(10),
                payload_format_utf8: true,
                message_expiry_interval: Some(60),
                content_type: Some(s("text")),
                response_topic: Some(s("r/t")),
                correlation_data: Some(b(&[0x0A, 0x0B])),
                user_properties: vec![up("a", "b")],
            },
        }),
        properties: ConnectProperties {
            session_expiry_interval: Some(120),
            receive_maximum: Some(10),
            maximum_packet_size: Some(4096),
            topic_alias_maximum: Some(5),
            request_response_information: Some(true),
            request_problem_information: Some(false),
            user_properties: vec![up("k", "v"), up("k", "w")],
            authentication_method: Some(s("SCRM")),
            authentication_data: Some(b(&[1, 2])),
        },
    }))
}

const CONNECT_V311_FULL: &[u8] = &[
    0x10, 0x25, // CONNECT, remaining length 37
    0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, // protocol name, level 4
    0xF6, // user name, password, will retain, will QoS 2, will, clean session
    0x00, 0x0A, // keep alive 10
    0x00, 0x03, b'c', b'i', b'd', // client id
    0x00, 0x03, b'w', b'/', b't', // will topic
    0x00, 0x03, b'b', b'y', b'e', // will message
    0x00, 0x04, b'u', b's', b'e', b'r', // user name
    0x00, 0x04, b'p', b'a', b's', b's', // password
];

fn connect_v311_full() -> Packet {
    Packet::Connect(Box::new(Connect {
        protocol: V311,
        clean_start: true,
        keep_alive: 10,
        client_id: s("cid"),
        username: Some(s("user")),
        password: Some(b(b"pass")),
        will: Some(LastWill {
            qos: QoS::ExactlyOnce,
            retain: true,
            topic: s("w/t"),
            payload: b(b"bye"),
            properties: WillProperties::default(),
        }),
        properties: ConnectProperties::default(),
    }))
}

#[test]
fn connect_v5_every_property() {
    exact(V5, CONNECT_V5_FULL, connect_v5_full());
}

#[test]
fn connect_v311_with_will() {
    exact(V311, CONNECT_V311_FULL, connect_v311_full());
}

#[test]
fn server_negotiates_v5_from_connect() {
    let mut codec = Codec::new_server(0);
    assert_eq!(codec.version(), None);
    assert_eq!(
        decode_one(&mut codec, CONNECT_V5_FULL),
        Ok(Some(connect_v5_full()))
    );
    assert_eq!(codec.version(), Some(V5));
    assert_prefixes_incomplete(|| Codec::new_server(0), CONNECT_V5_FULL);
    // After CONNECT it speaks MQTT 5: a PUBACK with a reason code decodes.
    let ack = decode_one(&mut codec, &[0x40, 0x03, 0x00, 0x01, 0x10])
        .unwrap()
        .unwrap();
    assert_eq!(
        ack,
        Packet::PubAck(PubResponse {
            reason_code: ReasonCode(0x10),
            ..PubResponse::ok(1)
        })
    );
}

#[test]
fn server_negotiates_v311_from_connect() {
    let mut codec = Codec::new_server(0);
    assert_eq!(
        decode_one(&mut codec, CONNECT_V311_FULL),
        Ok(Some(connect_v311_full()))
    );
    assert_eq!(codec.version(), Some(V311));
    assert_prefixes_incomplete(|| Codec::new_server(0), CONNECT_V311_FULL);
    let mut out = bytes::BytesMut::new();
    codec
        .encode(&Packet::ConnAck(ConnAck::default()), &mut out)
        .unwrap();
    assert_eq!(&out[..], &[0x20, 0x02, 0x00, 0x00]);
}

#[test]
fn server_maps_mqtt_31_to_v311() {
    let bytes = [
        0x10, 0x11, 0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p', 0x03, 0x02, 0x00, 0x3C, 0x00,
        0x03, b'c', b'i', b'd',
    ];
    let mut codec = Codec::new_server(0);
    let Some(Packet::Connect(c)) = decode_one(&mut codec, &bytes).unwrap() else {
        panic!("not CONNECT")
    };
    assert_eq!(
        (
            c.protocol,
            c.clean_start,
            c.keep_alive,
            c.client_id.as_ref()
        ),
        (V311, true, 60, "cid")
    );
    assert_eq!(codec.version(), Some(V311));
}

#[test]
fn v5_empty_client_id_without_clean_start_is_allowed() {
    let bytes = [
        0x10, 0x0D, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let expected = Packet::Connect(Box::new(Connect {
        protocol: V5,
        clean_start: false,
        keep_alive: 0,
        client_id: s(""),
        username: None,
        password: None,
        will: None,
        properties: ConnectProperties::default(),
    }));
    exact(V5, &bytes, expected.clone());
    assert_eq!(
        decode_one(&mut Codec::new_server(0), &bytes),
        Ok(Some(expected))
    );
}

const CONNACK_V5_FULL: &[u8] = &[
    0x20, 0x47, // CONNACK, remaining length 71
    0x01, 0x00, // session present, success
    0x44, // property length 68
    0x11, 0x00, 0x00, 0x00, 0x1E, // session expiry interval 30
    0x21, 0x00, 0x14, // receive maximum 20
    0x24, 0x01, // maximum QoS 1
    0x25, 0x00, // retain available 0
    0x27, 0x00, 0x01, 0x00, 0x00, // maximum packet size 65536
    0x12, 0x00, 0x03, b'a', b'b', b'c', // assigned client identifier
    0x22, 0x00, 0x08, // topic alias maximum 8
    0x28, 0x00, // wildcard subscription available 0
    0x29, 0x00, // subscription identifiers available 0
    0x2A, 0x00, // shared subscription available 0
    0x13, 0x00, 0x3C, // server keep alive 60
    0x1A, 0x00, 0x02, b'r', b'i', // response information
    0x1C, 0x00, 0x02, b's', b'r', // server reference
    0x15, 0x00, 0x04, b'S', b'C', b'R', b'M', // authentication method
    0x16, 0x00, 0x01, 0xFF, // authentication data
    0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property
    0x1F, 0x00, 0x02, b'o', b'k', // reason string
];

#[test]
fn connack_v5_every_property() {
    let ack = ConnAck {
        session_present: true,
        reason_code: ReasonCode::SUCCESS,
        properties: ConnAckProperties {
            session_expiry_interval: Some(30),
            receive_maximum: Some(20),
            maximum_qos: Some(QoS::AtLeastOnce),
            retain_available: Some(false),
            maximum_packet_size: Some(65536),
            assigned_client_identifier: Some(s("abc")),
            topic_alias_maximum: Some(8),
            reason_string: Some(s("ok")),
            user_properties: vec![up("k", "v")],
            wildcard_subscription_available: Some(false),
            subscription_identifiers_available: Some(false),
            shared_subscription_available: Some(false),
            server_keep_alive: Some(60),
            response_information: Some(s("ri")),
            server_reference: Some(s("sr")),
            authentication_method: Some(s("SCRM")),
            authentication_data: Some(b(&[0xFF])),
        },
    };
    exact(V5, CONNACK_V5_FULL, Packet::ConnAck(ack));
}

#[test]
fn connack_v5_refusal() {
    let ack = ConnAck {
        reason_code: ReasonCode::NOT_AUTHORIZED,
        ..Default::default()
    };
    exact(V5, &[0x20, 0x03, 0x00, 0x87, 0x00], Packet::ConnAck(ack));
}

#[test]
fn connack_v311() {
    exact(
        V311,
        &[0x20, 0x02, 0x01, 0x00],
        Packet::ConnAck(ConnAck {
            session_present: true,
            ..Default::default()
        }),
    );
    let refused = ConnAck {
        reason_code: ReasonCode::BAD_USER_NAME_OR_PASSWORD,
        ..Default::default()
    };
    exact(V311, &[0x20, 0x02, 0x00, 0x04], Packet::ConnAck(refused));
}

/// Found by the `mqtt_codec` fuzz target: a reserved return code decoded as
/// Unspecified error, which encodes as return code 3 (Server unavailable).
#[test]
fn connack_v311_reserved_return_code() {
    for ret in [6, 0x80, 0xFF] {
        rejects_with(
            &mut Codec::with_version(V311, 0),
            &[0x20, 0x02, 0x00, ret],
            malformed("MQTT-3.2.2.3"),
            ReasonCode::MALFORMED_PACKET,
        );
    }
}

#[test]
fn connack_v311_return_code_mapping() {
    let cases = [
        (ReasonCode::SUCCESS, 0),
        (ReasonCode::UNSUPPORTED_PROTOCOL_VERSION, 1),
        (ReasonCode::CLIENT_IDENTIFIER_NOT_VALID, 2),
        (ReasonCode::SERVER_UNAVAILABLE, 3),
        (ReasonCode::SERVER_BUSY, 3),
        (ReasonCode::UNSPECIFIED_ERROR, 3),
        (ReasonCode::BANNED, 3),
        (ReasonCode::BAD_USER_NAME_OR_PASSWORD, 4),
        (ReasonCode::NOT_AUTHORIZED, 5),
    ];
    for (rc, ret) in cases {
        let ack = ConnAck {
            reason_code: rc,
            properties: ConnAckProperties {
                reason_string: Some(s("dropped")),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            &encode(V311, &Packet::ConnAck(ack))[..],
            &[0x20, 0x02, 0x00, ret],
            "{rc:?}"
        );
    }
}
