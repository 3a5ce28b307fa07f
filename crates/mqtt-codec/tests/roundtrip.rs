//! Property tests: decode(encode(p)) == p for valid packets of each version, and
//! no input makes the decoder panic.

#[path = "common/arb.rs"]
mod arb;
#[path = "common/arb_other.rs"]
mod arb_other;

use bytes::BytesMut;
use proptest::prelude::*;
use statehub_mqtt_codec::{Codec, Packet, ProtocolVersion};

const VERSIONS: [ProtocolVersion; 2] = [ProtocolVersion::V311, ProtocolVersion::V5];

fn roundtrip(version: ProtocolVersion, packet: &Packet) -> Result<(), TestCaseError> {
    let mut codec = Codec::with_version(version, 0);
    let mut buf = BytesMut::new();
    codec
        .encode(packet, &mut buf)
        .map_err(|e| TestCaseError::fail(format!("encode: {e}")))?;
    let bytes = buf.clone().freeze();
    prop_assert_eq!(codec.decode(&mut buf), Ok(Some(packet.clone())));
    prop_assert!(buf.is_empty());
    // A packet cut anywhere is incomplete, and the buffer is left as it was.
    let cut = bytes.len() / 2;
    let mut part = BytesMut::from(&bytes[..cut]);
    prop_assert_eq!(codec.decode(&mut part), Ok(None));
    prop_assert_eq!(&part[..], &bytes[..cut]);
    Ok(())
}

/// Decodes until the codec needs more bytes or fails; must not panic or loop.
fn drain(mut codec: Codec, bytes: &[u8]) {
    let mut buf = BytesMut::from(bytes);
    for _ in 0..=bytes.len() {
        match codec.decode(&mut buf) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
    panic!("decoder made no progress");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn publish_roundtrips(v311 in arb::publish(ProtocolVersion::V311), v5 in arb::publish(ProtocolVersion::V5)) {
        roundtrip(ProtocolVersion::V311, &v311)?;
        roundtrip(ProtocolVersion::V5, &v5)?;
    }

    #[test]
    fn subscribe_roundtrips(
        v311 in arb::subscribe(ProtocolVersion::V311),
        v5 in arb::subscribe(ProtocolVersion::V5),
        u311 in arb::unsubscribe(ProtocolVersion::V311),
        u5 in arb::unsubscribe(ProtocolVersion::V5),
    ) {
        roundtrip(ProtocolVersion::V311, &v311)?;
        roundtrip(ProtocolVersion::V5, &v5)?;
        roundtrip(ProtocolVersion::V311, &u311)?;
        roundtrip(ProtocolVersion::V5, &u5)?;
    }

    #[test]
    fn connect_roundtrips(v311 in arb::connect(ProtocolVersion::V311), v5 in arb::connect(ProtocolVersion::V5)) {
        roundtrip(ProtocolVersion::V311, &v311)?;
        roundtrip(ProtocolVersion::V5, &v5)?;
        // A server codec negotiates the version from the same bytes.
        for (version, packet) in [(ProtocolVersion::V311, &v311), (ProtocolVersion::V5, &v5)] {
            let mut buf = BytesMut::new();
            Codec::with_version(version, 0).encode(packet, &mut buf).unwrap();
            let mut server = Codec::new_server(0);
            prop_assert_eq!(server.decode(&mut buf), Ok(Some(packet.clone())));
            prop_assert_eq!(server.version(), Some(version));
        }
    }

    #[test]
    fn connack_roundtrips(v311 in arb::connack(ProtocolVersion::V311), v5 in arb::connack(ProtocolVersion::V5)) {
        roundtrip(ProtocolVersion::V311, &v311)?;
        roundtrip(ProtocolVersion::V5, &v5)?;
    }

    #[test]
    fn other_packets_roundtrip(v311 in arb_other::other(ProtocolVersion::V311), v5 in arb_other::other(ProtocolVersion::V5)) {
        roundtrip(ProtocolVersion::V311, &v311)?;
        roundtrip(ProtocolVersion::V5, &v5)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        drain(Codec::new_server(0), &bytes);
        drain(Codec::with_version(ProtocolVersion::V311, 0), &bytes);
        drain(Codec::with_version(ProtocolVersion::V5, 0), &bytes);
    }

    /// Valid packets with a few bytes overwritten reach much deeper into the decoders
    /// than random bytes do.
    #[test]
    fn mutated_packets_never_panic(
        which in 0usize..2,
        p311 in arb_other::packet(ProtocolVersion::V311),
        p5 in arb_other::packet(ProtocolVersion::V5),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let (version, packet) = if which == 0 { (ProtocolVersion::V311, p311) } else { (ProtocolVersion::V5, p5) };
        let mut buf = BytesMut::new();
        Codec::with_version(version, 0).encode(&packet, &mut buf).unwrap();
        for (at, byte) in edits {
            let i = at.index(buf.len());
            buf[i] = byte;
        }
        drain(Codec::new_server(0), &buf);
        for v in VERSIONS {
            drain(Codec::with_version(v, 0), &buf);
        }
    }
}
