//! Issue 15's flipped bit, against the real binary: 1,000 SETs acknowledged under
//! `--sync always` (by twenty writers, so that they share fsyncs), the server killed, one bit flipped 10% into the newest journal
//! segment. Every batch after the flip was written after it had been synced, so this
//! is damage, not a torn write: `statehub serve` refuses to start, naming the file and
//! the byte, and leaves every byte of the directory as it was. `statehub repair` then
//! keeps every intact batch, says which one it lost, and the server starts with the
//! other 999 keys.

use std::process::{Command, Stdio};

use super::*;

/// Every file of `dir` but the lock (which holds the pid of whoever opened it last).
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    files(dir)
        .into_iter()
        .filter(|f| !f.ends_with("LOCK"))
        .map(|f| {
            let bytes = std::fs::read(&f).unwrap();
            (f, bytes)
        })
        .collect()
}

/// `statehub repair --data-dir DIR`: exit status, stdout, stderr.
fn run_repair(dir: &Path) -> (std::process::ExitStatus, String, String) {
    let out = Command::new(common::BIN)
        .args(["repair", "--data-dir"])
        .arg(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = |b: Vec<u8>| common::strip_ansi(&String::from_utf8_lossy(&b));
    (out.status, text(out.stdout), text(out.stderr))
}

/// The number after `at byte ` in `text`.
fn byte_named(text: &str) -> u64 {
    let at = text.find("at byte ").expect("a byte offset") + 8;
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_flipped_bit_under_sync_always_is_refused_naming_the_file_then_repaired() {
    const KEYS: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let mut server = launch(dir.path());
    // Twenty writers, one request at a time each: acknowledged SETs sharing fsyncs.
    let addr = server.mqtt;
    let writers: Vec<_> = (0..20)
        .map(|w| {
            std::thread::spawn(move || {
                let mut c = Raw::connect(addr, &format!("writer-{w}"));
                for i in (w..KEYS).step_by(20) {
                    assert_eq!(c.call(&[b"SET", &key(i), b"value"]), b"+OK\r\n");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let segment = files(dir.path())
        .into_iter()
        .rfind(|f| f.extension().is_some_and(|x| x == "log"))
        .unwrap();
    let mut bytes = std::fs::read(&segment).unwrap();
    let written = bytes.iter().rposition(|&b| b != 0).unwrap() + 1;
    let at = written / 10;
    bytes[at] ^= 0x10;
    std::fs::write(&segment, &bytes).unwrap();
    let before = contents(dir.path());

    let args = args(dir.path());
    let (status, err) = common::run_to_exit(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("damaged")
            && err.contains(&segment.display().to_string())
            && err.contains("statehub repair"),
        "the refusal must name the file and the way out:\n{err}"
    );
    let named = byte_named(&err);
    assert!(
        named <= at as u64 && at as u64 - named < 200,
        "names byte {named} for a flip at {at}:\n{err}"
    );
    assert!(
        contents(dir.path()) == before,
        "the refused directory was changed"
    );

    let (status, report, err) = run_repair(dir.path());
    assert!(status.success(), "{report}\n{err}");
    assert!(
        report.contains("lost:") && report.contains(&segment.display().to_string()),
        "{report}"
    );
    let server = launch(dir.path());
    let stored = scan(&mut Raw::connect(server.mqtt, "checker"));
    let missing: Vec<usize> = (0..KEYS).filter(|i| !stored.contains(&key(*i))).collect();
    assert_eq!(missing.len(), 1, "lost {missing:?}; report:\n{report}");
    assert_eq!(stored.len(), KEYS - 1);
    assert!(
        report.contains(&format!("batch {}", missing[0] + 1)) || report.contains("batches"),
        "{report}"
    );
}
