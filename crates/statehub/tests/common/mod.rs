//! Running the `statehub` binary from tests: start it on port 0 and read the bound
//! addresses from its log, wait for it to exit, collect its stderr.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod admin;
pub mod cluster;
pub mod lag;
pub mod mqtt_ws;
pub mod proxy;
pub mod wps;

// Not every test file that includes this module uses every helper.
#[allow(unused_imports)]
pub use statehub_test_support::resp;

pub const BIN: &str = env!("CARGO_BIN_EXE_statehub");

/// A running `statehub serve`, killed on drop if still alive.
pub struct Server {
    pub child: Child,
    pub mqtt: SocketAddr,
    pub http: SocketAddr,
    pub log: mpsc::Receiver<String>,
    /// The log lines up to and including the "listening" lines.
    pub startup: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Resident set size of the process, in KiB.
    pub fn rss_kib(&self) -> u64 {
        rss_kib(self.child.id())
    }
}

/// Resident set size of process `pid`, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}

/// The value of user property `name` (a state store response's `__stat`, `__ts`...).
pub fn user_property(
    props: &rumqttc::v5::mqttbytes::v5::PublishProperties,
    name: &str,
) -> Option<String> {
    props
        .user_properties
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

pub fn command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("serve").args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("STATEHUB_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("RUST_LOG", "info").env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Starts the binary and waits (max 10 s) for both "listening on" lines.
pub fn start(args: &[&str], env: &[(&str, &str)]) -> Server {
    attach(command(args, env).spawn().expect("spawn statehub"))
}

/// The listen flags every test server gets: loopback, port 0.
pub const LOCAL: [&str; 4] = [
    "--mqtt-listen",
    "127.0.0.1:0",
    "--http-listen",
    "127.0.0.1:0",
];

/// Starts the binary on [`LOCAL`] with `args` besides.
pub fn start_local(args: &[&str]) -> Server {
    start(&[&LOCAL[..], args].concat(), &[])
}

/// Starts the binary on [`LOCAL`] with its data in `dir` and `args` besides.
pub fn start_on(dir: &Path, args: &[&str]) -> Server {
    start_local(&[&["--data-dir", path_str(dir)], args].concat())
}

/// Starts the binary on [`LOCAL`] with `toml` as its configuration file and `args`
/// besides. The file is read at startup, so it is gone once the server listens.
pub fn start_configured(toml: &str, args: &[&str]) -> Server {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), toml).unwrap();
    start_local(&[&["--config", path_str(file.path())], args].concat())
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 test path")
}

/// Waits (max 10 s) for a spawned binary's "listening on" lines.
pub fn attach(mut child: Child) -> Server {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(strip_ansi(&line)).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let (mut mqtt, mut http) = (None, None);
    let mut seen = Vec::new();
    while mqtt.is_none() || http.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "statehub did not log its listen addresses within 10 s; log so far:\n{}",
                    seen.join("\n")
                );
            }
        };
        let addr_after = |marker: &str| {
            line.find(marker).map(|i| {
                let rest = &line[i + marker.len()..];
                rest.split_whitespace()
                    .next()
                    .unwrap_or("")
                    .parse::<SocketAddr>()
                    .expect("address in log line")
            })
        };
        mqtt = mqtt.or_else(|| addr_after("mqtt listening on "));
        http = http.or_else(|| addr_after("http listening on "));
        seen.push(line);
    }
    Server {
        child,
        mqtt: mqtt.unwrap(),
        http: http.unwrap(),
        log: rx,
        startup: seen,
    }
}

pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("statehub did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn connect_tcp(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("tcp connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// `GET path` on `addr` (HTTP/1.1, the connection closed after it): the whole
/// response, head and body, read within [`connect_tcp`]'s read timeout.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    get_within(addr, path, None)
}

/// `GET /metrics` on `http`: the whole response, head and body (read within 60 s, as a
/// scrape can wait behind a node's Redis calls on a loaded machine).
pub fn scrape(http: SocketAddr) -> String {
    get_within(http, "/metrics", Some(Duration::from_secs(60)))
}

fn get_within(addr: SocketAddr, path: &str, read_timeout: Option<Duration>) -> String {
    use std::io::Write;
    let mut s = connect_tcp(addr);
    if read_timeout.is_some() {
        s.set_read_timeout(read_timeout).unwrap();
    }
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the HTTP response");
    out
}

/// docs/metrics.md's table rows whose metric name starts with `prefix`, row by row:
/// (name as queried, type, label names).
pub fn documented_metrics(
    prefix: &str,
) -> Vec<(String, String, std::collections::BTreeSet<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/metrics.md");
    let text = std::fs::read_to_string(path).expect("docs/metrics.md");
    let start = format!("| `{prefix}");
    let mut rows = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&start)) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_owned();
        let kind = cells[2].to_owned();
        let labels = cells[3]
            .split(',')
            .map(|l| l.trim().trim_matches('`'))
            .filter(|l| !l.is_empty() && *l != "-")
            .map(str::to_owned)
            .collect();
        rows.push((name, kind, labels));
    }
    rows
}

/// A `/metrics` body (OpenMetrics text): every sample's value by `name{labels}` as
/// written, and every family's type by name.
pub fn parse_metrics(
    text: &str,
) -> (
    std::collections::BTreeMap<String, f64>,
    std::collections::BTreeMap<String, String>,
) {
    let mut samples = std::collections::BTreeMap::new();
    let mut types = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') {
            let (name, value) = line.rsplit_once(' ').unwrap();
            samples.insert(name.to_owned(), value.parse().unwrap());
        }
    }
    (samples, types)
}

/// The value of sample `name` (or `{name}_total`, a counter's) on `http`'s `/metrics`.
pub fn metric(http: SocketAddr, name: &str) -> f64 {
    scrape(http)
        .lines()
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name || n == format!("{name}_total")).then(|| v.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{name} not on /metrics"))
}

pub fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut child = command(args, &[]).spawn().expect("spawn");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_exit(&mut child, Duration::from_secs(5));
    (status, strip_ansi(&reader.join().unwrap()))
}

/// A crash test's iterations (from `var`, else `default`) and its seed (`CRASH_SEED`,
/// else the clock), printed with `name` so a failing run can be reproduced.
pub fn crash_plan(name: &str, var: &str, default: u32) -> (u32, u64) {
    let iterations = std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{name}: {iterations} iterations, CRASH_SEED={seed}");
    (iterations, seed)
}

/// A small xorshift generator: reproducible random moments from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
