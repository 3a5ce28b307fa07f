//! The README's "Command-line client" section, run: every ```sh block in order, in one
//! directory, against a statehub on free ports (STATEHUB_URL points at it, and
//! `localhost:8080` becomes its HTTP address), each ```text block right after one
//! compared with what it printed (stdout and stderr together). The two-terminal
//! ```console examples are mirrored command for command below (with `-d`, to learn
//! when terminal 1 is ready).

mod cli_support;
mod common;
mod readme_blocks;

use std::path::Path;

use cli_support::{command, run, server, spawn};
use readme_blocks::{section, shell, Block};

const ACCESS_KEY: &str = "change-me-0123456789abcdef";

/// The blocks of the "Command-line client" section, whose commands use this test's
/// access key.
fn section_blocks() -> Vec<Block> {
    let blocks = section("Command-line client");
    assert!(!blocks.is_empty(), "README has the section");
    assert!(
        blocks.iter().any(|b| b.body.contains(ACCESS_KEY)),
        "the README's key is this test's"
    );
    blocks
}

#[test]
fn the_readme_snippets_print_what_the_readme_shows() {
    let blocks = section_blocks();
    assert!(blocks.iter().filter(|b| b.lang == "sh").count() >= 6);
    let s = server(&["--access-key", ACCESS_KEY]);
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(common::BIN).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let url = format!("mqtt://{}", s.mqtt);
    for (i, block) in blocks.iter().enumerate() {
        if block.lang != "sh" {
            continue;
        }
        let script = block.body.replace("localhost:8080", &s.http.to_string());
        let mut sh = shell(&script, dir.path(), &path);
        sh.env("STATEHUB_URL", &url)
            .env_remove("STATEHUB_CONNECTION_STRING");
        let out = run(sh, None);
        assert_eq!(
            out.code,
            0,
            "README block {i} failed:\n{script}\n{}",
            out.text()
        );
        match blocks.get(i + 1) {
            Some(next) if next.lang == "text" => {
                assert_eq!(out.text(), next.body, "README block {i}:\n{script}")
            }
            _ => {}
        }
        if script.contains("statehub token") {
            let printed = out.text();
            let want = format!("ws://{}/client/hubs/chat?access_token=", s.http);
            assert!(printed.starts_with(&want), "{printed}");
        }
    }
}

/// The console blocks, in order.
fn console_commands() -> Vec<String> {
    section_blocks()
        .into_iter()
        .filter(|b| b.lang == "console")
        .flat_map(|b| {
            b.body
                .lines()
                .filter_map(|l| l.strip_prefix("$ "))
                .map(|l| l.split("  #").next().unwrap_or(l).trim().to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_readme_two_terminal_examples() {
    let expected = [
        "statehub kv watch greeting",
        "statehub kv set greeting hi",
        "statehub kv del greeting",
        "statehub sub -t 'chat/#' -v -q 1",
        "statehub pub -t chat/alice -m 'hi there' -q 1",
    ];
    assert_eq!(
        console_commands(),
        expected,
        "the mirror below follows these"
    );
    let s = server(&[]);
    let a = s.mqtt;

    let mut watch = spawn(a, &["kv", "watch", "greeting", "-d"]);
    watch.wait_for("watching");
    let terminal2 = |args: &[&str]| {
        let url = format!("mqtt://{a}");
        run(command(args, &[("STATEHUB_URL", &url)]), None)
    };
    assert_eq!(
        terminal2(&["kv", "set", "greeting", "hi"]).expect(0).text(),
        "OK\n"
    );
    assert_eq!(watch.next_line(), "SET greeting hi\n");
    assert_eq!(
        terminal2(&["kv", "del", "greeting"]).expect(0).text(),
        "deleted\n"
    );
    assert_eq!(watch.next_line(), "DELETE greeting\n");
    watch.signal("INT");
    watch.finish().expect(0);

    let mut sub = spawn(a, &["sub", "-t", "chat/#", "-v", "-q", "1", "-d"]);
    sub.wait_for("subscribed");
    let publish = terminal2(&["pub", "-t", "chat/alice", "-m", "hi there", "-q", "1"]);
    assert!(publish.expect(0).stdout.is_empty());
    assert_eq!(sub.next_line(), "chat/alice hi there\n");
    sub.signal("INT");
    sub.finish().expect(0);
}
