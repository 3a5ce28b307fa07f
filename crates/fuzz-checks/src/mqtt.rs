//! The MQTT codec: a byte stream fed to one [`Codec`] as a connection would, in
//! chunks cut at points the input chooses.
//!
//! Input: one byte picks the codec (a server codec negotiating the version from the
//! CONNECT, or a fixed 3.1.1 or 5.0 one) and whether a small maximum packet size is
//! set, one byte seeds the cut points, the rest is the stream.
//!
//! Asserted:
//! - no panic, and no hang (libFuzzer's timeout);
//! - progress: a decoded packet consumed bytes, `Ok(None)` left the buffer as it was;
//! - cut points do not matter: the packets and the final error (or the bytes left
//!   waiting) are the same as when the whole stream arrives at once;
//! - every decoded packet encodes (with the version it was decoded under) and decodes
//!   back to itself, consuming exactly what was written: the crate's round-trip promise.

use bytes::BytesMut;
use statehub_mqtt_codec::{Codec, DecodeError, Packet, ProtocolVersion};

use crate::input::Input;

/// How a decode run ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The codec waits for more bytes; this many are buffered.
    Waiting(usize),
    /// The stream is refused.
    Failed(DecodeError),
}

/// The MQTT 3.1.1/5.0 decoder, fed in chunks.
pub fn mqtt_codec(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.byte();
    let mut seed = u64::from(input.byte()) | 0x9E37_79B9_0000_0000;
    let stream = input.rest();
    let max = if mode & 0b100 != 0 { 64 } else { 0 };
    let make = || match mode & 0b11 {
        1 => Codec::with_version(ProtocolVersion::V311, max),
        2 => Codec::with_version(ProtocolVersion::V5, max),
        _ => Codec::new_server(max),
    };
    let mut cuts = Vec::new();
    let mut left = stream.len();
    while left > 0 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let n = 1 + (seed % (left as u64)) as usize;
        cuts.push(n.min(1 + (seed >> 32) as usize % 16));
        left -= cuts.last().copied().unwrap_or(left);
    }
    let whole = decode_all(make(), stream, &[stream.len()]);
    let chunked = decode_all(make(), stream, &cuts);
    assert_eq!(whole, chunked, "cut points changed the outcome: {cuts:?}");
    for (packet, version) in &whole.0 {
        roundtrip(packet, *version);
    }
}

/// Feeds `stream` in chunks of the given sizes, decoding after each.
fn decode_all(
    mut codec: Codec,
    stream: &[u8],
    chunks: &[usize],
) -> (Vec<(Packet, ProtocolVersion)>, End) {
    let mut buf = BytesMut::new();
    let mut packets = Vec::new();
    let mut rest = stream;
    for &n in chunks {
        let (chunk, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.clone();
            match codec.decode(&mut buf) {
                Ok(Some(packet)) => {
                    assert!(buf.len() < before.len(), "a packet from no bytes");
                    let version = codec.version().expect("a decoded packet fixes the version");
                    packets.push((packet, version));
                }
                Ok(None) => {
                    assert_eq!(buf, before, "Ok(None) changed the buffer");
                    break;
                }
                Err(e) => return (packets, End::Failed(e)),
            }
        }
    }
    (packets, End::Waiting(buf.len()))
}

fn roundtrip(packet: &Packet, version: ProtocolVersion) {
    let mut out = BytesMut::new();
    let codec = Codec::with_version(version, 0);
    if let Err(e) = codec.encode(packet, &mut out) {
        panic!("{version:?}: a decoded packet does not encode ({e}): {packet:?}");
    }
    let written = out.len();
    let again = Codec::with_version(version, 0).decode(&mut out);
    assert_eq!(
        again,
        Ok(Some(packet.clone())),
        "{version:?}: re-encoded as {written} bytes, decodes differently"
    );
    assert!(
        out.is_empty(),
        "{} bytes left after the re-encoded packet",
        out.len()
    );
}
