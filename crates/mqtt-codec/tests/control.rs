//! PINGREQ, PINGRESP, DISCONNECT and AUTH, exact bytes in both versions; the success
//! acknowledgement written without a packet.

mod common;

use common::*;
use statehub_mqtt_codec::*;

#[test]
fn ping_both_versions() {
    for v in [V311, V5] {
        exact(v, &[0xC0, 0x00], Packet::PingReq);
        exact(v, &[0xD0, 0x00], Packet::PingResp);
    }
}

#[test]
fn disconnect_v5_short_form() {
    exact(V5, &[0xE0, 0x00], Packet::Disconnect(Disconnect::default()));
}

#[test]
fn disconnect_v5_with_session_expiry_and_reason_string() {
    let bytes = [
        0xE0, 0x12, // DISCONNECT, remaining length 18
        0x04, // disconnect with will message
        0x10, // property length 16
        0x11, 0x00, 0x00, 0x0E, 0x10, // session expiry interval 3600
        0x1C, 0x00, 0x02, b's', b'r', // server reference
        0x1F, 0x00, 0x03, b'b', b'y', b'e', // reason string
    ];
    let d = Disconnect {
        reason_code: ReasonCode::DISCONNECT_WITH_WILL,
        session_expiry_interval: Some(3600),
        reason_string: Some(s("bye")),
        user_properties: vec![],
        server_reference: Some(s("sr")),
    };
    exact(V5, &bytes, Packet::Disconnect(d));
}

#[test]
fn disconnect_v5_user_properties() {
    let bytes = [
        0xE0, 0x10, 0x8E, 0x0E, // session taken over, property length 14
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'1', // user property
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'2', // same name again
    ];
    let d = Disconnect {
        reason_code: ReasonCode::SESSION_TAKEN_OVER,
        user_properties: vec![up("k", "1"), up("k", "2")],
        ..Default::default()
    };
    exact(V5, &bytes, Packet::Disconnect(d));
}

#[test]
fn disconnect_v5_reason_code_only() {
    let d = Disconnect::with_reason(ReasonCode::SESSION_TAKEN_OVER);
    exact(V5, &[0xE0, 0x02, 0x8E, 0x00], Packet::Disconnect(d.clone()));
    decodes_to(V5, &[0xE0, 0x01, 0x8E], Packet::Disconnect(d));
}

#[test]
fn disconnect_v311() {
    exact(
        V311,
        &[0xE0, 0x00],
        Packet::Disconnect(Disconnect::default()),
    );
    let d = Disconnect {
        session_expiry_interval: Some(5),
        ..Disconnect::with_reason(ReasonCode::SERVER_BUSY)
    };
    assert_eq!(&encode(V311, &Packet::Disconnect(d))[..], &[0xE0, 0x00]);
}

#[test]
fn auth_v5() {
    let bytes = [
        0xF0, 0x1A, // AUTH, remaining length 26
        0x18, // continue authentication
        0x18, // property length 24
        0x15, 0x00, 0x04, b'S', b'C', b'R', b'M', // authentication method
        0x16, 0x00, 0x02, 0x01, 0x02, // authentication data
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property
        0x1F, 0x00, 0x02, b'o', b'k', // reason string
    ];
    let auth = Auth {
        reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
        authentication_method: Some(s("SCRM")),
        authentication_data: Some(b(&[1, 2])),
        reason_string: Some(s("ok")),
        user_properties: vec![up("k", "v")],
    };
    exact(V5, &bytes, Packet::Auth(auth));
    exact(V5, &[0xF0, 0x00], Packet::Auth(Auth::default()));
}

#[test]
fn auth_is_not_in_v311() {
    let mut out = bytes::BytesMut::new();
    let err = Codec::with_version(V311, 0).encode(&Packet::Auth(Auth::default()), &mut out);
    assert_eq!(err, Err(EncodeError::NotInV311));
    assert!(out.is_empty());
    rejects_with(
        &mut Codec::with_version(V311, 0),
        &[0xF0, 0x00],
        malformed("MQTT-2.1.2"),
        ReasonCode::MALFORMED_PACKET,
    );
}

#[test]
fn encode_needs_a_version() {
    let mut out = bytes::BytesMut::new();
    let err = Codec::new_server(0).encode(&Packet::PingResp, &mut out);
    assert_eq!(err, Err(EncodeError::NoVersion));
}

#[test]
fn several_packets_in_one_buffer() {
    let mut codec = Codec::with_version(V5, 0);
    let mut buf = bytes::BytesMut::from(&[0xC0, 0x00, 0x40, 0x02, 0x00, 0x01, 0xE0][..]);
    assert_eq!(codec.decode(&mut buf), Ok(Some(Packet::PingReq)));
    assert_eq!(
        codec.decode(&mut buf),
        Ok(Some(Packet::PubAck(PubResponse::ok(1))))
    );
    assert_eq!(codec.decode(&mut buf), Ok(None));
    assert_eq!(&buf[..], &[0xE0]);
    buf.extend_from_slice(&[0x00]);
    assert_eq!(
        codec.decode(&mut buf),
        Ok(Some(Packet::Disconnect(Disconnect::default())))
    );
    assert!(buf.is_empty());
}

#[test]
fn a_success_ack_without_a_packet_is_the_packet_s_bytes() {
    use bytes::BytesMut;
    for v in [V311, V5] {
        let codec = Codec::with_version(v, 0);
        for (qos, packet) in [
            (QoS::AtLeastOnce, Packet::PubAck(PubResponse::ok(0x1234))),
            (QoS::ExactlyOnce, Packet::PubRec(PubResponse::ok(0x1234))),
        ] {
            let (mut direct, mut encoded) = (BytesMut::new(), BytesMut::new());
            codec.encode_success_ack(qos, 0x1234, &mut direct).unwrap();
            codec.encode(&packet, &mut encoded).unwrap();
            assert_eq!(direct, encoded, "{v:?} {qos:?}");
            assert_eq!(direct.len(), 4);
        }
        let mut dst = BytesMut::new();
        assert!(codec
            .encode_success_ack(QoS::AtMostOnce, 1, &mut dst)
            .is_err());
        assert!(codec
            .encode_success_ack(QoS::AtLeastOnce, 0, &mut dst)
            .is_err());
        assert!(dst.is_empty());
    }
    let unversioned = Codec::new_server(0);
    let mut dst = BytesMut::new();
    assert!(matches!(
        unversioned.encode_success_ack(QoS::AtLeastOnce, 1, &mut dst),
        Err(EncodeError::NoVersion)
    ));
}
