//! A stored value, kept in the very form a GET reply carries it.
//!
//! The store answers a GET with a RESP bulk string, `$<len>\r\n<bytes>\r\n`. A SET copies
//! the value out of the request anyway (the request's buffer is not the store's); copying
//! it into that frame instead costs the same, and then a GET's reply payload is the stored
//! buffer itself, shared by a reference count: the only copy of a value on the GET path
//! is the one into the socket's write buffer.

use std::fmt;
use std::ops::Deref;

use bytes::Bytes;

use crate::resp::bulk;

/// A value: arbitrary bytes, stored framed as a bulk string.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Value {
    framed: Bytes,
    /// Where the bytes start in `framed` (after `$<len>\r\n`).
    start: usize,
}

impl Value {
    /// A value holding a copy of `bytes` (one allocation).
    pub fn new(bytes: &[u8]) -> Self {
        let framed = bulk(bytes);
        let start = framed.len() - 2 - bytes.len();
        Self { framed, start }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.framed[self.start..self.framed.len() - 2]
    }

    /// The GET reply payload, `$<len>\r\n<bytes>\r\n`: the stored buffer, not a copy.
    pub fn bulk(&self) -> Bytes {
        self.framed.clone()
    }
}

impl Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.framed.slice(self.start..self.framed.len() - 2), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{bulk_len, put_bulk, Response};
    use bytes::BytesMut;

    #[test]
    fn the_frame_is_the_bulk_reply() {
        for bytes in [&b""[..], b"v", b"\r\n$-1\r\n", &[7; 1000]] {
            let value = Value::new(bytes);
            assert_eq!(value.as_bytes(), bytes);
            assert_eq!(
                value.bulk(),
                Response::Bulk(Bytes::copy_from_slice(bytes)).encode()
            );
        }
    }

    #[test]
    fn the_frame_fills_its_buffer() {
        for len in [0, 1, 9, 10, 99, 100, 1000, 123_456] {
            let bytes = vec![b'x'; len];
            let mut framed = BytesMut::new();
            put_bulk(&mut framed, &bytes);
            assert_eq!(bulk_len(len), framed.len(), "length {len}");
        }
    }

    #[test]
    fn a_reply_shares_the_stored_buffer() {
        let value = Value::new(b"shared");
        assert_eq!(value.bulk().as_ptr(), value.clone().bulk().as_ptr());
        assert_eq!(value.as_bytes().as_ptr(), value.bulk()[4..].as_ptr());
    }
}
