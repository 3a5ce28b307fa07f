//! Web PubSub access keys are refused at start-up when empty or short: tokens are
//! HMACs keyed with them, and an empty key (a trailing comma in `STATEHUB_ACCESS_KEYS`,
//! `--access-key ""`) would let anyone mint valid tokens.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{command, connect_tcp, start, strip_ansi, wait_exit};

const LOCAL: [&str; 4] = [
    "--mqtt-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

/// Runs the binary, which must exit with status 2; returns its stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = command(&[&LOCAL[..], args].concat(), env)
        .spawn()
        .expect("spawn statehub");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let err = strip_ansi(&reader.join().unwrap());
    assert_eq!(status.code(), Some(2), "stderr: {err}");
    err
}

#[test]
fn a_trailing_comma_in_the_environment_is_refused() {
    let err = refused(
        &[],
        &[("STATEHUB_ACCESS_KEYS", "0123456789abcdef-primary,")],
    );
    assert!(
        err.contains("STATEHUB_ACCESS_KEYS")
            && err.contains("access key 2 of 2 is 0 bytes")
            && err.contains("at least 16 bytes"),
        "stderr: {err}"
    );
}

#[test]
fn an_empty_or_short_key_flag_is_refused() {
    let err = refused(&["--access-key", ""], &[]);
    assert!(
        err.contains("--access-key") && err.contains("is 0 bytes"),
        "stderr: {err}"
    );
    let err = refused(&["--access-key", "short-key"], &[]);
    assert!(err.contains("is 9 bytes"), "stderr: {err}");
}

#[test]
fn a_short_key_in_the_config_file_is_refused() {
    let path = std::env::temp_dir().join(format!(
        "statehub-test-{}-short-key.toml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        "[webpubsub]\naccess_keys = [\"0123456789abcdef\", \"k\"]\n",
    )
    .unwrap();
    let err = refused(&["--config", path.to_str().unwrap()], &[]);
    let _ = std::fs::remove_file(&path);
    assert!(
        err.contains(path.to_str().unwrap()) && err.contains("access key 2 of 2 is 1 bytes"),
        "stderr: {err}"
    );
}

#[test]
fn a_key_of_16_bytes_starts_the_service() {
    let server = start(&LOCAL, &[("STATEHUB_ACCESS_KEYS", "0123456789abcdef")]);
    let mut s = connect_tcp(server.http);
    s.write_all(b"HEAD /api/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    assert!(
        resp.starts_with("HTTP/1.1 200"),
        "the REST API is mounted: {resp}"
    );
}
