//! The RESP3-like framing of state store payloads.
//!
//! Requests are one array of bulk strings, `*N\r\n` then N times `$len\r\n<bytes>\r\n`,
//! binary-safe, nothing before or after. Anything else is a [`Refusal::Syntax`]: the
//! protocol page lists "illegal RESP3" and "integer overflow" as invalid payloads, and the
//! notes give `syntax error` as the text for a payload that does not conform. Arguments are
//! zero-copy slices of the request payload.
//!
//! Responses are the few forms the SDK clients parse: simple string `+OK`, integers,
//! bulk strings, the null bulk string `$-1`, errors `-ERR <text>` and, for SCAN, an array
//! holding an array of keys and an optional continuation token.

use bytes::{BufMut, Bytes, BytesMut};
use smallvec::SmallVec;

use crate::error::Refusal;

/// The arguments of one request: slices of its payload, inline for the usual few.
pub type Args<'a> = SmallVec<[&'a [u8]; 6]>;

/// Reads a request payload as its array of arguments.
pub fn parse_request(payload: &[u8]) -> Result<Args<'_>, Refusal> {
    let mut reader = Reader {
        buf: payload,
        pos: 0,
    };
    let count = reader.header(b'*')?;
    if count == 0 {
        return Err(Refusal::Syntax);
    }
    // Never trust `count` for an allocation: a 10-byte payload may claim 2^60 items.
    let mut args = Args::new();
    for _ in 0..count {
        let len = reader.header(b'$')?;
        let arg = reader.take(len)?;
        reader.crlf()?;
        args.push(arg);
    }
    if reader.pos != payload.len() {
        return Err(Refusal::Syntax);
    }
    Ok(args)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// `<prefix><decimal digits>\r\n`, the number fitting in a usize.
    fn header(&mut self, prefix: u8) -> Result<usize, Refusal> {
        if self.buf.get(self.pos) != Some(&prefix) {
            return Err(Refusal::Syntax);
        }
        self.pos += 1;
        let start = self.pos;
        let mut value: usize = 0;
        while let Some(&b) = self.buf.get(self.pos) {
            if !b.is_ascii_digit() {
                break;
            }
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(usize::from(b - b'0')))
                .ok_or(Refusal::Syntax)?;
            self.pos += 1;
        }
        if self.pos == start {
            return Err(Refusal::Syntax);
        }
        self.crlf()?;
        Ok(value)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], Refusal> {
        let end = self.pos.checked_add(len).ok_or(Refusal::Syntax)?;
        let out = self.buf.get(self.pos..end).ok_or(Refusal::Syntax)?;
        self.pos = end;
        Ok(out)
    }

    fn crlf(&mut self) -> Result<(), Refusal> {
        if self.buf.get(self.pos..self.pos + 2) != Some(b"\r\n") {
            return Err(Refusal::Syntax);
        }
        self.pos += 2;
        Ok(())
    }
}

/// One response payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// `+OK\r\n`
    Ok,
    /// `:<n>\r\n`
    Integer(i64),
    /// `$<len>\r\n<bytes>\r\n`
    Bulk(Bytes),
    /// `$-1\r\n`
    Null,
    /// `-ERR <text>\r\n`
    Error(Refusal),
    /// `*1\r\n*<n>\r\n<n bulk keys>` or, with a token, `*2\r\n*<n>\r\n<n bulk keys>$<len>\r\n<token>\r\n`.
    Scan {
        /// The keys of this page.
        keys: Vec<Bytes>,
        /// Present when more pages may follow.
        token: Option<Bytes>,
    },
}

impl Response {
    /// The exact payload bytes.
    pub fn encode(&self) -> Bytes {
        match self {
            Self::Ok => Bytes::from_static(b"+OK\r\n"),
            Self::Integer(0) => Bytes::from_static(b":0\r\n"),
            Self::Integer(1) => Bytes::from_static(b":1\r\n"),
            Self::Integer(-1) => Bytes::from_static(b":-1\r\n"),
            Self::Integer(n) => Bytes::from(format!(":{n}\r\n")),
            Self::Null => Bytes::from_static(b"$-1\r\n"),
            Self::Bulk(value) => bulk(value),
            Self::Error(refusal) => Bytes::from(format!("-ERR {refusal}\r\n")),
            Self::Scan { keys, token } => {
                let mut out = BytesMut::new();
                put_header(&mut out, b'*', if token.is_some() { 2 } else { 1 });
                put_header(&mut out, b'*', keys.len());
                for key in keys {
                    put_bulk(&mut out, key);
                }
                if let Some(token) = token {
                    put_bulk(&mut out, token);
                }
                out.freeze()
            }
        }
    }
}

/// A request-shaped array of bulk strings (also the shape of NOTIFY payloads).
pub fn encode_array(items: &[&[u8]]) -> Bytes {
    let mut out = BytesMut::with_capacity(items.iter().map(|i| i.len() + 16).sum::<usize>() + 8);
    put_header(&mut out, b'*', items.len());
    for item in items {
        put_bulk(&mut out, item);
    }
    out.freeze()
}

fn put_header(out: &mut BytesMut, prefix: u8, n: usize) {
    out.put_u8(prefix);
    put_decimal(out, n as u64, 0);
    out.put_slice(b"\r\n");
}

/// Two-digit groups "00" to "99", so a number is written two digits per division.
const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// `n` in decimal, zero-padded to at least `width` (at most 20) digits, without going
/// through `fmt`: every GET reply has a length header and every versioned reply a `__ts`
/// (two numbers of 13 and 1 digits): two digits a division halves the divisions.
pub(crate) fn put_decimal(out: &mut BytesMut, mut n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut i = digits.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        i -= 2;
        digits[i..i + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        i -= 1;
        digits[i] = b'0' + n as u8;
    }
    out.put_slice(&digits[i.min(digits.len() - width.min(digits.len()))..]);
}

/// The length of `item`'s bulk string when `item` is `len` bytes long.
pub(crate) fn bulk_len(len: usize) -> usize {
    let digits = len.checked_ilog10().map_or(1, |d| d as usize + 1);
    1 + digits + 2 + len + 2
}

/// `item` as a bulk string in a buffer of exactly its size: a buffer with spare room
/// becomes a `Bytes` with a separate reference-count header (a second allocation, and a
/// second cold miss when a stored value is overwritten); a full one does not, until it
/// is first shared.
pub(crate) fn bulk(item: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(bulk_len(item.len()));
    put_bulk(&mut out, item);
    debug_assert_eq!(out.len(), out.capacity());
    out.freeze()
}

/// `item` as a bulk string, `$<len>\r\n<item>\r\n`.
pub(crate) fn put_bulk(out: &mut BytesMut, item: &[u8]) {
    put_header(out, b'$', item.len());
    out.put_slice(item);
    out.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::put_decimal;

    fn decimal(n: u64, width: usize) -> String {
        let mut out = bytes::BytesMut::new();
        put_decimal(&mut out, n, width);
        String::from_utf8(out.to_vec()).unwrap()
    }

    proptest::proptest! {
        /// Exactly what `format!("{n:0width$}")` writes.
        #[test]
        fn put_decimal_writes_what_fmt_writes(n in proptest::prop_oneof![0..1000u64, proptest::num::u64::ANY], width in 0..21usize) {
            proptest::prop_assert_eq!(decimal(n, width), format!("{n:0width$}"));
        }
    }

    #[test]
    fn edges() {
        for n in [0, 9, 10, 99, 100, 101, 999, 1000, u64::MAX] {
            assert_eq!(decimal(n, 0), n.to_string());
        }
        assert_eq!(decimal(7, 5), "00007");
        assert_eq!(decimal(1_732_550_000_123, 15), "001732550000123");
    }
}
