//! The README's fenced blocks, for the tests that run them (readme.rs and
//! cli_readme.rs), and the shell they run in.

use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug)]
pub struct Block {
    /// The `## ` section the block is in.
    pub section: String,
    /// What follows the opening fence (`sh`, `text`, `rust`, ...).
    pub lang: String,
    pub body: String,
}

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).unwrap()
}

/// The README's fenced blocks, in order, each with the section it is in.
pub fn blocks() -> Vec<Block> {
    let text = readme();
    let mut blocks = Vec::new();
    let mut section = String::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(title) = line.strip_prefix("## ") {
            section = title.to_owned();
        }
        let Some(lang) = line.strip_prefix("```") else {
            continue;
        };
        let mut body = String::new();
        for l in lines.by_ref() {
            if l == "```" {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        blocks.push(Block {
            section: section.clone(),
            lang: lang.to_owned(),
            body,
        });
    }
    blocks
}

/// The fenced blocks of the `## name` section, in order.
pub fn section(name: &str) -> Vec<Block> {
    blocks().into_iter().filter(|b| b.section == name).collect()
}

/// `bash -e -o pipefail` running `script` in `dir` with `PATH` set to `path`, its
/// standard error merged into its output (a README block shows what a user sees).
pub fn shell(script: &str, dir: &Path, path: &str) -> Command {
    let mut sh = Command::new("bash");
    sh.args([
        "-e",
        "-o",
        "pipefail",
        "-c",
        &format!("exec 2>&1\n{script}"),
    ])
    .current_dir(dir)
    .env("PATH", path);
    sh
}
