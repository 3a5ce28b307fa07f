//! `$SYS/broker/...` topics against the binary, read with mosquitto_sub: off by
//! default; with `[mqtt] sys_interval_secs` published as retained messages from the
//! counters `/metrics` shows; never publishable by a client; not matched by `#`; and
//! subject to the authorization rules.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::Server;

const PATIENCE: Duration = Duration::from_secs(60);

fn start(config: &str) -> Server {
    common::start_configured(config, &[])
}

/// `mosquitto_sub -v` with `args`; its lines arrive on the receiver.
fn sub(server: &Server, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &server.mqtt.port().to_string()])
        .args(["-V", "5", "-v"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("mosquitto_sub (scripts/install-test-deps.sh installs mosquitto-clients)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

fn publish(server: &Server, topic: &str, message: &str) -> bool {
    Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &server.mqtt.port().to_string()])
        .args(["-V", "5", "-q", "1", "-t", topic, "-m", message])
        .status()
        .unwrap()
        .success()
}

/// Lines until one `want` accepts; panics after [`PATIENCE`] with what was seen.
fn until(lines: &mpsc::Receiver<String>, what: &str, want: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if want(&line) => return line,
            Ok(line) => seen.push(line),
            Err(_) => panic!("no {what}; seen:\n{}", seen.join("\n")),
        }
    }
}

/// A counter of a scrape: the sum of the lines of `name` whose labels contain `labels`.
fn scraped(addr: SocketAddr, name: &str, labels: &str) -> u64 {
    let body = common::scrape(addr);
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn sys_topics_are_published_from_the_metrics_counters() {
    let server = start("[mqtt]\nsys_interval_secs = 1\n");
    let (mut all, lines) = sub(&server, &["-t", "$SYS/#"]);
    for name in [
        "version statehub ",
        "uptime ",
        "clients/connected ",
        "subscriptions/count ",
        "retained messages/count ",
        "messages/received ",
        "bytes/sent ",
        "load/messages/received/1min ",
    ] {
        let topic = format!("$SYS/broker/{name}");
        until(&lines, &topic, |l| l.starts_with(&topic));
    }
    // Three PUBLISHes: the count follows, as /metrics counts them.
    for i in 0..3 {
        assert!(publish(&server, "probe/x", &i.to_string()));
    }
    let want = scraped(
        server.http,
        "statehub_mqtt_packets_received_total",
        "type=\"publish\"",
    );
    assert!(want >= 3, "{want}");
    let line = format!("$SYS/broker/publish/messages/received {want}");
    until(&lines, &line, |l| l == line);
    // A client cannot publish there: the retained version stays the server's.
    publish(&server, "$SYS/broker/version", "forged");
    let _ = all.kill();
    let _ = all.wait();
    let (mut late, lines) = sub(&server, &["-t", "$SYS/broker/version", "-C", "1"]);
    let version = until(&lines, "the version", |_| true);
    assert!(
        version.starts_with("$SYS/broker/version statehub "),
        "{version}"
    );
    let _ = late.wait();
}

/// Off by default; and `#` never matches `$SYS` topics.
#[test]
fn no_sys_topics_by_default_and_none_for_a_hash_subscriber() {
    let server = start("");
    let (mut both, lines) = sub(&server, &["-t", "$SYS/#", "-t", "probe/#", "-C", "1"]);
    // Retained $SYS messages would come first, on the subscription itself.
    assert_eq!(
        first_while_publishing(&server, &lines, "probe/1"),
        "probe/1 x"
    );
    let _ = both.wait();

    let on = start("[mqtt]\nsys_interval_secs = 1\n");
    let (mut hash, lines) = sub(&on, &["-t", "#", "-C", "1"]);
    assert_eq!(first_while_publishing(&on, &lines, "probe/2"), "probe/2 x");
    let _ = hash.wait();
}

/// The first line the subscriber prints, publishing `x` on `topic` until one comes
/// (the subscription may not be in place yet when the first publish arrives).
fn first_while_publishing(server: &Server, lines: &mpsc::Receiver<String>, topic: &str) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    while std::time::Instant::now() < deadline {
        assert!(publish(server, topic, "x"));
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(250)) {
            return line;
        }
    }
    panic!("the subscriber printed nothing");
}

/// With authorization rules, `$SYS/#` needs its own grant: `#` does not cover it.
#[test]
fn sys_subscriptions_follow_the_authorization_rules() {
    let rules = r##"
[mqtt]
sys_interval_secs = 1

[[authorization.rules]]
principals = { clientIds = ["allowed"] }
brokerResources = [
  { method = "Connect" },
  { method = "Subscribe", topics = ["#", "$SYS/#"] },
]

[[authorization.rules]]
principals = { clientIds = ["denied"] }
brokerResources = [
  { method = "Connect" },
  { method = "Subscribe", topics = ["#"] },
]
"##;
    let server = start(rules);
    let (mut allowed, lines) = sub(&server, &["-i", "allowed", "-t", "$SYS/#", "-C", "1"]);
    let line = until(&lines, "a $SYS message", |_| true);
    assert!(line.starts_with("$SYS/broker/"), "{line}");
    let _ = allowed.wait();

    let out = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &server.mqtt.port().to_string()])
        .args([
            "-V", "5", "-i", "denied", "-t", "$SYS/#", "-C", "1", "-W", "30",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // mosquitto_sub's words for a SUBACK refusing every filter.
    assert!(
        stderr.contains("subscription requests were denied"),
        "{stderr}"
    );
}
