//! Running the binary's client subcommands (`statehub kv|pub|sub|token`) from tests:
//! one-shot runs with their exit code and output, and long-running ones (`watch`,
//! `sub`) whose stderr is read line by line. Every wait is bounded.
#![allow(dead_code)]

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{self, wait_exit, BIN};

/// How long one command may take: generous, for a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The listen flags every test passes: loopback, port 0.
pub const LOCAL: [&str; 4] = [
    "--mqtt-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

/// A finished command.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Each stdout line parsed as JSON.
    pub fn json_lines(&self) -> Vec<serde_json::Value> {
        self.text()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }

    pub fn json(&self) -> serde_json::Value {
        let mut lines = self.json_lines();
        assert_eq!(lines.len(), 1, "one JSON line expected: {self:?}");
        lines.remove(0)
    }

    #[track_caller]
    pub fn expect(self, code: i32) -> Run {
        assert_eq!(self.code, code, "exit code of {self:?}");
        self
    }
}

/// The binary with `args` and the environment cleared of `STATEHUB_*`.
pub fn command<S: AsRef<OsStr>>(args: &[S], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("STATEHUB_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd
}

/// `-h 127.0.0.1 -p <port>` for `server`.
pub fn at(addr: SocketAddr) -> Vec<OsString> {
    vec![
        "-h".into(),
        addr.ip().to_string().into(),
        "-p".into(),
        addr.port().to_string().into(),
    ]
}

/// Runs `args` (then the connection flags for `addr`) to its end.
pub fn cli(addr: SocketAddr, args: &[&str]) -> Run {
    let mut all: Vec<OsString> = args.iter().map(OsString::from).collect();
    all.extend(at(addr));
    run(command(&all, &[]), None)
}

/// Runs a prepared command with `stdin` to its end (killed past [`PATIENCE`]).
pub fn run(mut cmd: Command, stdin: Option<&[u8]>) -> Run {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn statehub");
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).unwrap();
    }
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());
    let status = wait_exit(&mut child, PATIENCE);
    Run {
        code: status.code().expect("exited, not killed by a signal"),
        stdout: out.join().unwrap(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// A command left running (`watch`, `sub`), its stderr lines readable as they come.
pub struct Running {
    pub child: Child,
    stdout: mpsc::Receiver<Vec<u8>>,
    stdout_read: Vec<u8>,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `args` (then the connection flags for `addr`).
pub fn spawn(addr: SocketAddr, args: &[&str]) -> Running {
    let mut all: Vec<OsString> = args.iter().map(OsString::from).collect();
    all.extend(at(addr));
    let mut child = command(&all, &[])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn statehub");
    let (out_tx, stdout) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).split(b'\n') {
            let Ok(mut line) = line else { break };
            line.push(b'\n');
            if out_tx.send(line).is_err() {
                break;
            }
        }
    });
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Running {
        child,
        stdout,
        stdout_read: Vec::new(),
        stderr: rx,
        seen: Vec::new(),
    }
}

impl Running {
    /// Waits for a stderr line containing `text` (the `-d` readiness lines).
    pub fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no {text:?} on stderr; saw {:?}", self.seen),
            }
        }
    }

    /// Waits for the next line on stdout (kept for [`Running::finish`] too).
    pub fn next_line(&mut self) -> String {
        let line = self
            .stdout
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no line on stdout; stderr {:?}", self.seen));
        self.stdout_read.extend_from_slice(&line);
        String::from_utf8_lossy(&line).into_owned()
    }

    /// Sends a signal (`INT`, `TERM`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{name}");
    }

    /// Waits for the exit and returns what it printed.
    pub fn finish(mut self) -> Run {
        let status = wait_exit(&mut self.child, PATIENCE);
        let mut stdout = std::mem::take(&mut self.stdout_read);
        // The reader thread ends at EOF, which follows the exit.
        while let Ok(line) = self.stdout.recv_timeout(PATIENCE) {
            stdout.extend_from_slice(&line);
        }
        let mut stderr = std::mem::take(&mut self.seen);
        stderr.extend(self.stderr.try_iter());
        Run {
            code: status.code().expect("exited, not killed by a signal"),
            stdout,
            stderr: stderr.join("\n"),
        }
    }
}

/// A statehub on loopback port 0, with `extra` flags.
pub fn server(extra: &[&str]) -> common::Server {
    common::start(&[&LOCAL[..], extra].concat(), &[])
}

/// An HLC for now on this machine's clock, as a fencing token.
pub fn hlc_now(node: &str) -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{ms:015}:00000:{node}")
}

/// Polls `check` until it holds (each poll is a whole command run), at most
/// [`PATIENCE`].
pub fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !check() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
