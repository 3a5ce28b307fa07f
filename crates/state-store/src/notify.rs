//! Notification topics and payloads, exactly as the SDK clients parse them.
//!
//! Topics use UPPER-case hex (RFC 4648 base16) for the client id and the key: the Rust
//! client's notification task panics on a lower-case segment. A deletion is `DELETE`, not
//! the protocol page's `DEL`.

use bytes::Bytes;

use crate::resp::encode_array;

/// Where clients publish requests.
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

/// Every notification topic starts with this.
pub const NOTIFY_TOPIC_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/";

/// Between the client id and the key in a notification topic.
const NOTIFY_TOPIC_MIDDLE: &str = "/command/notify/";

/// The longest MQTT topic name: a UTF-8 string of at most 65,535 bytes.
pub const MAX_TOPIC_LEN: usize = u16::MAX as usize;

/// `clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/<HEX(client)>/command/notify/<HEX(key)>`.
pub fn notify_topic(client_id: &[u8], key: &[u8]) -> String {
    let mut topic = String::with_capacity(notify_topic_len(client_id.len(), key.len()));
    topic.push_str(NOTIFY_TOPIC_PREFIX);
    push_hex(&mut topic, client_id);
    topic.push_str(NOTIFY_TOPIC_MIDDLE);
    push_hex(&mut topic, key);
    topic
}

/// The length of [`notify_topic`] for a client id and a key of these lengths: each byte
/// of either is two hex digits. A KEYNOTIFY whose topic would exceed [`MAX_TOPIC_LEN`] is
/// refused, so no notification is ever built that MQTT cannot carry.
pub fn notify_topic_len(client_id_len: usize, key_len: usize) -> usize {
    let hex = client_id_len.saturating_add(key_len).saturating_mul(2);
    hex.saturating_add(NOTIFY_TOPIC_PREFIX.len() + NOTIFY_TOPIC_MIDDLE.len())
}

fn push_hex(out: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
}

/// `*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$<n>\r\n<value>\r\n`
pub fn set_payload(value: &[u8]) -> Bytes {
    encode_array(&[b"NOTIFY", b"SET", b"VALUE", value])
}

/// `*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n`
pub fn delete_payload() -> Bytes {
    Bytes::from_static(b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n")
}
