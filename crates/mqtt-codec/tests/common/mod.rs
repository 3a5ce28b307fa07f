//! Helpers shared by the integration tests.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use statehub_mqtt_codec::{ByteString, Codec, DecodeError, Packet, ProtocolVersion, ReasonCode};

pub use ProtocolVersion::{V311, V5};

pub fn s(v: &'static str) -> ByteString {
    ByteString::from_static(v)
}

pub fn b(v: &'static [u8]) -> Bytes {
    Bytes::from_static(v)
}

pub fn up(k: &'static str, v: &'static str) -> (ByteString, ByteString) {
    (s(k), s(v))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub fn decode_one(codec: &mut Codec, bytes: &[u8]) -> Result<Option<Packet>, DecodeError> {
    let mut buf = BytesMut::from(bytes);
    let res = codec.decode(&mut buf);
    if let Ok(Some(_)) = res {
        assert!(buf.is_empty(), "decode left {} bytes", buf.len());
    }
    res
}

pub fn encode(version: ProtocolVersion, packet: &Packet) -> BytesMut {
    let mut out = BytesMut::new();
    Codec::with_version(version, 0)
        .encode(packet, &mut out)
        .expect("encode");
    out
}

/// Every strict prefix decodes to `Ok(None)` and leaves the buffer untouched.
pub fn assert_prefixes_incomplete(mut make: impl FnMut() -> Codec, bytes: &[u8]) {
    for n in 0..bytes.len() {
        let mut buf = BytesMut::from(&bytes[..n]);
        let res = make().decode(&mut buf);
        assert_eq!(res, Ok(None), "prefix of {n} bytes: {}", hex(&bytes[..n]));
        assert_eq!(&buf[..], &bytes[..n], "prefix of {n} bytes was modified");
    }
}

/// `bytes` decodes to `packet`, `packet` encodes to `bytes`, prefixes are incomplete.
pub fn exact(version: ProtocolVersion, bytes: &[u8], packet: Packet) {
    let decoded = decode_one(&mut Codec::with_version(version, 0), bytes);
    assert_eq!(decoded, Ok(Some(packet.clone())), "decoding {}", hex(bytes));
    let out = encode(version, &packet);
    assert_eq!(hex(&out), hex(bytes), "encoding {packet:?}");
    assert_prefixes_incomplete(|| Codec::with_version(version, 0), bytes);
}

/// `bytes` decodes to `packet` (a form our encoder does not produce).
pub fn decodes_to(version: ProtocolVersion, bytes: &[u8], packet: Packet) {
    let decoded = decode_one(&mut Codec::with_version(version, 0), bytes);
    assert_eq!(decoded, Ok(Some(packet)), "decoding {}", hex(bytes));
}

/// Decoding fails with `err`, whose reason code is `rc`.
pub fn rejects(codec: &mut Codec, bytes: &[u8], err: DecodeError, rc: ReasonCode) {
    let res = decode_one(codec, bytes);
    assert_eq!(res, Err(err.clone()), "decoding {}", hex(bytes));
    assert_eq!(err.reason_code(), rc);
}

pub fn malformed(clause: &'static str) -> impl Fn(&DecodeError) -> bool {
    move |e| matches!(e, DecodeError::Malformed { clause: c, .. } if *c == clause)
}

/// Decoding fails with an error matching `pred` (clause checks without the detail text).
pub fn rejects_with(
    codec: &mut Codec,
    bytes: &[u8],
    pred: impl Fn(&DecodeError) -> bool,
    rc: ReasonCode,
) {
    match decode_one(codec, bytes) {
        Err(e) if pred(&e) => assert_eq!(e.reason_code(), rc, "{e}"),
        other => panic!("decoding {}: unexpected {other:?}", hex(bytes)),
    }
}

pub fn protocol(clause: &'static str) -> impl Fn(&DecodeError) -> bool {
    move |e| matches!(e, DecodeError::Protocol { clause: c, .. } if *c == clause)
}
