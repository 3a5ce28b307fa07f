//! Every fenced block of the README is run or checked, and a block that no test knows
//! fails `every_readme_block_is_run`: the "Command-line client" section is
//! cli_readme.rs's; the rest is here. The shell blocks run in order, in one directory,
//! against a statehub on free ports (`-h localhost -p 1883` and `localhost:8080` become
//! its addresses, 1884-1887, 8081-8084 and 6379 more free ports), each ```text block compared with
//! what the block before it printed (stdout and stderr together).

mod cli_support;
mod common;
mod readme_blocks;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::{run, server};
use readme_blocks::{blocks, readme, root, section, shell, Block};

const ACCESS_KEY: &str = "change-me-0123456789abcdef";

#[test]
fn every_readme_block_is_run() {
    let blocks = blocks();
    for b in &blocks {
        let known = matches!(
            (b.section.as_str(), b.lang.as_str()),
            ("Command-line client", "sh" | "text" | "console")
                | ("Quick start", "sh" | "text" | "rust" | "js")
                | ("Container", "sh")
                | ("Configuration", "toml")
        );
        assert!(
            known,
            "a README block that no test runs ({} block in \"{}\"): run it in readme.rs\n{}",
            b.lang, b.section, b.body
        );
    }
    assert!(blocks.len() >= 20, "{} blocks", blocks.len());
    // The two set-up commands.
    let text = readme();
    assert!(text.contains("\n    cargo run --release -p statehub -- serve\n"));
    assert!(text.contains("\n    bash scripts/test.sh\n"));
    assert!(root().join("scripts/test.sh").is_file());
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn quick_start_shell_blocks_print_what_the_readme_shows() {
    let blocks = section("Quick start");
    assert!(blocks.iter().filter(|b| b.lang == "sh").count() >= 4);
    let s = server(&["--access-key", ACCESS_KEY]);
    // The README's other ports (a second server, a Redis and three nodes on it).
    let others: Vec<(u16, u16)> = [1884, 1885, 1886, 1887, 8081, 8082, 8083, 8084, 6379]
        .into_iter()
        .map(|p| (p, free_port()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(common::BIN).parent().unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    for (i, block) in blocks.iter().enumerate() {
        if block.lang != "sh" {
            continue;
        }
        let mut script = block
            .body
            .replace(
                "-h localhost -p 1883",
                &format!("-h 127.0.0.1 -p {}", s.mqtt.port()),
            )
            .replace("localhost:8080", &s.http.to_string());
        for (from, to) in &others {
            script = script
                .replace(&format!("localhost:{from}"), &format!("127.0.0.1:{to}"))
                .replace(&format!("-p {from}"), &format!("-p {to}"))
                .replace(&format!("--port {from}"), &format!("--port {to}"));
        }
        assert!(
            !script.contains("1883") && !script.contains("8080"),
            "a port the test does not replace:\n{script}"
        );
        let mut sh = shell(&script, dir.path(), &path);
        sh.env_remove("STATEHUB_URL");
        let out = run(sh, None);
        assert_eq!(
            out.code,
            0,
            "README block {i} failed:\n{script}\n{}",
            out.text()
        );
        if let Some(next) = blocks.get(i + 1).filter(|b| b.lang == "text") {
            assert_eq!(out.text(), next.body, "README block {i}:\n{script}");
        }
    }
}

/// The example binary, built by `cargo test` with the package's tests, or built now.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    if !path.is_file() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", "statehub", "--example", name])
            .current_dir(root())
            .status()
            .unwrap();
        assert!(built.success());
    }
    path
}

#[test]
fn the_rust_sdk_example_is_the_readme_block_and_runs() {
    let rust: Vec<Block> = section("Quick start")
        .into_iter()
        .filter(|b| b.lang == "rust")
        .collect();
    assert_eq!(rust.len(), 1);
    let file = std::fs::read_to_string(root().join("crates/statehub/examples/state_store.rs"));
    assert_eq!(
        rust[0].body,
        file.unwrap(),
        "README = examples/state_store.rs"
    );
    let s = server(&[]);
    let mut cmd = Command::new(example("state_store"));
    cmd.args(["127.0.0.1", &s.mqtt.port().to_string()]);
    let out = run(cmd, None);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.text(), "set: true\nget: hello from the SDK\ndel: 1\n");
}

#[test]
fn the_web_pubsub_js_block_runs_with_the_official_sdks() {
    let js: Vec<Block> = section("Quick start")
        .into_iter()
        .filter(|b| b.lang == "js")
        .collect();
    assert_eq!(js.len(), 1);
    let sdk = root().join("tests/webpubsub-sdk/js");
    assert!(
        sdk.join("node_modules/@azure/web-pubsub-client").is_dir(),
        "the JS SDKs are not installed: run scripts/install-test-deps.sh"
    );
    let s = server(&["--access-key", ACCESS_KEY]);
    let script = js[0].body.replace("localhost:8080", &s.http.to_string());
    // Next to node_modules, so that the imports resolve.
    let file = tempfile::Builder::new()
        .prefix(".readme-")
        .suffix(".mjs")
        .tempfile_in(&sdk)
        .unwrap();
    std::fs::write(file.path(), script).unwrap();
    let mut node = Command::new("node");
    node.arg(file.path()).current_dir(&sdk);
    let out = run(node, None);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.text(), "hello from alice\n");
}

#[test]
fn the_configuration_examples_are_accepted() {
    let toml: Vec<Block> = section("Configuration")
        .into_iter()
        .filter(|b| b.lang == "toml")
        .collect();
    assert!(toml.len() >= 2);
    for (i, block) in toml.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("statehub.toml");
        std::fs::write(&file, &block.body).unwrap();
        let s = server(&["--config", file.to_str().unwrap()]);
        assert!(s.http.port() != 0, "block {i}");
    }
}

/// No container daemon here: the commands name what the Dockerfile and compose.yaml
/// define (the image, its exposed ports, its volume); container.rs checks those files.
#[test]
fn the_container_commands_match_the_image() {
    let sh: Vec<Block> = section("Container");
    assert_eq!(sh.len(), 1);
    let lines: Vec<&str> = sh[0].body.lines().collect();
    assert_eq!(lines[0], "docker build -t statehub .");
    assert_eq!(lines[2], "docker compose up -d");
    let run_line = lines[1];
    assert!(run_line.starts_with("docker run ") && run_line.ends_with(" statehub"));
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    assert!(dockerfile.contains("\nEXPOSE 1883 8883 8080\n"));
    assert!(dockerfile.contains("\nVOLUME [\"/data\"]\n"));
    for published in ["-p 1883:1883", "-p 8080:8080", "-v statehub-data:/data"] {
        assert!(run_line.contains(published), "{run_line}");
    }
    let compose = std::fs::read_to_string(root().join("compose.yaml")).unwrap();
    assert!(compose.contains("image: statehub\n") && compose.contains("statehub-data:/data"));
}
