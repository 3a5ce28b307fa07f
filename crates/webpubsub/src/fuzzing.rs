//! The decode entry points of client input, for the fuzz targets and their corpus replay
//! tests (`fuzz/`, `crates/fuzz-checks`); built only with the `fuzzing` feature.
//!
//! Each function takes what a client controls, runs it through the same code a
//! connection or a REST request does, and panics only when an invariant breaks: the
//! fuzzer reports panics, so "no panic" is the property plus the assertions here.

use std::collections::HashSet;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use prost::Message as _;
use sha2::Sha256;

use crate::filter::{Conn, Filter};
use crate::protocol::codec::{decode_binary, decode_text, Request};
use crate::protocol::frames::DataFrames;
use crate::protocol::json::{DataMessageRef, MessageSource, StreamInfo};
use crate::protocol::{proto, Payload, Subprotocol};

/// The access keys the token targets verify against; the first signs forged tokens.
pub const KEYS: [&str; 2] = ["fuzzing-access-key-one", "fuzzing-access-key-two"];

const SUBPROTOCOLS: [Subprotocol; 5] = [
    Subprotocol::Raw,
    Subprotocol::Json,
    Subprotocol::JsonReliable,
    Subprotocol::Protobuf,
    Subprotocol::ProtobufReliable,
];

/// A text frame of the JSON subprotocols; its data, if any, is delivered to a
/// subscriber of every subprotocol.
pub fn json_frame(text: &str) {
    deliver(decode_text(text));
}

/// A binary frame of the protobuf subprotocols; its data, if any, is delivered to a
/// subscriber of every subprotocol.
pub fn protobuf_frame(bytes: &[u8]) {
    deliver(decode_binary(bytes));
}

fn deliver(request: Result<Request, crate::protocol::ProtocolError>) {
    let Ok(request) = request else { return };
    let _ = request.ack_id();
    let (group, payload, stream) = match &request {
        Request::SendToGroup { group, payload, .. } => (Some(group.as_str()), payload, None),
        Request::Event { payload, .. } | Request::Invoke { payload, .. } => (None, payload, None),
        Request::StreamData {
            stream_id,
            fragment: Some((seq, payload)),
        } => {
            let info = StreamInfo {
                stream_id: stream_id.clone(),
                stream_sequence_id: *seq,
                end_of_stream: false,
                error: None,
            };
            (Some("g"), payload, Some(info))
        }
        _ => return,
    };
    let Ok(payload) = payload else { return };
    let msg = DataMessageRef {
        from: MessageSource::Group,
        group,
        from_user_id: Some("user"),
        payload,
        stream: stream.as_ref(),
    };
    let mut frames = DataFrames::new(&msg);
    for protocol in SUBPROTOCOLS {
        for sequence_id in [None, Some(7)] {
            check_delivered(payload, protocol, &frames.frame(protocol, sequence_id));
        }
    }
}

/// What a subscriber receives decodes back to the published data.
fn check_delivered(payload: &Payload, protocol: Subprotocol, frame: &axum::extract::ws::Message) {
    use axum::extract::ws::Message;
    match (protocol.is_protobuf(), frame) {
        (false, Message::Text(text)) if protocol != Subprotocol::Raw => {
            let value: serde_json::Value =
                serde_json::from_str(text.as_str()).expect("a JSON frame we wrote parses");
            let data_type = serde_json::from_value(value["dataType"].clone())
                .expect("the frame has a dataType");
            let data = value
                .get("data")
                .cloned()
                .unwrap_or(serde_json::Value::Null);
            let back = Payload::from_json(data_type, data).expect("the data decodes");
            assert_eq!(&back, payload, "JSON delivery changed the data");
        }
        (true, Message::Binary(bytes)) => {
            let out = proto::DownstreamMessage::decode(bytes.as_ref())
                .expect("a protobuf frame we wrote decodes");
            assert!(out.message.is_some(), "an empty protobuf frame");
        }
        (false, Message::Text(_) | Message::Binary(_)) if protocol == Subprotocol::Raw => {}
        (_, other) => panic!("{protocol:?} got a frame of the wrong kind: {other:?}"),
    }
}

/// A REST `filter`: parsed, its error message rendered, and evaluated against a few
/// connections.
pub fn odata_filter(text: &str) {
    let filter = match Filter::parse(text) {
        Ok(filter) => filter,
        Err(e) => {
            let _ = e.message();
            return;
        }
    };
    let groups: HashSet<String> = ["g1", "G2", ""].into_iter().map(String::from).collect();
    let none = HashSet::new();
    for (connection_id, user_id, groups) in [
        ("conn-1", Some("user"), &groups),
        ("", None, &none),
        ("ΩΩΩ", Some(""), &groups),
    ] {
        let _ = filter.matches(&Conn {
            connection_id,
            user_id,
            groups,
        });
    }
}

/// A token string as a client or a REST caller sends it (signatures will not verify).
pub fn token(token: &str) {
    let keys: Vec<String> = KEYS.iter().map(|k| (*k).to_owned()).collect();
    let _ = crate::token::validate_client_token(&keys, token, "hub");
    let _ = crate::rest::auth::validate(&keys, token, "/api/hubs/hub/:send", Some("a=b"));
    let _ = crate::token::claims_map(token);
}

/// A token whose header and claims are the given bytes, signed with [`KEYS`]`[0]`, so
/// the claims reach the validators past the signature check.
pub fn signed_token(header: &[u8], claims: &[u8]) -> String {
    let signing_input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let mut mac =
        Hmac::<Sha256>::new_from_slice(KEYS[0].as_bytes()).expect("HMAC takes any key length");
    mac.update(signing_input.as_bytes());
    let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing_input}.{signature}")
}
