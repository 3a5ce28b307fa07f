//! How results are written: human text (bytes that are not printable UTF-8
//! escaped), JSON (one object per line; bytes that are not UTF-8 as base64 under a
//! `_base64` name), or raw bytes for piping.

use std::io::Write;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use clap::Args;
use serde_json::{Map, Value};

use crate::error::CliError;

#[derive(Debug, Clone, Copy, Args)]
pub struct OutputArgs {
    /// Print JSON, one object per line (bytes that are not UTF-8 as `<field>_base64`)
    #[arg(long, conflicts_with = "raw")]
    pub json: bool,
    /// Print values exactly as stored, nothing else (for binary values and pipes)
    #[arg(long)]
    pub raw: bool,
}

/// `--json` alone, for commands with no value to pipe.
#[derive(Debug, Clone, Copy, Args)]
pub struct JsonArg {
    /// Print JSON, one object per line (bytes that are not UTF-8 as `<field>_base64`)
    #[arg(long)]
    pub json: bool,
}

impl JsonArg {
    pub fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else {
            Format::Text
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
    Raw,
}

impl OutputArgs {
    pub fn format(&self) -> Format {
        if self.json {
            Format::Json
        } else if self.raw {
            Format::Raw
        } else {
            Format::Text
        }
    }
}

/// Standard output; a closed pipe (`| head -1`) shows as [`Out::closed`].
#[derive(Debug)]
pub struct Out {
    closed: bool,
}

impl Out {
    pub fn new() -> Out {
        Out { closed: false }
    }

    /// Whether the reader of standard output has gone.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Writes and flushes (each line is its own event for whoever reads it).
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), CliError> {
        if self.closed {
            return Ok(());
        }
        let mut stdout = std::io::stdout().lock();
        match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            Err(e) => Err(CliError::Output(e)),
        }
    }

    pub fn line(&mut self, text: &str) -> Result<(), CliError> {
        let mut bytes = Vec::with_capacity(text.len() + 1);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(b'\n');
        self.write(&bytes)
    }

    pub fn json(&mut self, object: Map<String, Value>) -> Result<(), CliError> {
        self.line(&Value::Object(object).to_string())
    }
}

/// A message on standard error, prefixed with the program's name.
pub fn note(message: &str) {
    let _ = writeln!(std::io::stderr().lock(), "statehub: {message}");
}

/// Text for humans: valid UTF-8 as is, except control characters and `\` escaped
/// (`\n`, `\t`, `\r`, `\\`, `\u{7f}`), and bytes that are not UTF-8 as `\xNN`; so one
/// value is one line and different bytes never print the same.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Puts `bytes` under `name` as a string when they are UTF-8, else base64 under
/// `<name>_base64`.
pub fn put_bytes(object: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object.insert(name.to_owned(), Value::from(text)),
        Err(_) => object.insert(
            format!("{name}_base64"),
            Value::from(STANDARD.encode(bytes)),
        ),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(escape(b"plain text"), "plain text");
        assert_eq!(escape("é ✓".as_bytes()), "é ✓");
        assert_eq!(escape(b"a\nb\tc\\d\r"), "a\\nb\\tc\\\\d\\r");
        assert_eq!(escape(b"\x00\x7f"), "\\u{0}\\u{7f}");
        assert_eq!(escape(b"\xff\xfeok\xc3"), "\\xff\\xfeok\\xc3");
        // The escape of a backslash differs from an escaped byte.
        assert_ne!(escape(b"\\xff"), escape(b"\xff"));
    }

    #[test]
    fn json_bytes() {
        let mut o = Map::new();
        put_bytes(&mut o, "value", b"text");
        put_bytes(&mut o, "key", &[0xff, 0x00, 0x01]);
        assert_eq!(
            Value::Object(o),
            serde_json::json!({"key_base64": "/wAB", "value": "text"})
        );
    }
}
