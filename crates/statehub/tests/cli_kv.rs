//! `statehub kv` against a running statehub: every verb, its exit codes (0 done,
//! 1 not found, 2 usage, 3 refused, 4 transport, 5 timeout), `--json` parsed, binary
//! keys and values, SCAN paging, and watch.

mod cli_support;
mod common;

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use cli_support::{at, cli, command, eventually, hlc_now, run, server, spawn};
use serde_json::json;

fn is_version(v: &serde_json::Value) -> bool {
    let s = v.as_str().unwrap_or_default();
    let parts: Vec<&str> = s.splitn(3, ':').collect();
    parts.len() == 3 && parts[0].len() == 15 && parts[1].len() == 5 && !parts[2].is_empty()
}

#[test]
fn set_get_del_vdel_and_their_exit_codes() {
    let s = server(&[]);
    let a = s.mqtt;
    assert_eq!(cli(a, &["kv", "set", "k", "v1"]).expect(0).text(), "OK\n");
    assert_eq!(cli(a, &["kv", "get", "k"]).expect(0).text(), "v1\n");
    let missing = cli(a, &["kv", "get", "nope"]).expect(1);
    assert!(missing.stdout.is_empty());
    assert!(missing.stderr.contains("not found: nope"), "{missing:?}");
    assert_eq!(cli(a, &["kv", "del", "k"]).expect(0).text(), "deleted\n");
    assert!(cli(a, &["kv", "del", "k"]).expect(1).stdout.is_empty());

    cli(a, &["kv", "set", "k", "v"]).expect(0);
    let mismatch = cli(a, &["kv", "vdel", "k", "other"]).expect(3);
    assert!(
        mismatch.stderr.contains("holds another value"),
        "{mismatch:?}"
    );
    assert_eq!(cli(a, &["kv", "get", "k"]).expect(0).text(), "v\n");
    cli(a, &["kv", "vdel", "k", "v"]).expect(0);
    cli(a, &["kv", "vdel", "k", "v"]).expect(1);
}

#[test]
fn nx_nex_and_px() {
    let s = server(&[]);
    let a = s.mqtt;
    cli(a, &["kv", "set", "lock", "me", "--nx"]).expect(0);
    let taken = cli(a, &["kv", "set", "lock", "you", "--nx"]).expect(3);
    assert!(taken.stderr.contains("exists"), "{taken:?}");
    cli(a, &["kv", "set", "lock", "me", "--nex"]).expect(0);
    cli(a, &["kv", "set", "lock", "you", "--nex"]).expect(3);
    assert_eq!(cli(a, &["kv", "get", "lock"]).expect(0).text(), "me\n");
    cli(a, &["kv", "set", "lock", "x", "--nx", "--nex"]).expect(2);
    cli(a, &["kv", "set", "lock", "x", "--px", "0"]).expect(2);

    // PX: the key is gone once the store's expiry ran.
    cli(a, &["kv", "set", "short", "lived", "--px", "200"]).expect(0);
    eventually("the PX key expires", || {
        cli(a, &["kv", "get", "short"]).code == 1
    });
}

#[test]
fn fencing_tokens() {
    let s = server(&[]);
    let a = s.mqtt;
    let token = hlc_now("lease");
    let older = "000000000000001:00000:lease";
    cli(a, &["kv", "set", "res", "v1", "--fencing-token", &token]).expect(0);
    let bare = cli(a, &["kv", "set", "res", "v2"]).expect(3);
    assert!(
        bare.stderr.contains("a fencing token is required"),
        "{bare:?}"
    );
    let low = cli(a, &["kv", "set", "res", "v2", "--fencing-token", older]).expect(3);
    assert!(low.stderr.contains("lower version"), "{low:?}");
    cli(a, &["kv", "set", "res", "v2", "--fencing-token", &token]).expect(0);
    cli(a, &["kv", "del", "res"]).expect(3);
    cli(a, &["kv", "vdel", "res", "v2"]).expect(3);
    cli(a, &["kv", "del", "res", "--fencing-token", &token]).expect(0);
    let bad = cli(
        a,
        &["kv", "set", "res", "v", "--fencing-token", "yesterday"],
    )
    .expect(2);
    assert!(bad.stderr.contains("--fencing-token"), "{bad:?}");
}

#[test]
fn json_output() {
    let s = server(&[]);
    let a = s.mqtt;
    let set = cli(a, &["kv", "set", "k", "v", "--json"]).expect(0).json();
    assert_eq!(set["key"], "k");
    assert_eq!(set["result"], "ok");
    assert!(is_version(&set["version"]), "{set}");
    let get = cli(a, &["kv", "get", "k", "--json"]).expect(0).json();
    assert_eq!(get["found"], true);
    assert_eq!(get["value"], "v");
    assert_eq!(get["version"], set["version"]);
    assert_eq!(
        cli(a, &["kv", "get", "none", "--json"]).expect(1).json(),
        json!({"key": "none", "found": false})
    );
    let nx = cli(a, &["kv", "set", "k", "w", "--nx", "--json"])
        .expect(3)
        .json();
    assert_eq!(nx["result"], "not_set");
    assert_eq!(
        cli(a, &["kv", "vdel", "k", "w", "--json"]).expect(3).json(),
        json!({"key": "k", "result": "mismatch"})
    );
    assert_eq!(
        cli(a, &["kv", "del", "k", "--json"]).expect(0).json(),
        json!({"key": "k", "result": "deleted"})
    );
    assert_eq!(
        cli(a, &["kv", "del", "k", "--json"]).expect(1).json(),
        json!({"key": "k", "result": "not_found"})
    );
    let token = hlc_now("n");
    cli(a, &["kv", "set", "f", "v", "--fencing-token", &token]).expect(0);
    let refused = cli(a, &["kv", "del", "f", "--json"]).expect(3).json();
    assert_eq!(refused["result"], "error");
    assert_eq!(
        refused["error"],
        "a fencing token is required for this request"
    );
}

#[test]
fn binary_keys_and_values_round_trip() {
    let s = server(&[]);
    let a = s.mqtt;
    let value: Vec<u8> = (0..=255u8).rev().collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("value.bin");
    std::fs::write(&file, &value).unwrap();
    let key = OsStr::from_bytes(b"bin\xff\x01key");
    let args = |rest: &[&OsStr]| {
        let mut all: Vec<OsString> = rest.iter().map(|s| s.to_os_string()).collect();
        all.extend(at(a));
        command(&all, &[])
    };
    let kv = OsStr::new("kv");
    run(
        args(&[
            kv,
            OsStr::new("set"),
            key,
            OsStr::new("-f"),
            file.as_os_str(),
        ]),
        None,
    )
    .expect(0);
    let raw = run(
        args(&[kv, OsStr::new("get"), key, OsStr::new("--raw")]),
        None,
    )
    .expect(0);
    assert_eq!(raw.stdout, value);
    let json = run(
        args(&[kv, OsStr::new("get"), key, OsStr::new("--json")]),
        None,
    )
    .expect(0)
    .json();
    assert_eq!(
        STANDARD
            .decode(json["key_base64"].as_str().unwrap())
            .unwrap(),
        b"bin\xff\x01key"
    );
    assert_eq!(
        STANDARD
            .decode(json["value_base64"].as_str().unwrap())
            .unwrap(),
        value
    );
    let text = run(args(&[kv, OsStr::new("get"), key]), None)
        .expect(0)
        .text();
    assert!(text.starts_with("\\xff\\xfe"), "{text:?}");
    assert_eq!(text.lines().count(), 1, "one escaped line: {text:?}");

    // From standard input, and an empty value.
    let stdin_args = args(&[kv, OsStr::new("set"), OsStr::new("in"), OsStr::new("-s")]);
    run(stdin_args, Some(b"\x00line1\nline2\n")).expect(0);
    let got = run(
        args(&[kv, OsStr::new("get"), OsStr::new("in"), OsStr::new("--raw")]),
        None,
    );
    assert_eq!(got.expect(0).stdout, b"\x00line1\nline2\n");
    cli(a, &["kv", "set", "empty", ""]).expect(0);
    assert_eq!(
        cli(a, &["kv", "get", "empty", "--raw"]).expect(0).stdout,
        b""
    );
}

#[test]
fn scan_pages_through_more_keys_than_a_page() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("statehub.toml");
    // At most 3 keys visited per SCAN request: 13 keys take several pages.
    std::fs::write(&config, "[state_store]\nscan_count = 3\n").unwrap();
    let s = server(&["--config", config.to_str().unwrap()]);
    let a = s.mqtt;
    let mut want: Vec<String> = (0..10).map(|i| format!("user:{i}")).collect();
    for key in want
        .iter()
        .chain(&["other:1".to_owned(), "other:2".into(), "x".into()])
    {
        cli(a, &["kv", "set", key, "v"]).expect(0);
    }
    let out = cli(a, &["kv", "scan", "user:*"]).expect(0).text();
    let mut got: Vec<String> = out.lines().map(str::to_owned).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);

    let json = cli(a, &["kv", "scan", "user:[0-4]", "--json"]).expect(0);
    let mut keys: Vec<String> = json
        .json_lines()
        .iter()
        .map(|o| o["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    assert_eq!(keys, ["user:0", "user:1", "user:2", "user:3", "user:4"]);
    assert_eq!(
        cli(a, &["kv", "scan", "--limit", "4"])
            .expect(0)
            .text()
            .lines()
            .count(),
        4
    );
    assert_eq!(cli(a, &["kv", "scan"]).expect(0).text().lines().count(), 13);
    assert!(cli(a, &["kv", "scan", "none:*"])
        .expect(0)
        .stdout
        .is_empty());
}

#[test]
fn watch_prints_sets_and_deletes_from_another_client_then_exits() {
    let s = server(&[]);
    let a = s.mqtt;
    let mut watch = spawn(
        a,
        &["kv", "watch", "k1", "k2", "--count", "3", "--json", "-d"],
    );
    watch.wait_for("watching 2 keys");
    cli(a, &["kv", "set", "k1", "a"]).expect(0);
    cli(a, &["kv", "set", "other", "x"]).expect(0);
    cli(a, &["kv", "set", "k2", "b"]).expect(0);
    cli(a, &["kv", "del", "k1"]).expect(0);
    let done = watch.finish().expect(0);
    let events = done.json_lines();
    let shape: Vec<_> = events
        .iter()
        .map(|e| (e["key"].clone(), e["event"].clone(), e["value"].clone()))
        .collect();
    assert_eq!(
        shape,
        [
            (json!("k1"), json!("set"), json!("a")),
            (json!("k2"), json!("set"), json!("b")),
            (json!("k1"), json!("delete"), json!(null)),
        ]
    );
    assert!(
        events.iter().all(|e| is_version(&e["version"])),
        "{events:?}"
    );
}

#[test]
fn watch_ends_on_ctrl_c_and_on_its_wait() {
    let s = server(&[]);
    let a = s.mqtt;
    let mut watch = spawn(a, &["kv", "watch", "k", "-d"]);
    watch.wait_for("watching 1 key");
    cli(a, &["kv", "set", "k", "hello world"]).expect(0);
    assert_eq!(watch.next_line(), "SET k hello world\n");
    watch.signal("INT");
    let done = watch.finish().expect(0);
    assert_eq!(done.text(), "SET k hello world\n");

    let timed = cli(a, &["kv", "watch", "k", "--count", "1", "-W", "1"]).expect(5);
    assert!(timed.stdout.is_empty(), "{timed:?}");
    cli(a, &["kv", "watch", "k", "-W", "1"]).expect(0);
}
