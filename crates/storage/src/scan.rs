//! The journal's reading side: a segment's records checked and handed over operation by
//! operation, at open (`recovery.rs`), for reads (`store.rs`) and by the compactor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;

use crate::format::{self, read_record, read_segment_header, FormatError, TableNames};

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
    /// The last segment at open: whatever follows its last whole record is discarded
    /// (see `recovery.rs` for why).
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
    let written = bytes.len() as u64;
    let header = match read_segment_header(&bytes) {
        Ok(h) => h,
        // A crash while the committer started the segment, before its header was
        // whole: no batch was written in it.
        Err(FormatError::Truncated) if tail == Tail::Recover => {
            return Ok(Scanned {
                last_seq: first_seq - 1,
                end: 0,
                written,
                torn: written > 0,
                tables: Vec::new(),
            });
        }
        Err(_) if tail == Tail::Recover && all_zero(&bytes) => {
            return Ok(Scanned {
                last_seq: first_seq - 1,
                end: 0,
                written,
                torn: false,
                tables: Vec::new(),
            });
        }
        Err(e) => return Err(damage(format!("header: {e}"))),
    };
    if header.first_seq != first_seq {
        return Err(damage(format!(
            "header says it starts at batch {}, its name at {first_seq}",
            header.first_seq
        )));
    }
    let names: HashMap<u16, Arc<str>> = header
        .tables
        .iter()
        .map(|(id, name)| (*id, Arc::from(name.as_str())))
        .collect();
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
                    let written = bytes
                        .iter()
                        .rposition(|&b| b != 0)
                        .map_or(0, |i| i as u64 + 1);
                    return Ok(Scanned {
                        last_seq,
                        end: pos as u64,
                        written,
                        torn: true,
                        tables: header.tables,
                    });
                }
                _ => {
                    return Err(damage(format!(
                        "record after batch {last_seq} at byte {pos}: {e}"
                    )))
                }
            },
        };
        if record.seq != last_seq + 1 {
            return Err(damage(format!(
                "batch {} follows batch {last_seq} at byte {pos}",
                record.seq
            )));
        }
        if let Tail::Live { upto } = tail {
            if record.seq > upto {
                break;
            }
        }
        if record.seq > after {
            apply(record.payload, &names, &bytes, apply_op)
                .map_err(|e| damage(format!("batch {}: {e}", record.seq)))?;
        }
        last_seq = record.seq;
        pos += len;
    }
    Ok(Scanned {
        last_seq,
        end: pos as u64,
        written,
        torn: false,
        tables: header.tables,
    })
}

/// Whether `bytes` are all zero: an OR over them, which the compiler vectorises (a
/// segment can end in tens of MiB of them).
fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().fold(0u8, |acc, &b| acc | b) == 0
}

/// Hands one record's operations to `apply_op`, as slices of `file`.
fn apply(
    payload: &[u8],
    names: &HashMap<u16, Arc<str>>,
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

    fn segment(records: &[(u64, &[u8])]) -> Vec<u8> {
        let mut out = segment_header(records.first().map_or(1, |r| r.0), &[(0, "t".to_owned())]);
        for (seq, key) in records {
            let mut payload = Vec::new();
            format::put_op(&mut payload, 0, key, Some(b"v"));
            format::put_record(&mut out, *seq, &payload);
        }
        out
    }

    fn scan_bytes(bytes: &[u8], tail: Tail) -> Result<(Scanned, Overlay), SegmentDamage> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.log");
        std::fs::write(&path, bytes).unwrap();
        let mut changes = Changes::default();
        let scanned = scan(&path, 1, 0, tail, &mut changes.sink())?;
        Ok((scanned, changes.sorted()))
    }

    #[test]
    fn the_last_segment_recovers_to_its_last_whole_record_and_a_closed_one_is_whole() {
        let clean = segment(&[(1, b"a"), (2, b"b"), (3, b"c")]);
        let (s, overlay) = scan_bytes(&clean, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.end, s.torn), (3, clean.len() as u64, false));
        assert_eq!(overlay[&Arc::from("t")].len(), 3);
        // Cut inside the last record: recovered to the first two.
        let (s, _) = scan_bytes(&clean[..clean.len() - 3], Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.torn), (2, true));
        // The same cut in a closed segment is damage.
        assert!(scan_bytes(&clean[..clean.len() - 3], Tail::Whole).is_err());
        // A flipped byte in the middle record: the last segment ends before it (a power
        // cut can persist a later page of the last write and not an earlier one), a
        // closed segment is damaged.
        let second = segment(&[(1, b"a")]).len() + 13;
        let mut damaged = clean.clone();
        damaged[second] ^= 1;
        let (s, _) = scan_bytes(&damaged, Tail::Recover).unwrap();
        assert_eq!((s.last_seq, s.torn), (1, true));
        assert!(scan_bytes(&damaged, Tail::Whole).is_err());
    }

    #[test]
    fn sequence_gaps_are_damage() {
        let gap = segment(&[(1, b"a"), (3, b"c")]);
        assert!(scan_bytes(&gap, Tail::Recover)
            .unwrap_err()
            .detail
            .contains("follows batch 1"));
    }
}
