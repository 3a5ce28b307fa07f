//! Storage recovery: a data directory with damaged or arbitrary files, opened with the
//! public API only ([`Store::open`]), so it does not depend on the file formats.
//!
//! A base directory is made once through the public API (two tables, a snapshot and a
//! journal after it, a manifest) and its files are read into memory. Each input is a
//! list of edits to those files; the edited set is written into a fresh directory
//! (under `/dev/shm` when there is one: no disk I/O) and opened. Each edit is a file
//! (index into the base files, by name), an operation (overwrite at an offset,
//! truncate, replace the whole file, append) and the bytes.
//!
//! Asserted: no panic, no hang; the open either fails with an error or succeeds, and
//! then every table reads to its end (records or a `Corrupt` error) and the store
//! closes.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use statehub_storage::{Batch, Options, Store, SyncPolicy};

use crate::input::Input;

/// The base directory's files: path relative to the directory, contents.
type Files = Vec<(PathBuf, Vec<u8>)>;

fn options() -> Options {
    Options {
        sync: SyncPolicy::Interval(Duration::from_secs(3600)),
        segment_bytes: 1024,
        compact_after_bytes: 1024,
        ..Options::default()
    }
}

fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new()
            .prefix("statehub-fuzz")
            .tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    dir.expect("a scratch directory")
}

/// Two tables written in five batches, a snapshot of the first three, the last two
/// in the journal.
fn base() -> &'static Files {
    static BASE: OnceLock<Files> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = scratch();
        let store = Store::open(dir.path(), options()).expect("open an empty store");
        let (t, u) = (store.table("t").expect("t"), store.table("u").expect("u"));
        for b in 0..5u8 {
            let mut batch = Batch::new();
            batch.put(&t, &[b'k', b], &[b; 40]).expect("put");
            batch.put(&u, b"same", &[b]).expect("put");
            if b == 3 {
                batch.delete(&t, &[b'k', 0]).expect("delete");
            }
            store
                .submit(batch)
                .expect("submit")
                .wait()
                .expect("durable");
            if b == 2 {
                store.compact().expect("compact");
            }
        }
        store.close().expect("close");
        drop(store);
        let mut files = Vec::new();
        collect(dir.path(), dir.path(), &mut files);
        files.sort();
        files
    })
}

fn collect(root: &Path, dir: &Path, out: &mut Files) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, out);
        } else if path.file_name().is_some_and(|n| n != "LOCK") {
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            out.push((rel, std::fs::read(&path).expect("read")));
        }
    }
}

/// Storage recovery from damaged files.
pub fn storage_recovery(data: &[u8]) {
    let mut files = base().clone();
    let mut input = Input::new(data);
    while !input.is_empty() {
        let which = usize::from(input.byte()) % files.len();
        let op = input.byte();
        let offset = usize::from(u16::from_be_bytes([input.byte(), input.byte()]));
        let bytes = input.chunk();
        let file = &mut files[which].1;
        match op % 4 {
            0 => {
                let start = offset.min(file.len());
                let end = (start + bytes.len()).min(file.len());
                file[start..end].copy_from_slice(&bytes[..end - start]);
            }
            1 => file.truncate(offset),
            2 => *file = bytes.to_vec(),
            _ => file.extend_from_slice(bytes),
        }
    }
    let dir = scratch();
    for (rel, contents) in &files {
        let path = dir.path().join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&path, contents).expect("write");
    }
    let Ok(store) = Store::open(dir.path(), options()) else {
        return;
    };
    for name in ["t", "u", "other"] {
        let Ok(table) = store.table(name) else {
            continue;
        };
        for record in table.iter() {
            if record.is_err() {
                break;
            }
        }
        let _ = table.get(b"same");
    }
    let _ = store.close();
}
