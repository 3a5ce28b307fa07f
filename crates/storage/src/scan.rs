//! The journal's reading side: a segment's records checked and handed over operation by
//! operation, at open (`recovery.rs`), for reads (`store.rs`) and by the compactor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::format::{
    self, read_record, read_segment_header, FormatError, SegmentHeader, TableNames,
};

/// Changes recorded in the journal since a snapshot, per table name: the latest value of
/// each key written (`None`: removed), sorted by key.
pub(crate) type Overlay = HashMap<Arc<str>, Vec<(Bytes, Option<Bytes>)>>;

/// An [`Overlay`] being collected from segments: hashed, then sorted once per table by
/// [`Changes::sorted`]. Most writes overwrite a key written shortly before, and a sorted
/// map would pay a search for each.
#[derive(Debug, Default)]
pub(crate) struct Changes(HashMap<Arc<str>, HashMap<Bytes, Option<Bytes>>>);

impl Changes {
    /// An `apply_op` for [`scan`] that records each operation.
    pub(crate) fn sink(&mut self) -> impl FnMut(&Arc<str>, Bytes, Option<Bytes>) + '_ {
        |table, key, value| {
            self.0.entry(table.clone()).or_default().insert(key, value);
        }
    }

    pub(crate) fn sorted(self) -> Overlay {
        self.0
            .into_iter()
            .map(|(table, keys)| {
                let mut keys: Vec<(Bytes, Option<Bytes>)> = keys.into_iter().collect();
                keys.sort_unstable_by(|a, b| a.0.cmp(&b.0));
                (table, keys)
            })
            .collect()
    }
}

/// What [`scan`] hands each operation to: table, key, and value (`None`: removed).
pub(crate) type ApplyOp<'a> = dyn FnMut(&Arc<str>, Bytes, Option<Bytes>) + 'a;

/// Damage found in a journal segment.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {detail}", path.display())]
pub(crate) struct SegmentDamage {
    pub(crate) path: PathBuf,
    pub(crate) detail: String,
}

/// What reading one segment found.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// The sequence number of the last whole record (`first_seq - 1` if none).
    pub(crate) last_seq: u64,
    /// Where the last whole record ends.
    pub(crate) end: u64,
    /// Where its written bytes end (its length, but for zeros not written yet).
    pub(crate) written: u64,
    /// Bytes after `end` that are not a record: a torn last write.
    pub(crate) torn: bool,
    /// The tables its header names (none without a header).
    pub(crate) tables: TableNames,
}

/// How a segment read treats what follows its last whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// The last segment at open: what follows its last whole record is a torn last
    /// write, discarded, unless a whole record written after that record was synced
    /// follows it: then it is damage, refused (see `recovery.rs`).
    Recover,
    /// A closed segment: it must end exactly after a record.
    Whole,
    /// The segment the committer is writing: stop at the first record past `upto`.
    Live { upto: u64 },
}

/// Reads the segment at `path` whose name says `first_seq`: checks its header, its
/// records' checksums and that their sequence numbers count up from `first_seq`, and
/// hands each operation of the records above `after` to `apply_op` (table, key, value
/// or `None` for a removal; slices of the file as read).
pub(crate) fn scan(
    path: &Path,
    first_seq: u64,
    after: u64,
    tail: Tail,
    apply_op: &mut ApplyOp<'_>,
) -> Result<Scanned, SegmentDamage> {
    let damage = |detail: String| SegmentDamage {
        path: path.to_owned(),
        detail,
    };
    let bytes = Bytes::from(std::fs::read(path).map_err(|e| damage(e.to_string()))?);
    let header = match header(&bytes, first_seq, tail).map_err(damage)? {
        Ok(header) => header,
        Err(no_header) => return Ok(no_header),
    };
    let names = table_names(&header.tables);
    let mut pos = header.len;
    let mut last_seq = first_seq - 1;
    while pos < bytes.len() {
        let (record, len) = match read_record(&bytes[pos..]) {
            Ok(r) => r,
            // The zeros a segment is made of, not written yet: its end.
            Err(_) if all_zero(&bytes[pos..]) => break,
            Err(e) => match tail {
                Tail::Live { .. } => break,
                Tail::Recover => {
                    return torn_end(&bytes, pos, last_seq, header, &e).map_err(damage);
                }
                Tail::Whole => {
                    let detail = format!("record after batch {last_seq} at byte {pos}: {e}");
                    return Err(damage(detail));
                }
            },
        };
        if record.seq != last_seq + 1 {
            let detail = format!(
                "batch {} follows batch {last_seq} at byte {pos}",
                record.seq
            );
            return Err(damage(detail));
        }
        if let Tail::Live { upto } = tail {
            if record.seq > upto {
                break;
            }
        }
        if record.seq > after {
            apply_record(record.payload, &names, &bytes, apply_op)
                .map_err(|e| damage(format!("batch {}: {e}", record.seq)))?;
        }
        last_seq = record.seq;
        pos += len;
    }
    Ok(Scanned {
        last_seq,
        end: pos as u64,
        written: bytes.len() as u64,
        torn: false,
        tables: header.tables,
    })
}

/// The header of the segment in `bytes`, named for `first_seq`; or, for the last segment
/// at open (`Tail::Recover`), what a segment without one holds: a crash while the
/// committer started it, before its header was whole (no batch was written in it).
fn header(
    bytes: &[u8],
    first_seq: u64,
    tail: Tail,
) -> Result<Result<SegmentHeader, Scanned>, String> {
    let empty = |torn| Scanned {
        last_seq: first_seq - 1,
        end: 0,
        written: bytes.len() as u64,
        torn,
        tables: Vec::new(),
    };
    let header = match read_segment_header(bytes) {
        Ok(h) => h,
        Err(FormatError::Truncated) if tail == Tail::Recover => {
            return Ok(Err(empty(!bytes.is_empty())))
        }
        Err(_) if tail == Tail::Recover && all_zero(bytes) => return Ok(Err(empty(false))),
        Err(e) => return Err(format!("header: {e}")),
    };
    if header.first_seq != first_seq {
        return Err(format!(
            "header says it starts at batch {}, its name at {first_seq}",
            header.first_seq
        ));
    }
    Ok(Ok(header))
}

/// What follows the last whole record (batch `last_seq`) of the last segment at `pos`,
/// where a record is cut short or damaged (`error`): a torn end, unless a whole record
/// after it proves it was on disk (see `recovery.rs`).
fn torn_end(
    bytes: &[u8],
    pos: usize,
    last_seq: u64,
    header: SegmentHeader,
    error: &FormatError,
) -> Result<Scanned, String> {
    let written = bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let evidence = synced_after(&bytes[..written], pos, last_seq, !header.flags_synced);
    if let Some((at, seq)) = evidence {
        return Err(format!(
            "the record after batch {last_seq} at byte {pos} is damaged ({error}), yet batch \
             {seq} at byte {at}, written after it was on disk, is whole: this is damage to \
             data that was on disk, not a torn last write; the file was left as it is"
        ));
    }
    Ok(Scanned {
        last_seq,
        end: pos as u64,
        written: written as u64,
        torn: true,
        tables: header.tables,
    })
}

/// The first whole record in `bytes` after the damaged one at `from` that proves the
/// damaged bytes were on disk before it was written (it carries
/// [`format::SYNCED_BEFORE`], or `unflagged_proves` for a segment of the first format,
/// whose records cannot say): its offset and batch. `None` means everything after `from`
/// may be one torn last write. Whole records are followed one after the other; after a
/// damaged one the next is searched for ([`next_whole`]).
fn synced_after(
    bytes: &[u8],
    from: usize,
    last_seq: u64,
    unflagged_proves: bool,
) -> Option<(usize, u64)> {
    let (mut at, mut seq) = (from, last_seq);
    while let Some((found, record, len)) = next_whole(bytes, at, seq) {
        let (mut pos, mut record, mut len) = (found, record, len);
        loop {
            if record.synced_before || unflagged_proves {
                return Some((pos, record.seq));
            }
            seq = record.seq;
            pos += len;
            match read_record(&bytes[pos..]) {
                Ok((next, n)) if next.seq == seq + 1 => (record, len) = (next, n),
                _ => break,
            }
        }
        at = pos;
    }
    None
}

/// The first whole record after the damaged bytes at `from`, whose batch follows
/// `last_seq`: its offset, the record and its length. Tried first where the damaged
/// record says it ends (its length may be intact: then nothing inside its payload, where
/// a client's bytes lie, is taken for a record), then at every byte. A candidate's
/// checksum is computed only once its length fits and its batch number is in range, so
/// the search costs about a comparison per byte.
pub(crate) fn next_whole(
    bytes: &[u8],
    from: usize,
    last_seq: u64,
) -> Option<(usize, format::RecordRef<'_>, usize)> {
    let overhead = format::RECORD_OVERHEAD;
    let max_seq = last_seq + (bytes.len().saturating_sub(from) / overhead) as u64 + 1;
    let whole = |at: usize| {
        let rest = bytes.get(at..)?;
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let seq = u64::from_le_bytes(rest.get(4..12)?.try_into().ok()?) & !format::SYNCED_BEFORE;
        if len > rest.len().saturating_sub(overhead) || seq <= last_seq || seq > max_seq {
            return None;
        }
        let (record, n) = read_record(rest).ok()?;
        Some((at, record, n))
    };
    let claimed = bytes
        .get(from..from + 4)
        .and_then(|len| len.try_into().ok())
        .map(|len: [u8; 4]| from + overhead + u32::from_le_bytes(len) as usize);
    claimed
        .and_then(whole)
        .or_else(|| (from + 1..bytes.len()).find_map(whole))
}

/// Whether `bytes` are all zero: an OR over them, which the compiler vectorises (a
/// segment can end in tens of MiB of them).
fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |acc, &b| acc | b) == 0
}

/// A segment header's tables by id.
pub(crate) type Names = HashMap<u16, Arc<str>>;

/// The tables of a segment header, by id.
pub(crate) fn table_names(tables: &TableNames) -> Names {
    tables
        .iter()
        .map(|(id, name)| (*id, Arc::from(name.as_str())))
        .collect()
}

/// Hands one record's operations to `apply_op`, as slices of `file`.
pub(crate) fn apply_record(
    payload: &[u8],
    names: &Names,
    file: &Bytes,
    apply_op: &mut ApplyOp<'_>,
) -> Result<(), FormatError> {
    for op in format::ops(payload) {
        let op = op?;
        let name = names
            .get(&op.table)
            .ok_or(FormatError::Malformed("table id not in the segment header"))?;
        apply_op(
            name,
            file.slice_ref(op.key),
            op.value.map(|v| file.slice_ref(v)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment_header;

    /// A segment of `records` (batch, key, whether its write began after everything
    /// before it was synced).
    fn segment(records: &[(u64, &[u8], bool)]) -> Vec<u8> {
        let mut out = segment_header(records.first().map_or(1, |r| r.0), &[(0, "t".to_owned())]);
        for (seq, key, synced) in records {
            let mut payload = Vec::new();
            format::put_op(&mut payload, 0, key, Some(b"v"));
            format::put_record(&mut out, *seq, *synced, &payload);
        }
        out
    }

    /// Three records, each written and synced on its own (`--sync always`).
    fn synced_each() -> Vec<u8> {
        segment(&[(1, b"a", true), (2, b"b", true), (3, b"c", true)])
    }

    fn scan_bytes(bytes: &[u8], tail: Tail) -> Result<(Scanned, Overlay), SegmentDamage> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        std::fs::write(&path, bytes).unwrap();
        let mut changes = Changes::default();
        let scanned = scan(&path, 1, 0, tail, &mut changes.sink())?;
        Ok((scanned, changes.sorted()))
    }

    /// Where the second record of [`segment`]'s three starts.
    fn second() -> usize {
        segment(&[(1, b"a", true)]).len()
    }

    #[test]
    fn the_last_segment_recovers_to_its_last_whole_record_and_a_closed_one_is_whole() {
        let clean = synced_each();
        let (s, overlay) = scan_bytes(&clean, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.end, s.torn), (3, clean.len() as u64, false));
        assert_eq!(overlay[&Arc::from("t")].len(), 3);
        // Cut inside the last record: recovered to the first two.
        let (s, _) = scan_bytes(&clean[..clean.len() - 3], Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.torn), (2, true));
        // The same cut in a closed segment is damage.
        assert!(scan_bytes(&clean[..clean.len() - 3], Tail::Whole).is_err());
    }

    /// A flipped byte in the middle record, followed by a whole record written after it
    /// was synced: damage to data that was on disk, refused, naming the byte.
    #[test]
    fn damage_followed_by_a_record_written_after_a_sync_is_refused() {
        let mut damaged = synced_each();
        damaged[second() + 13] ^= 1;
        let e = scan_bytes(&damaged, Tail::Recover).unwrap_err();
        assert!(
            e.detail.contains(&format!("at byte {}", second())) && e.detail.contains("batch 3"),
            "{e}"
        );
        assert!(scan_bytes(&damaged, Tail::Whole).is_err());
        // Found as well when the damaged record's length is what was hit.
        let mut damaged = synced_each();
        damaged[second()] ^= 0x40;
        assert!(scan_bytes(&damaged, Tail::Recover).is_err());
    }

    /// The same flip, the records after it written without a sync in between (one group
    /// commit, or the interval policy between syncs): possibly a torn last write, so the
    /// segment ends before the damage. A power cut can persist a later page of a write
    /// and not an earlier one.
    #[test]
    fn damage_followed_only_by_records_of_the_same_write_is_a_torn_tail() {
        let mut damaged = segment(&[(1, b"a", true), (2, b"b", true), (3, b"c", false)]);
        damaged[second() + 13] ^= 1;
        let (s, _) = scan_bytes(&damaged, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.end, s.torn), (1, second() as u64, true));
    }

    #[test]
    fn sequence_gaps_are_damage() {
        let gap = segment(&[(1, b"a", true), (3, b"c", true)]);
        assert!(scan_bytes(&gap, Tail::Recover)
            .unwrap_err()
            .detail
            .contains("follows batch 1"));
    }

    #[test]
    fn the_search_for_a_whole_record_skips_garbage_and_finds_the_next_batch() {
        let clean = synced_each();
        let mut damaged = clean.clone();
        // The second record's length and batch number destroyed: found by the byte search.
        for b in &mut damaged[second()..second() + 12] {
            *b = 0xff;
        }
        let (at, record, _) = next_whole(&damaged, second(), 1).unwrap();
        assert_eq!(record.seq, 3);
        assert_eq!(&clean[at..], &damaged[at..]);
        assert!(next_whole(&damaged, at, 3).is_none());
    }
}
