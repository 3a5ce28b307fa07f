//! CONNECT bodies the codec refuses before rmqtt-codec sees them, exact bytes: what
//! comes after the payload, and properties the spec makes a Protocol Error (0x82)
//! rather than a Malformed Packet (0x81).

mod common;

use common::*;
use statehub_mqtt_codec::*;

const MALFORMED: ReasonCode = ReasonCode::MALFORMED_PACKET;
const PROTOCOL: ReasonCode = ReasonCode::PROTOCOL_ERROR;

/// An MQTT 5 CONNECT (clean start, keep alive 0, client id "c") with `props` as its
/// properties and `tail` after its payload.
fn v5_connect(props: &[u8], tail: &[u8]) -> Vec<u8> {
    let mut body = vec![
        0x00,
        0x04,
        b'M',
        b'Q',
        b'T',
        b'T',
        0x05, // protocol name, level 5
        0x02, // clean start
        0x00,
        0x00,              // keep alive 0
        props.len() as u8, // property length
    ];
    body.extend_from_slice(props);
    body.extend_from_slice(&[0x00, 0x01, b'c']); // client id "c"
    body.extend_from_slice(tail);
    let mut packet = vec![0x10, body.len() as u8]; // CONNECT, remaining length
    packet.extend(body);
    packet
}

#[test]
fn junk_after_the_payload_is_malformed() {
    let exact_bytes = [
        0x10, 0x0F, // CONNECT, remaining length 15
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, // protocol name, level 5
        0x02, // clean start
        0x00, 0x00, // keep alive 0
        0x00, // no properties
        0x00, 0x01, b'c', // client id "c"
        0xFF, // one byte nobody asked for
    ];
    assert_eq!(v5_connect(&[], &[0xFF]), exact_bytes);
    rejects_with(
        &mut Codec::new_server(0),
        &exact_bytes,
        malformed("MQTT-3.1.3"),
        MALFORMED,
    );
    // The same CONNECT without it is accepted.
    let mut server = Codec::new_server(0);
    let ok = v5_connect(&[], &[]);
    assert!(matches!(
        decode_one(&mut server, &ok),
        Ok(Some(Packet::Connect(_)))
    ));
    assert_eq!(server.version(), Some(V5));
}

#[test]
fn junk_after_a_v311_payload_with_will_and_credentials_is_malformed() {
    let bytes = [
        0x10, 0x19, // CONNECT, remaining length 25
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, // protocol name, level 4
        0xC6, // user name, password, will QoS 0, will, clean session
        0x00, 0x0A, // keep alive 10
        0x00, 0x01, b'c', // client id
        0x00, 0x01, b't', // will topic
        0x00, 0x00, // will message (empty)
        0x00, 0x01, b'u', // user name
        0x00, 0x01, b'p', // password
        0x00, // one byte too many
    ];
    rejects_with(
        &mut Codec::new_server(0),
        &bytes,
        malformed("MQTT-3.1.3"),
        MALFORMED,
    );
    let mut whole = bytes[..bytes.len() - 1].to_vec();
    whole[1] = 0x18; // remaining length 24
    let mut server = Codec::new_server(0);
    assert!(matches!(
        decode_one(&mut server, &whole),
        Ok(Some(Packet::Connect(_)))
    ));
    assert_eq!(server.version(), Some(V311));
}

#[test]
fn a_will_that_runs_short_is_malformed() {
    // Will flag set; the payload ends after the will topic.
    let bytes = [
        0x10, 0x12, // CONNECT, remaining length 18
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, // protocol name, level 5
        0x06, // will, clean start
        0x00, 0x00, // keep alive 0
        0x00, // no properties
        0x00, 0x01, b'c', // client id
        0x00, // no will properties
        0x00, 0x01, b't', // will topic; no will payload
    ];
    rejects_with(
        &mut Codec::new_server(0),
        &bytes,
        malformed("MQTT-3.1.3"),
        MALFORMED,
    );
}

#[test]
fn session_expiry_twice_is_a_protocol_error() {
    let props = [
        0x11, 0x00, 0x00, 0x00, 0x0A, // session expiry interval 10
        0x11, 0x00, 0x00, 0x00, 0x14, // session expiry interval 20
    ];
    rejects_with(
        &mut Codec::new_server(0),
        &v5_connect(&props, &[]),
        protocol("MQTT-2.2.2"),
        PROTOCOL,
    );
}

#[test]
fn receive_maximum_zero_is_a_protocol_error() {
    let props = [0x21, 0x00, 0x00]; // receive maximum 0
    rejects_with(
        &mut Codec::new_server(0),
        &v5_connect(&props, &[]),
        protocol("MQTT-3.1.2.11.3"),
        PROTOCOL,
    );
}

#[test]
fn maximum_packet_size_zero_is_a_protocol_error() {
    let props = [0x27, 0x00, 0x00, 0x00, 0x00]; // maximum packet size 0
    rejects_with(
        &mut Codec::new_server(0),
        &v5_connect(&props, &[]),
        protocol("MQTT-3.1.2.11.4"),
        PROTOCOL,
    );
}

#[test]
fn other_connect_property_errors() {
    let cases: [(&[u8], &str); 4] = [
        // request problem information 2
        (&[0x17, 0x02], "MQTT-3.1.2.11"),
        // authentication data without authentication method
        (&[0x16, 0x00, 0x01, 0xAA], "MQTT-3.1.2.11.10"),
        // receive maximum 5, then again 6
        (&[0x21, 0x00, 0x05, 0x21, 0x00, 0x06], "MQTT-2.2.2"),
        // authentication method "m" twice
        (
            &[0x15, 0x00, 0x01, b'm', 0x15, 0x00, 0x01, b'm'],
            "MQTT-2.2.2",
        ),
    ];
    for (props, clause) in cases {
        rejects_with(
            &mut Codec::new_server(0),
            &v5_connect(props, &[]),
            protocol(clause),
            PROTOCOL,
        );
    }
    // A property that CONNECT does not have (Topic Alias) stays malformed.
    rejects_with(
        &mut Codec::new_server(0),
        &v5_connect(&[0x23, 0x00, 0x01], &[]),
        malformed("MQTT-2.2.2"),
        MALFORMED,
    );
    // User properties may repeat.
    let users = [
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // user property k=v
        0x26, 0x00, 0x01, b'k', 0x00, 0x01, b'v', // the same again
    ];
    assert!(matches!(
        decode_one(&mut Codec::new_server(0), &v5_connect(&users, &[])),
        Ok(Some(Packet::Connect(_)))
    ));
}

#[test]
fn will_property_twice_is_a_protocol_error() {
    let bytes = [
        0x10, 0x1E, // CONNECT, remaining length 30
        0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, // protocol name, level 5
        0x06, // will, clean start
        0x00, 0x00, // keep alive 0
        0x00, // no properties
        0x00, 0x01, b'c', // client id
        0x0A, // will property length 10
        0x18, 0x00, 0x00, 0x00, 0x01, // will delay interval 1
        0x18, 0x00, 0x00, 0x00, 0x02, // will delay interval 2
        0x00, 0x01, b't', // will topic
        0x00, 0x00, // will payload (empty)
    ];
    rejects_with(
        &mut Codec::new_server(0),
        &bytes,
        protocol("MQTT-2.2.2"),
        PROTOCOL,
    );
}
