//! Snapshots: every live record of every table as of one batch, in one file, sorted.
//!
//! ```text
//! header  "SHSNAP01" | seq u64                     (the last batch the snapshot holds)
//! block   len u32 | table u16 | count u32 | count × (key_len u16, key, value_len u32,
//!         value) | crc u32                          (len counts table..records)
//! footer  tables u16 | tables × (id u16, name_len u8, name, first_block u64, blocks u32,
//!         records u64) | footer_len u32 | crc u32 | "SHSNAPEN"
//! ```
//!
//! Blocks hold one table's records in key order, about [`BLOCK_BYTES`] each; a table's
//! blocks are contiguous. The footer's checksum covers the header and the table list,
//! and each block has its own, so any flipped byte is found: the footer's when the file
//! is opened, a block's when it is read. A snapshot is written under a temporary name,
//! synced, and renamed into place, so a snapshot file is either whole or damaged, never
//! half written.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::format::{crc, FormatError, Reader};

const MAGIC: &[u8; 8] = b"SHSNAP01";
const END_MAGIC: &[u8; 8] = b"SHSNAPEN";
const HEADER_LEN: u64 = 16;
const TRAILER_LEN: u64 = 4 + 4 + 8;
/// Target size of a block.
pub(crate) const BLOCK_BYTES: usize = 64 << 10;
/// Largest block a reader accepts: the target plus one record of the largest key and
/// value, and their lengths.
const MAX_BLOCK_BYTES: usize = BLOCK_BYTES + crate::MAX_KEY_LEN + crate::MAX_VALUE_LEN + 16;

/// Damage found in a snapshot: the file and what is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {detail}", path.display())]
pub(crate) struct SnapshotDamage {
    pub(crate) path: PathBuf,
    pub(crate) detail: String,
}

impl SnapshotDamage {
    fn new(path: &Path, detail: impl std::fmt::Display) -> Self {
        Self {
            path: path.to_owned(),
            detail: detail.to_string(),
        }
    }
}

/// One table's place in a snapshot.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotTable {
    pub(crate) name: String,
    first_block: u64,
    blocks: u32,
    pub(crate) records: u64,
}

/// An opened snapshot: its header and footer read and checked.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) path: PathBuf,
    pub(crate) seq: u64,
    pub(crate) len: u64,
    pub(crate) tables: Vec<SnapshotTable>,
}

impl Snapshot {
    /// Reads and checks the header and footer of the snapshot at `path`.
    pub(crate) fn open(path: &Path) -> Result<Snapshot, SnapshotDamage> {
        let damage = |detail: &dyn std::fmt::Display| SnapshotDamage::new(path, detail);
        let mut file = File::open(path).map_err(|e| damage(&e))?;
        let len = file.metadata().map_err(|e| damage(&e))?.len();
        if len < HEADER_LEN + TRAILER_LEN {
            return Err(damage(&"cut short"));
        }
        let mut header = [0u8; HEADER_LEN as usize];
        file.read_exact(&mut header).map_err(|e| damage(&e))?;
        let mut trailer = [0u8; TRAILER_LEN as usize];
        file.seek(SeekFrom::Start(len - TRAILER_LEN))
            .map_err(|e| damage(&e))?;
        file.read_exact(&mut trailer).map_err(|e| damage(&e))?;
        if &header[..8] != MAGIC || &trailer[8..] != END_MAGIC {
            return Err(damage(&FormatError::Magic("snapshot")));
        }
        let footer_len = u64::from(u32::from_le_bytes([
            trailer[0], trailer[1], trailer[2], trailer[3],
        ]));
        let footer_crc = u32::from_le_bytes([trailer[4], trailer[5], trailer[6], trailer[7]]);
        let footer_start = (len - TRAILER_LEN)
            .checked_sub(footer_len)
            .filter(|&s| s >= HEADER_LEN);
        let footer_start = footer_start.ok_or_else(|| damage(&"footer length out of range"))?;
        let mut footer = vec![0u8; footer_len as usize];
        file.seek(SeekFrom::Start(footer_start))
            .map_err(|e| damage(&e))?;
        file.read_exact(&mut footer).map_err(|e| damage(&e))?;
        let mut summed = header.to_vec();
        summed.extend_from_slice(&footer);
        summed.extend_from_slice(&trailer[..4]);
        if crc(&summed) != footer_crc {
            return Err(damage(&FormatError::Checksum));
        }
        let seq = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        let tables = read_footer(&footer, footer_start).map_err(|e| damage(&e))?;
        Ok(Snapshot {
            path: path.to_owned(),
            seq,
            len,
            tables,
        })
    }

    /// The table named `name`, if the snapshot holds it.
    pub(crate) fn table(&self, name: &str) -> Option<&SnapshotTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The records of table `name`, in key order, read a block at a time. The file is
    /// opened now (so a compaction may remove it meanwhile); an error opening it is the
    /// first item.
    pub(crate) fn records(&self, name: &str) -> SnapshotRecords {
        self.read(name, false)
    }

    /// [`Snapshot::records`] for a repair: a block that fails its checksum (but whose
    /// length is in range) is an `Err` item, and the records of the next block follow.
    pub(crate) fn salvage(&self, name: &str) -> SnapshotRecords {
        self.read(name, true)
    }

    fn read(&self, name: &str, salvage: bool) -> SnapshotRecords {
        let table = self.table(name).cloned();
        let first_block = table.as_ref().map_or(0, |t| t.first_block);
        let blocks_left = table.as_ref().map_or(0, |t| t.blocks);
        let file = (blocks_left > 0).then(|| {
            let mut file = File::open(&self.path)?;
            file.seek(SeekFrom::Start(first_block))?;
            Ok(BufReader::with_capacity(BLOCK_BYTES + 64, file))
        });
        SnapshotRecords {
            path: self.path.clone(),
            file,
            blocks_left,
            block: Bytes::new(),
            failed: false,
            salvage,
            offset: first_block,
        }
    }
}

/// Parses the table list of a footer and checks that the blocks lie inside the file.
fn read_footer(footer: &[u8], footer_start: u64) -> Result<Vec<SnapshotTable>, FormatError> {
    let mut r = Reader::new(footer);
    let n = r.u16()?;
    let mut tables = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        let _id = r.u16()?;
        let name = r.name()?;
        let first_block = r.u64()?;
        let blocks = r.u32()?;
        let records = r.u64()?;
        if first_block < HEADER_LEN || first_block > footer_start {
            return Err(FormatError::Malformed("block offset out of range"));
        }
        tables.push(SnapshotTable {
            name: name.to_owned(),
            first_block,
            blocks,
            records,
        });
    }
    if !r.is_empty() {
        return Err(FormatError::Malformed("bytes after the table list"));
    }
    Ok(tables)
}

/// Streams one table's records out of a snapshot; see [`Snapshot::records`].
#[derive(Debug)]
pub(crate) struct SnapshotRecords {
    path: PathBuf,
    /// `None` when the table has no blocks.
    file: Option<std::io::Result<BufReader<File>>>,
    blocks_left: u32,
    /// What is left of the current block's records.
    block: Bytes,
    failed: bool,
    /// Whether a damaged block is skipped instead of ending the records.
    salvage: bool,
    /// Where the next block starts in the file.
    offset: u64,
}

impl SnapshotRecords {
    fn damage(&mut self, detail: impl std::fmt::Display) -> SnapshotDamage {
        self.failed = true;
        SnapshotDamage::new(&self.path, detail)
    }

    /// Reads the next block into `self.block` (its records only).
    fn load_block(&mut self) -> Result<(), SnapshotDamage> {
        let file = match self.file.as_mut() {
            Some(Ok(file)) => file,
            Some(Err(e)) => {
                let e = e.to_string();
                return Err(self.damage(e));
            }
            None => return Err(self.damage("no blocks")),
        };
        let mut len = [0u8; 4];
        if let Err(e) = file.read_exact(&mut len) {
            return Err(self.damage(e));
        }
        let body_len = u32::from_le_bytes(len) as usize;
        if !(6..=MAX_BLOCK_BYTES).contains(&body_len) {
            return Err(self.damage("block length out of range"));
        }
        let mut block = vec![0u8; 4 + body_len + 4];
        block[..4].copy_from_slice(&len);
        let read = file.read_exact(&mut block[4..]);
        if let Err(e) = read {
            return Err(self.damage(e));
        }
        let sum_at = 4 + body_len;
        let stored = u32::from_le_bytes(block[sum_at..].try_into().unwrap_or_default());
        let at = self.offset;
        self.offset += block.len() as u64;
        if crc(&block[..sum_at]) != stored {
            let detail = format!("block at byte {at}: {}", FormatError::Checksum);
            if self.salvage {
                self.blocks_left -= 1;
                return Err(SnapshotDamage::new(&self.path, detail));
            }
            return Err(self.damage(detail));
        }
        block.truncate(sum_at);
        self.blocks_left -= 1;
        // table u16, count u32, then the records.
        self.block = Bytes::from(block).slice(4 + 2 + 4..);
        Ok(())
    }

    fn next_record(&mut self) -> Result<Option<(Bytes, Bytes)>, SnapshotDamage> {
        while self.block.is_empty() {
            if self.blocks_left == 0 {
                return Ok(None);
            }
            self.load_block()?;
        }
        let mut r = Reader::new(&self.block);
        let parsed = (|| {
            let key_len = usize::from(r.u16()?);
            let key_at = r.pos();
            r.take(key_len)?;
            let value_len = r.u32()? as usize;
            let value_at = r.pos();
            r.take(value_len)?;
            Ok::<_, FormatError>((key_at, key_len, value_at, value_len, r.pos()))
        })();
        let (key_at, key_len, value_at, value_len, end) = parsed.map_err(|e| self.damage(e))?;
        let key = self.block.slice(key_at..key_at + key_len);
        let value = self.block.slice(value_at..value_at + value_len);
        self.block = self.block.slice(end..);
        Ok(Some((key, value)))
    }
}

impl Iterator for SnapshotRecords {
    type Item = Result<(Bytes, Bytes), SnapshotDamage>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        self.next_record().transpose()
    }
}

/// Writes a snapshot: tables in turn, each one's records in key order.
pub(crate) struct SnapshotWriter {
    file: BufWriter<File>,
    path: PathBuf,
    /// Bytes written so far.
    offset: u64,
    header: [u8; HEADER_LEN as usize],
    footer: Vec<u8>,
    tables: u16,
    /// The table being written: id, first block, blocks, records.
    current: Option<(u16, u64, u32, u64)>,
    block: Vec<u8>,
    block_records: u32,
}

impl SnapshotWriter {
    /// Starts a snapshot of the store as of batch `seq` at `path` (a temporary name).
    pub(crate) fn create(path: &Path, seq: u64) -> std::io::Result<Self> {
        let file = File::create(path)?;
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&seq.to_le_bytes());
        let mut file = BufWriter::with_capacity(1 << 20, file);
        file.write_all(&header)?;
        Ok(Self {
            file,
            path: path.to_owned(),
            offset: HEADER_LEN,
            header,
            footer: vec![0, 0],
            tables: 0,
            current: None,
            block: Vec::with_capacity(BLOCK_BYTES + 1024),
            block_records: 0,
        })
    }

    /// Starts table `name` (id `id`); ends the previous one.
    pub(crate) fn begin_table(&mut self, id: u16, name: &str) -> std::io::Result<()> {
        self.end_table()?;
        self.footer.extend_from_slice(&id.to_le_bytes());
        self.footer.push(name.len() as u8);
        self.footer.extend_from_slice(name.as_bytes());
        self.current = Some((id, self.offset, 0, 0));
        self.tables += 1;
        Ok(())
    }

    /// Adds a record to the current table; keys must come in increasing order.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        self.block
            .extend_from_slice(&(key.len() as u16).to_le_bytes());
        self.block.extend_from_slice(key);
        self.block
            .extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.block.extend_from_slice(value);
        self.block_records += 1;
        if let Some(current) = self.current.as_mut() {
            current.3 += 1;
        }
        if self.block.len() >= BLOCK_BYTES {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> std::io::Result<()> {
        let Some((id, _, blocks, _)) = self.current.as_mut() else {
            return Ok(());
        };
        if self.block_records == 0 {
            return Ok(());
        }
        let body_len = 2 + 4 + self.block.len();
        let mut head = Vec::with_capacity(10);
        head.extend_from_slice(&(body_len as u32).to_le_bytes());
        head.extend_from_slice(&id.to_le_bytes());
        head.extend_from_slice(&self.block_records.to_le_bytes());
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&head);
        hasher.update(&self.block);
        self.file.write_all(&head)?;
        self.file.write_all(&self.block)?;
        self.file.write_all(&hasher.finalize().to_le_bytes())?;
        self.offset += (head.len() + self.block.len() + 4) as u64;
        *blocks += 1;
        self.block.clear();
        self.block_records = 0;
        Ok(())
    }

    fn end_table(&mut self) -> std::io::Result<()> {
        self.flush_block()?;
        if let Some((_, first, blocks, records)) = self.current.take() {
            self.footer.extend_from_slice(&first.to_le_bytes());
            self.footer.extend_from_slice(&blocks.to_le_bytes());
            self.footer.extend_from_slice(&records.to_le_bytes());
        }
        Ok(())
    }

    /// Writes the footer and syncs the file; returns its path and length.
    pub(crate) fn finish(mut self) -> std::io::Result<(PathBuf, u64)> {
        self.end_table()?;
        self.footer[..2].copy_from_slice(&self.tables.to_le_bytes());
        let footer_len = (self.footer.len() as u32).to_le_bytes();
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&self.header);
        hasher.update(&self.footer);
        hasher.update(&footer_len);
        self.file.write_all(&self.footer)?;
        self.file.write_all(&footer_len)?;
        self.file.write_all(&hasher.finalize().to_le_bytes())?;
        self.file.write_all(END_MAGIC)?;
        let len = self.offset + self.footer.len() as u64 + TRAILER_LEN;
        let file = self
            .file
            .into_inner()
            .map_err(std::io::IntoInnerError::into_error)?;
        file.sync_all()?;
        Ok((self.path, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Records = Vec<(Vec<u8>, Vec<u8>)>;

    fn write(path: &Path, tables: &[(&str, Records)]) -> u64 {
        let mut w = SnapshotWriter::create(path, 77).unwrap();
        for (i, (name, records)) in tables.iter().enumerate() {
            w.begin_table(i as u16, name).unwrap();
            for (k, v) in records {
                w.put(k, v).unwrap();
            }
        }
        w.finish().unwrap().1
    }

    fn read(s: &Snapshot, name: &str) -> Result<Records, SnapshotDamage> {
        s.records(name)
            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .collect()
    }

    #[test]
    fn tables_round_trip_across_many_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let big: Records = (0..5000u32)
            .map(|i| (format!("k{i:06}").into_bytes(), vec![(i % 251) as u8; 100]))
            .collect();
        let small = vec![(b"a".to_vec(), b"".to_vec())];
        let len = write(
            &path,
            &[
                ("big", big.clone()),
                ("empty", vec![]),
                ("small", small.clone()),
            ],
        );
        let s = Snapshot::open(&path).unwrap();
        assert_eq!((s.seq, s.len), (77, len));
        assert_eq!(s.table("big").unwrap().records, 5000);
        assert_eq!(read(&s, "big").unwrap(), big);
        assert_eq!(read(&s, "small").unwrap(), small);
        assert!(read(&s, "empty").unwrap().is_empty());
        assert!(read(&s, "absent").unwrap().is_empty());
    }

    #[test]
    fn damage_is_found_at_open_or_when_the_block_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        let records: Records = (0..2000u32)
            .map(|i| (i.to_be_bytes().to_vec(), vec![7; 90]))
            .collect();
        let len = write(&path, &[("t", records)]) as usize;
        let clean = std::fs::read(&path).unwrap();
        for at in [0, 9, 20, len / 3, len / 2, len - 30, len - 12, len - 3] {
            let mut damaged = clean.clone();
            damaged[at] ^= 0x5A;
            std::fs::write(&path, &damaged).unwrap();
            let caught = match Snapshot::open(&path) {
                Err(_) => true,
                Ok(s) => read(&s, "t").is_err(),
            };
            assert!(caught, "flip at {at} of {len} not caught");
        }
        for cut in [len / 2, len - 1, 10] {
            std::fs::write(&path, &clean[..cut]).unwrap();
            assert!(Snapshot::open(&path).is_err(), "cut at {cut} not caught");
        }
    }
}
