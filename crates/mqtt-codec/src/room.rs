//! Writing a packet whose length is known into room made for it at once.
//!
//! `BytesMut`'s `put_*` methods check and maybe grow the buffer on every call and
//! write a two-byte length through a copy; a PUBLISH of the state store's replies is
//! about ten short fields, and those checks cost more than the copies. [`Room`] grows
//! the buffer once by the packet's length and fills that slice; a length computed
//! wrong (a bug, not input) makes the write fail instead of panicking, and leaves the
//! buffer as it was.

use bytes::BytesMut;

use crate::EncodeError;

/// The slice of a buffer a packet of known length is written into.
pub(crate) struct Room<'a> {
    rest: &'a mut [u8],
    /// A write did not fit: the length the caller computed was short.
    short: bool,
}

impl<'a> Room<'a> {
    /// `len` bytes appended to `dst` (zeroed) to be filled.
    pub(crate) fn append(dst: &'a mut BytesMut, len: usize) -> Room<'a> {
        let start = dst.len();
        dst.resize(start + len, 0);
        Room {
            rest: &mut dst[start..],
            short: false,
        }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.slice(&[v]);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.slice(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.slice(&v.to_be_bytes());
    }

    pub(crate) fn slice(&mut self, data: &[u8]) {
        if data.len() > self.rest.len() {
            self.short = true;
            return;
        }
        let (head, tail) = std::mem::take(&mut self.rest).split_at_mut(data.len());
        head.copy_from_slice(data);
        self.rest = tail;
    }

    /// Two-byte length prefix then the bytes; the caller has checked the length fits.
    pub(crate) fn binary(&mut self, data: &[u8]) {
        self.u16(data.len() as u16);
        self.slice(data);
    }

    /// A Variable Byte Integer; the caller has checked `value <= MAX_VARINT`.
    pub(crate) fn varint(&mut self, mut value: usize) {
        loop {
            let mut byte = (value & 0x7F) as u8;
            value >>= 7;
            if value > 0 {
                byte |= 0x80;
            }
            self.u8(byte);
            if value == 0 {
                return;
            }
        }
    }

    /// Whether exactly the room made was filled.
    pub(crate) fn filled(self) -> Result<(), EncodeError> {
        if self.short || !self.rest.is_empty() {
            return Err(EncodeError::Invalid("packet length computed wrong"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_exactly_or_fails() {
        let mut dst = BytesMut::from(&b"x"[..]);
        let mut room = Room::append(&mut dst, 7);
        room.u8(1);
        room.binary(b"ab");
        room.varint(200);
        assert!(room.filled().is_ok());
        assert_eq!(&dst[..], b"x\x01\x00\x02ab\xc8\x01");

        let mut dst = BytesMut::new();
        let mut room = Room::append(&mut dst, 2);
        room.u32(1);
        assert!(room.filled().is_err());
        let mut dst = BytesMut::new();
        let mut room = Room::append(&mut dst, 2);
        room.u8(1);
        assert!(room.filled().is_err());
    }
}
