//! `--data-dir` end to end: one statehub per directory, and what a damaged directory does
//! at start-up. The outcome must be one of the two documented in ARCHITECTURE.md:
//! refuse to start (exit 1) with an error that says the directory is damaged and names
//! it, or start holding exactly the writes before the damaged point (keys were written
//! one acknowledged request at a time, so that is a prefix of them) with a warning in the
//! log if any are missing. Never a gap, never a silent loss.

mod common;
#[path = "data_dir/full_disk.rs"]
mod full_disk;
#[path = "data_dir/raw.rs"]
mod raw;
#[path = "data_dir/repair.rs"]
mod repair;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{command, start, wait_exit, Server};
use raw::{key, scan, Raw};

/// Keys with 900 KiB values, enough to push a table file out of memory.
const BIG: usize = 24;
/// Keys with small values after them, still in the journal at shutdown.
const SMALL: usize = 40;

fn args(dir: &Path) -> Vec<String> {
    [
        "--mqtt-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--data-dir",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([dir.display().to_string()])
    .collect()
}

fn launch(dir: &Path) -> Server {
    let args = args(dir);
    start(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
}

/// Writes the keys one acknowledged SET at a time, then stops the server gracefully.
/// A persistent session, offline, gets every state store response of another
/// persistent session queued too, so the session table has records of its own.
/// Compaction after 4 MiB, so the journal is folded into a snapshot on the way.
fn fill(dir: &Path) {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "compact_after_mib = 4\n").unwrap();
    let mut args = args(dir);
    args.extend(["--config".to_owned(), config.path().display().to_string()]);
    let mut server = start(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]);
    drop(Raw::connect_persistent(server.mqtt, "keeper"));
    let mut c = Raw::connect_persistent(server.mqtt, "filler");
    for i in 0..BIG + SMALL {
        let value = vec![b'a' + (i % 26) as u8; if i < BIG { 900 << 10 } else { 100 }];
        assert_eq!(c.call(&[b"SET", &key(i), &value]), b"+OK\r\n");
        c.publish_to("clients/keeper/response", &value);
    }
    drop(c);
    // The journal's first segments are folded into a snapshot in the background; wait
    // for one, so the directory holds every kind of file.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !files(dir).iter().any(|f| {
        f.extension().is_some_and(|x| x == "snap") && std::fs::metadata(f).unwrap().len() > 1 << 20
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "no snapshot after writing {} MiB",
            (BIG * 900) >> 10
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::process::Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(wait_exit(&mut server.child, Duration::from_secs(10)).success());
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    for f in files(from) {
        let dest = to.join(f.strip_prefix(from).unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&f, dest).unwrap();
    }
}

fn flip_middle(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let len = bytes.len();
    if len == 0 {
        return;
    }
    let at = len / 2;
    for b in &mut bytes[at..(at + 4).min(len)] {
        *b ^= 0x5A;
    }
    std::fs::write(path, bytes).unwrap();
}

/// Starts statehub on a damaged copy and checks the outcome is a documented one.
fn outcome_is_documented(dir: &Path, what: &str) -> &'static str {
    let args = args(dir);
    let mut child = command(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            log.push_str(&String::from_utf8_lossy(&buf[..n]));
            let _ = tx.send(log.clone());
        }
    });
    // Either it exits, or it logs its MQTT address.
    let mut log = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
            log = l;
        }
        if let Some(status) = child.try_wait().unwrap() {
            while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
                log = l;
            }
            assert_eq!(status.code(), Some(1), "{what}: exit {status:?}\n{log}");
            assert!(
                log.contains("damaged") && log.contains(&dir.display().to_string()),
                "{what}: refusal must say damaged and name the directory:\n{log}"
            );
            return "refused";
        }
        if let Some(i) = log.find("mqtt listening on ") {
            let addr: SocketAddr = log[i + 18..]
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let stored = scan(&mut Raw::connect(addr, "checker"));
            let present: Vec<bool> = (0..BIG + SMALL).map(|i| stored.contains(&key(i))).collect();
            let kept = present.iter().take_while(|p| **p).count();
            assert!(
                present[kept..].iter().all(|p| !p),
                "{what}: recovered keys have a gap: {kept} then more"
            );
            if kept < BIG + SMALL {
                assert!(
                    log.contains("recovery discarded"),
                    "{what}: {} keys lost without a warning:\n{log}",
                    BIG + SMALL - kept
                );
            }
            let _ = child.kill();
            let _ = child.wait();
            return if kept == BIG + SMALL {
                "started, all kept"
            } else {
                "started, recovered a prefix"
            };
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: neither started nor exited:\n{log}"
        );
    }
}

#[test]
fn a_second_statehub_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = launch(dir.path());
    let args = args(dir.path());
    let mut child = command(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[])
        .spawn()
        .unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(10));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("in use by another statehub")
            && err.contains(&format!("pid {}", first.child.id())),
        "{err}"
    );
    // The first one is unharmed.
    let mut c = Raw::connect(first.mqtt, "still-here");
    assert_eq!(c.call(&[b"SET", b"k", b"v"]), b"+OK\r\n");
}

#[test]
fn every_damaged_file_gives_a_documented_outcome() {
    let source = tempfile::tempdir().unwrap();
    fill(source.path());
    let all = files(source.path());
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for file in all
        .iter()
        .filter(|f| !f.ends_with("LOCK") && !f.ends_with("lock"))
    {
        let rel = file.strip_prefix(source.path()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        flip_middle(&dir.path().join(rel));
        *seen
            .entry(outcome_is_documented(
                dir.path(),
                &format!("flipped {}", rel.display()),
            ))
            .or_default() += 1;
        let dir = tempfile::tempdir().unwrap();
        copy_dir(source.path(), dir.path());
        let target = dir.path().join(rel);
        let newest_segment = all
            .iter()
            .rfind(|f| f.extension().is_some_and(|x| x == "log"));
        if Some(file) == newest_segment {
            // A torn last write: the start of a batch that never completed.
            let mut bytes = std::fs::read(&target).unwrap();
            bytes.extend_from_slice(&[0x40, 0x01, 0x00, 0x00, 0x09, 0x00, 0x07]);
            std::fs::write(&target, bytes).unwrap();
            assert_eq!(
                outcome_is_documented(dir.path(), "torn journal tail"),
                "started, all kept"
            );
        } else {
            let len = std::fs::metadata(&target).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&target)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
            *seen
                .entry(outcome_is_documented(
                    dir.path(),
                    &format!("truncated {}", rel.display()),
                ))
                .or_default() += 1;
        }
    }
    eprintln!("damaged-file outcomes: {seen:?}");
    assert!(
        seen.get("refused").is_some_and(|n| *n > 0),
        "no damage was detected at all: {seen:?}"
    );
}

#[test]
fn data_dir_and_sync_come_from_flags_environment_or_file() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("from-env");
    let server = start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ],
        &[
            ("STATEHUB_DATA_DIR", data.to_str().unwrap()),
            ("STATEHUB_SYNC", "interval=20"),
        ],
    );
    let log = &server.startup;
    assert!(
        log.iter()
            .any(|l| l.contains(&format!("loaded from {}", data.display()))
                && l.contains("(sync interval=20)")),
        "{log:?}"
    );
    assert!(data.join("LOCK").exists());
    drop(server);

    let data = dir.path().join("from-file");
    let config = dir.path().join("statehub.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\nsync = \"always\"\n",
            data.display().to_string()
        ),
    )
    .unwrap();
    let server = start(
        &[
            "--mqtt-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let log = &server.startup;
    assert!(
        log.iter()
            .any(|l| l.contains(&format!("loaded from {}", data.display()))
                && l.contains("(sync always)")),
        "{log:?}"
    );
}

#[test]
fn bad_sync_settings_exit_2_with_a_clear_error() {
    let (status, err) = common::run_to_exit(&["--sync", "interval=5"]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("no data_dir"), "{err}");
    let (status, err) = common::run_to_exit(&[
        "--data-dir",
        "/tmp/never-created-by-statehub",
        "--sync",
        "sometimes",
    ]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("sometimes") && err.contains("interval=<ms>"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad-sync.toml");
    std::fs::write(&config, "data_dir = \"/tmp/x\"\nsync = \"weekly\"\n").unwrap();
    let (status, err) = common::run_to_exit(&["--config", config.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("sync") && err.contains("weekly") && err.contains(config.to_str().unwrap()),
        "{err}"
    );
    std::fs::write(&config, "data_dir = \"/tmp/x\"\ncompact_after_mib = 0\n").unwrap();
    let (status, err) = common::run_to_exit(&["--config", config.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains("compact_after_mib is 0") && err.contains(config.to_str().unwrap()),
        "{err}"
    );
    std::fs::write(&config, "data_dir = \"/tmp/x\"\nmax_journal_mib = 0\n").unwrap();
    let (status, err) = common::run_to_exit(&["--config", config.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("max_journal_mib is 0"), "{err}");
    std::fs::write(&config, "compact_after_mib = 8\n").unwrap();
    let (status, err) = common::run_to_exit(&["--config", config.to_str().unwrap()]);
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains("no data_dir"), "{err}");
}
