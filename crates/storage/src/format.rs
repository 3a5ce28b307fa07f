//! The bytes on disk: journal segments, their records and the operations inside them,
//! and the framing shared with snapshots. Sans-IO: encoders append to a `Vec<u8>`,
//! decoders read from a slice and say how far they got.
//!
//! All integers are little-endian; every checksum is CRC-32 (IEEE) and covers every
//! byte before it in its unit, lengths included, so a flipped length is caught like a
//! flipped value.
//!
//! # Journal segment (`journal/{first_seq:020}.log`)
//!
//! ```text
//! header  "SHJRNL02" | first_seq u64 | tables u16 | tables × (id u16, len u8, name) | crc u32
//! record  len u32 | seq u64 | payload (len bytes) | crc u32           (one batch each)
//! payload ops, each: kind u8 (1 put, 2 delete) | table u16 | key_len u16 | key
//!                    | (put only) value_len u32 | value
//! ```
//!
//! A segment names its tables in its header, so a record's operations refer to a table
//! by a small id; a store that opens a new table starts a new segment.
//!
//! A record's `seq` field holds the batch's sequence number in its low 63 bits and, in
//! bit 63, [`SYNCED_BEFORE`]: set on the first record of a write when every byte of the
//! segment before it had been synced (`fdatasync` returned) before that write was made.
//! Recovery needs it to tell a torn last write from damage to data that was already on
//! disk (see `recovery.rs`). Segments of the first format (`"SHJRNL01"`, written before
//! the flag) are read too; their records never carry it.

/// Magic of a journal segment.
pub(crate) const SEGMENT_MAGIC: &[u8; 8] = b"SHJRNL02";
/// Magic of a segment of the first format, whose records carry no [`SYNCED_BEFORE`].
const SEGMENT_MAGIC_V1: &[u8; 8] = b"SHJRNL01";
/// The bit of a record's `seq` field that says every earlier byte of its segment was
/// synced before the write that holds it began.
pub(crate) const SYNCED_BEFORE: u64 = 1 << 63;
/// Bytes a record adds around its payload: length, sequence number, checksum.
pub(crate) const RECORD_OVERHEAD: usize = 4 + 8 + 4;
/// An operation that sets a key.
pub(crate) const OP_PUT: u8 = 1;
/// An operation that removes a key.
pub(crate) const OP_DELETE: u8 = 2;

/// The ids and names of the tables a segment or snapshot refers to.
pub(crate) type TableNames = Vec<(u16, String)>;

/// What is wrong with bytes that should hold a header, a record or an operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FormatError {
    /// The unit ends before its declared end.
    #[error("cut short")]
    Truncated,
    /// The checksum does not match.
    #[error("checksum mismatch")]
    Checksum,
    /// Not what the file's kind starts with.
    #[error("not a statehub {0} (bad magic)")]
    Magic(&'static str),
    /// Well framed, but meaningless.
    #[error("malformed: {0}")]
    Malformed(&'static str),
}

pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// A little-endian reader over a slice; every read checks the length.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.bytes.len()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(FormatError::Truncated)?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        self.array().map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        self.array().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        self.array().map(u64::from_le_bytes)
    }

    /// A table name: its length (one byte), then that many bytes of UTF-8.
    pub(crate) fn name(&mut self) -> Result<&'a str, FormatError> {
        let len = self.u8()?;
        std::str::from_utf8(self.take(usize::from(len))?)
            .map_err(|_| FormatError::Malformed("table name"))
    }
}

/// Appends a table list: count, then (id, name length, name) each.
pub(crate) fn put_tables(out: &mut Vec<u8>, tables: &[(u16, String)]) {
    out.extend_from_slice(&(tables.len() as u16).to_le_bytes());
    for (id, name) in tables {
        out.extend_from_slice(&id.to_le_bytes());
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
    }
}

pub(crate) fn read_tables(r: &mut Reader<'_>) -> Result<TableNames, FormatError> {
    let n = r.u16()?;
    let mut tables = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let id = r.u16()?;
        tables.push((id, r.name()?.to_owned()));
    }
    Ok(tables)
}

/// A segment header for a segment whose first record will be `first_seq`.
pub(crate) fn segment_header(first_seq: u64, tables: &[(u16, String)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(SEGMENT_MAGIC);
    out.extend_from_slice(&first_seq.to_le_bytes());
    put_tables(&mut out, tables);
    let sum = crc(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// A segment header read back: its first sequence number, its tables, and where its
/// records start.
#[derive(Debug)]
pub(crate) struct SegmentHeader {
    /// Whether its records may carry [`SYNCED_BEFORE`] (not a segment of the first format).
    pub(crate) flags_synced: bool,
    pub(crate) first_seq: u64,
    pub(crate) tables: TableNames,
    pub(crate) len: usize,
}

pub(crate) fn read_segment_header(bytes: &[u8]) -> Result<SegmentHeader, FormatError> {
    let mut r = Reader::new(bytes);
    let flags_synced = match r.take(8)? {
        m if m == SEGMENT_MAGIC => true,
        m if m == SEGMENT_MAGIC_V1 => false,
        _ => return Err(FormatError::Magic("journal segment")),
    };
    let first_seq = r.u64()?;
    let tables = read_tables(&mut r)?;
    let end = r.pos();
    if r.u32()? != crc(&bytes[..end]) {
        return Err(FormatError::Checksum);
    }
    Ok(SegmentHeader {
        flags_synced,
        first_seq,
        tables,
        len: r.pos(),
    })
}

/// Appends one record: the batch `payload` under sequence number `seq`, flagged
/// [`SYNCED_BEFORE`] if `synced_before`.
pub(crate) fn put_record(out: &mut Vec<u8>, seq: u64, synced_before: bool, payload: &[u8]) {
    let start = out.len();
    let field = if synced_before {
        seq | SYNCED_BEFORE
    } else {
        seq
    };
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&field.to_le_bytes());
    out.extend_from_slice(payload);
    let sum = crc(&out[start..]);
    out.extend_from_slice(&sum.to_le_bytes());
}

/// One record read from a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordRef<'a> {
    pub(crate) seq: u64,
    /// [`SYNCED_BEFORE`] was set.
    pub(crate) synced_before: bool,
    pub(crate) payload: &'a [u8],
}

/// Reads the record at the start of `bytes`; returns it and its length on disk.
/// `Truncated` when `bytes` ends inside it (a torn write looks so), `Checksum` when it
/// is all there but damaged.
pub(crate) fn read_record(bytes: &[u8]) -> Result<(RecordRef<'_>, usize), FormatError> {
    let mut r = Reader::new(bytes);
    let len = r.u32()? as usize;
    let field = r.u64()?;
    let payload = r.take(len)?;
    let end = r.pos();
    if r.u32()? != crc(&bytes[..end]) {
        return Err(FormatError::Checksum);
    }
    let record = RecordRef {
        seq: field & !SYNCED_BEFORE,
        synced_before: field & SYNCED_BEFORE != 0,
        payload,
    };
    Ok((record, r.pos()))
}

/// One operation of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Op<'a> {
    pub(crate) table: u16,
    pub(crate) key: &'a [u8],
    /// `None` removes the key.
    pub(crate) value: Option<&'a [u8]>,
}

pub(crate) fn put_op(out: &mut Vec<u8>, table: u16, key: &[u8], value: Option<&[u8]>) {
    put_op_head(
        out,
        if value.is_some() { OP_PUT } else { OP_DELETE },
        table,
        key,
    );
    if let Some(value) = value {
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
}

/// Appends a put whose value `write` appends in place; returns the value's length.
pub(crate) fn put_op_with(
    out: &mut Vec<u8>,
    table: u16,
    key: &[u8],
    write: impl FnOnce(&mut Vec<u8>),
) -> usize {
    put_op_head(out, OP_PUT, table, key);
    let len_at = out.len();
    out.extend_from_slice(&[0; 4]);
    write(out);
    let len = out.len() - len_at - 4;
    out[len_at..len_at + 4].copy_from_slice(&(len as u32).to_le_bytes());
    len
}

/// An operation's kind, table and key: what a put and a delete both start with.
fn put_op_head(out: &mut Vec<u8>, kind: u8, table: u16, key: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&table.to_le_bytes());
    out.extend_from_slice(&(key.len() as u16).to_le_bytes());
    out.extend_from_slice(key);
}

/// The operations of a record's payload, in order.
pub(crate) fn ops(payload: &[u8]) -> impl Iterator<Item = Result<Op<'_>, FormatError>> {
    let mut r = Reader::new(payload);
    std::iter::from_fn(move || {
        if r.is_empty() {
            return None;
        }
        Some(read_op(&mut r))
    })
}

fn read_op<'a>(r: &mut Reader<'a>) -> Result<Op<'a>, FormatError> {
    let kind = r.u8()?;
    let table = r.u16()?;
    let key_len = r.u16()?;
    let key = r.take(usize::from(key_len))?;
    let value = match kind {
        OP_PUT => {
            let len = r.u32()? as usize;
            Some(r.take(len)?)
        }
        OP_DELETE => None,
        _ => return Err(FormatError::Malformed("unknown operation")),
    };
    Ok(Op { table, key, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_ops_round_trip_and_every_flipped_byte_is_caught() {
        let mut payload = Vec::new();
        put_op(&mut payload, 3, b"key", Some(b"value"));
        put_op(&mut payload, 4, b"gone", None);
        let mut out = Vec::new();
        put_record(&mut out, 42, true, &payload);
        assert_eq!(out.len(), payload.len() + RECORD_OVERHEAD);
        let (record, len) = read_record(&out).unwrap();
        assert_eq!(
            (record.seq, record.synced_before, len),
            (42, true, out.len())
        );
        let mut unflagged = Vec::new();
        put_record(&mut unflagged, 42, false, &payload);
        assert!(!read_record(&unflagged).unwrap().0.synced_before);
        let ops: Vec<Op<'_>> = ops(record.payload).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            ops,
            vec![
                Op {
                    table: 3,
                    key: b"key",
                    value: Some(b"value")
                },
                Op {
                    table: 4,
                    key: b"gone",
                    value: None
                },
            ]
        );
        for i in 0..out.len() {
            let mut damaged = out.clone();
            damaged[i] ^= 0x10;
            assert!(read_record(&damaged).is_err(), "flip at {i} not caught");
        }
        for cut in 0..out.len() {
            assert_eq!(
                read_record(&out[..cut]).unwrap_err(),
                FormatError::Truncated,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn segment_headers_round_trip_and_are_checked() {
        let tables = vec![(0, "a".to_owned()), (7, "state_store".to_owned())];
        let header = segment_header(9, &tables);
        let read = read_segment_header(&header).unwrap();
        assert_eq!(
            (read.first_seq, read.tables, read.len),
            (9, tables, header.len())
        );
        for i in 0..header.len() {
            let mut damaged = header.clone();
            damaged[i] ^= 1;
            assert!(
                read_segment_header(&damaged).is_err(),
                "flip at {i} not caught"
            );
        }
    }

    #[test]
    fn a_value_written_in_place_reads_back_as_put() {
        let (mut direct, mut in_place) = (Vec::new(), Vec::new());
        put_op(&mut direct, 2, b"k", Some(b"value"));
        assert_eq!(
            put_op_with(&mut in_place, 2, b"k", |out| out
                .extend_from_slice(b"value")),
            5
        );
        assert_eq!(direct, in_place);
    }

    #[test]
    fn bad_operations_are_refused() {
        assert_eq!(
            ops(&[9, 0, 0, 0, 0]).next(),
            Some(Err(FormatError::Malformed("unknown operation")))
        );
        assert_eq!(
            ops(&[OP_PUT, 0, 0, 3, 0, b'a']).next(),
            Some(Err(FormatError::Truncated))
        );
    }
}
