//! Reading a fuzz input as a few choices and byte strings: past the end, every read
//! gives zeros or nothing, so any input is a valid one.

/// A cursor over the fuzzer's bytes.
#[derive(Debug)]
pub(crate) struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte, 0 past the end.
    pub(crate) fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next `n` bytes, or what is left.
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A byte string prefixed by its length: one byte, or 255 then two bytes (big
    /// endian) for longer ones.
    pub(crate) fn chunk(&mut self) -> &'a [u8] {
        let len = match self.byte() {
            255 => usize::from(u16::from_be_bytes([self.byte(), self.byte()])),
            n => usize::from(n),
        };
        self.take(len)
    }

    /// Everything left.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}
