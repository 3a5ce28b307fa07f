//! One data message on its way to many connections, encoded once.
//!
//! A group message to 1,000 subscribers used to be serialized 1,000 times; most of
//! the bytes are the same for every recipient. [`DataFrames`] encodes lazily, once
//! per subprotocol, and shares the result (frames are reference-counted). The one
//! per-recipient part, a reliable JSON recipient's `sequenceId`, is the last field
//! of the JSON object, so those frames are the shared prefix plus
//! `,"sequenceId":N}`, byte for byte what serializing the whole message gives.
//! Reliable protobuf frames are still encoded per recipient (the sequence id sits
//! inside a length-delimited field).

use std::fmt::Write as _;

use axum::extract::ws::Message;

use super::codec::encode_data;
use super::json::{encode_data_message, DataMessageRef};
use super::Subprotocol;

/// The encodings of one data message, made on first use.
#[derive(Debug)]
pub(crate) struct DataFrames<'a> {
    msg: &'a DataMessageRef<'a>,
    /// The JSON frame without `sequenceId`, whole.
    json: Option<String>,
    /// Shared frames of the subprotocols without sequence ids.
    shared: [Option<Message>; 3],
}

impl<'a> DataFrames<'a> {
    pub(crate) fn new(msg: &'a DataMessageRef<'a>) -> Self {
        Self {
            msg,
            json: None,
            shared: [None, None, None],
        }
    }

    /// Is this the terminal message of a stream, with no data? Raw connections are not
    /// sent it (they would get an empty frame).
    pub(crate) fn is_bare_stream_end(&self) -> bool {
        self.msg.stream.is_some_and(|s| s.end_of_stream)
            && matches!(self.msg.payload, crate::protocol::Payload::Text(t) if t.is_empty())
    }

    /// The frame for a connection of `protocol`; `sequence_id` on reliable ones.
    pub(crate) fn frame(&mut self, protocol: Subprotocol, sequence_id: Option<u64>) -> Message {
        let slot = match (protocol, sequence_id) {
            (Subprotocol::JsonReliable, Some(id)) => return self.json_with_sequence_id(id),
            (Subprotocol::ProtobufReliable, Some(_)) => {
                return encode_data(protocol, self.msg, sequence_id)
            }
            (Subprotocol::Raw, _) => 0,
            (Subprotocol::Json | Subprotocol::JsonReliable, _) => 1,
            (Subprotocol::Protobuf | Subprotocol::ProtobufReliable, _) => 2,
        };
        if slot == 1 {
            let json = self.json();
            return self.shared[1]
                .get_or_insert_with(|| Message::Text(json.into()))
                .clone();
        }
        let msg = self.msg;
        self.shared[slot]
            .get_or_insert_with(|| encode_data(protocol, msg, None))
            .clone()
    }

    fn json(&mut self) -> String {
        let msg = self.msg;
        self.json
            .get_or_insert_with(|| encode_data_message(msg, None))
            .clone()
    }

    fn json_with_sequence_id(&mut self, id: u64) -> Message {
        let msg = self.msg;
        let whole = self
            .json
            .get_or_insert_with(|| encode_data_message(msg, None));
        let prefix = whole.strip_suffix('}').unwrap_or(whole);
        let mut out = String::with_capacity(prefix.len() + 36);
        out.push_str(prefix);
        out.push_str(",\"sequenceId\":");
        let _ = write!(out, "{id}}}");
        Message::Text(out.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::json::MessageSource;
    use crate::protocol::Payload;

    /// Every subprotocol, with and without sequence ids, gets exactly the bytes the
    /// per-recipient encoder produces.
    #[test]
    fn shared_frames_equal_per_recipient_encoding() {
        let payloads = [
            Payload::Text("hé \"quoted\" \n".into()),
            Payload::Json(serde_json::json!({"a": [1, 2, {"b": null}], "c": "}"})),
            Payload::Binary(b"\x00\x01}".to_vec()),
        ];
        for payload in &payloads {
            for (group, from_user_id) in [(Some("g"), Some("u")), (None, None)] {
                let msg = DataMessageRef {
                    from: if group.is_some() {
                        MessageSource::Group
                    } else {
                        MessageSource::Server
                    },
                    group,
                    from_user_id,
                    payload,
                    stream: None,
                };
                let mut frames = DataFrames::new(&msg);
                for protocol in [
                    Subprotocol::Raw,
                    Subprotocol::Json,
                    Subprotocol::JsonReliable,
                    Subprotocol::Protobuf,
                    Subprotocol::ProtobufReliable,
                ] {
                    for seq in [None, Some(1), Some(u64::MAX)] {
                        let seq = if protocol.is_reliable() { seq } else { None };
                        assert_eq!(
                            frames.frame(protocol, seq),
                            encode_data(protocol, &msg, seq),
                            "{protocol:?} {seq:?} {payload:?}"
                        );
                    }
                }
            }
        }
    }
}
