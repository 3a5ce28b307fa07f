//! Message payloads, independent of the subprotocol that carried them.
//!
//! A publisher's data is decoded once into a [`Payload`] and then encoded again for each
//! subscriber's subprotocol: JSON clients see `dataType` + `data` (binary and protobuf as
//! base64), raw clients see the bare text or bytes, protobuf clients see `MessageData`.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ProtocolError;

/// The `dataType` of a message. `json` is the default when a client leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum DataType {
    /// Any JSON value, published as is.
    #[default]
    Json,
    /// A string.
    Text,
    /// Bytes, base64 on JSON subprotocols.
    Binary,
    /// A serialized `google.protobuf.Any`, base64 on JSON subprotocols.
    Protobuf,
}

/// Decoded message data.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Payload {
    /// A JSON value.
    Json(Value),
    /// A string.
    Text(String),
    /// Raw bytes.
    Binary(Vec<u8>),
    /// The bytes of a serialized `google.protobuf.Any`.
    Protobuf(Vec<u8>),
}

impl Payload {
    /// Decodes the `dataType`/`data` pair of a JSON upstream message.
    pub(crate) fn from_json(data_type: DataType, data: Value) -> Result<Self, ProtocolError> {
        match data_type {
            DataType::Json => Ok(Self::Json(data)),
            DataType::Text => match data {
                Value::String(s) => Ok(Self::Text(s)),
                _ => Err(ProtocolError::DataNotString("text")),
            },
            DataType::Binary => Ok(Self::Binary(decode_base64(data, "binary")?)),
            DataType::Protobuf => Ok(Self::Protobuf(decode_base64(data, "protobuf")?)),
        }
    }

    /// The `dataType` a JSON subscriber sees.
    pub(crate) fn data_type(&self) -> DataType {
        match self {
            Self::Json(_) => DataType::Json,
            Self::Text(_) => DataType::Text,
            Self::Binary(_) => DataType::Binary,
            Self::Protobuf(_) => DataType::Protobuf,
        }
    }

    /// The `data` a JSON subscriber sees, borrowed for serialization.
    pub(crate) fn json_data(&self) -> JsonData<'_> {
        JsonData(self)
    }

    /// The `data` a JSON client sees, as a value (for replies built as [`Value`]s).
    pub(crate) fn to_json_value(&self) -> Value {
        // A string or a `Value`: serializing cannot fail.
        serde_json::to_value(self.json_data()).unwrap_or(Value::Null)
    }
}

fn decode_base64(data: Value, what: &'static str) -> Result<Vec<u8>, ProtocolError> {
    match data {
        Value::String(s) => BASE64
            .decode(s.as_bytes())
            .map_err(|_| ProtocolError::BadBase64(what)),
        _ => Err(ProtocolError::DataNotString(what)),
    }
}

/// Serializes a payload as the `data` field of a JSON message without copying it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct JsonData<'a>(&'a Payload);

impl Serialize for JsonData<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Payload::Json(v) => v.serialize(serializer),
            Payload::Text(s) => serializer.serialize_str(s),
            Payload::Binary(b) | Payload::Protobuf(b) => {
                serializer.serialize_str(&BASE64.encode(b))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn text_must_be_a_string() {
        assert_eq!(
            Payload::from_json(DataType::Text, json!("hi")).unwrap(),
            Payload::Text("hi".into())
        );
        assert!(matches!(
            Payload::from_json(DataType::Text, json!(1)),
            Err(ProtocolError::DataNotString("text"))
        ));
    }

    #[test]
    fn binary_is_base64() {
        let p = Payload::from_json(DataType::Binary, json!("AQID")).unwrap();
        assert_eq!(p, Payload::Binary(vec![1, 2, 3]));
        assert_eq!(serde_json::to_value(p.json_data()).unwrap(), json!("AQID"));
        assert!(matches!(
            Payload::from_json(DataType::Binary, json!("!!")),
            Err(ProtocolError::BadBase64(_))
        ));
    }

    #[test]
    fn json_is_kept_as_is() {
        let v = json!({"a": [1, "b", null]});
        let p = Payload::from_json(DataType::Json, v.clone()).unwrap();
        assert_eq!(serde_json::to_value(p.json_data()).unwrap(), v);
        assert_eq!(p.data_type(), DataType::Json);
    }
}
