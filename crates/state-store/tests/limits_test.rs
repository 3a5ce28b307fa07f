//! The limits on what clients can make the store hold or do: sizes of keys, values and
//! SCAN patterns, observation quotas, the notification topic's length, the work and
//! size of one SCAN page. Each is refused with `the quota has been exceeded`.

mod common;

use common::Harness;
use statehub_state_store::machine::defaults;
use statehub_state_store::notify::{notify_topic, notify_topic_len, MAX_TOPIC_LEN};
use statehub_state_store::{Config, Engine};

const QUOTA: &[u8] = b"-ERR the quota has been exceeded\r\n";

/// Every quota is finite by default: a default install is protected.
#[test]
fn defaults_are_finite() {
    let config = Config::default();
    assert_eq!(config.max_keys, 100_000);
    assert_eq!(config.max_bytes, 128 << 20);
    assert_eq!(config.max_key_bytes, 16 << 10);
    assert_eq!(config.max_value_bytes, 1 << 20);
    assert_eq!(config.max_observations_per_client, 1_000);
    assert_eq!(config.max_observations, 100_000);
    assert_eq!(config.max_observed_key_bytes, 16 << 20);
    assert_eq!(config.max_pattern_bytes, 4 << 10);
    // The longest key's topic fits with a client id of up to 16,000 bytes.
    assert!(notify_topic_len(16_000, defaults::MAX_KEY_BYTES) <= MAX_TOPIC_LEN);
}

#[test]
fn key_and_value_sizes() {
    let mut h = Harness::with_config(Config {
        max_key_bytes: 8,
        max_value_bytes: 4,
        ..Config::default()
    });
    assert_eq!(h.reply("c", &[b"SET", b"12345678", b"1234"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"SET", b"123456789", b"v"]).0, QUOTA);
    assert_eq!(h.reply("c", &[b"SET", b"k", b"12345"]).0, QUOTA);
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"123456789"]).0, QUOTA);
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"12345678"]).0, b"+OK\r\n");
    // A key too long to be stored is simply absent.
    assert_eq!(h.reply("c", &[b"GET", b"123456789"]).0, b"$-1\r\n");
}

#[test]
fn default_key_size() {
    let mut h = Harness::new();
    let longest = vec![b'k'; defaults::MAX_KEY_BYTES];
    let too_long = vec![b'k'; defaults::MAX_KEY_BYTES + 1];
    assert_eq!(h.reply("c", &[b"SET", &longest, b"v"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"SET", &too_long, b"v"]).0, QUOTA);
}

#[test]
fn observation_quotas_in_total() {
    let mut h = Harness::with_config(Config {
        max_observations: 3,
        ..Config::default()
    });
    for (client, key) in [("a", &b"k1"[..]), ("a", b"k2"), ("b", b"k1")] {
        assert_eq!(h.reply(client, &[b"KEYNOTIFY", key]).0, b"+OK\r\n");
    }
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"k1"]).0, QUOTA);
    // Repeating an observation adds none.
    assert_eq!(h.reply("a", &[b"KEYNOTIFY", b"k1"]).0, b"+OK\r\n");
    // Stopping one, or a client leaving, makes room.
    assert_eq!(h.reply("a", &[b"KEYNOTIFY", b"k2", b"STOP"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"k1"]).0, b"+OK\r\n");
    assert_eq!(h.reply("d", &[b"KEYNOTIFY", b"k1"]).0, QUOTA);
    h.machine.client_disconnected("a").expect("memory engine");
    assert_eq!(h.reply("d", &[b"KEYNOTIFY", b"k1"]).0, b"+OK\r\n");
}

#[test]
fn observed_key_bytes_in_total() {
    let mut h = Harness::with_config(Config {
        max_observed_key_bytes: 10,
        ..Config::default()
    });
    assert_eq!(h.reply("a", &[b"KEYNOTIFY", b"12345"]).0, b"+OK\r\n");
    assert_eq!(h.reply("b", &[b"KEYNOTIFY", b"12345"]).0, b"+OK\r\n");
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"1"]).0, QUOTA);
    h.machine.client_disconnected("b").expect("memory engine");
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", b"1"]).0, b"+OK\r\n");
}

/// A notification topic carries the client id and the key in hex: a KEYNOTIFY whose
/// topic would not fit in an MQTT topic name is refused, so a SET of that key can never
/// produce a notification that cannot be sent.
#[test]
fn observation_whose_topic_would_not_fit() {
    let mut h = Harness::with_config(Config {
        max_key_bytes: 40_000,
        ..Config::default()
    });
    let fixed = notify_topic_len(0, 0);
    let fits = (MAX_TOPIC_LEN - fixed) / 2 - 1; // client id "c" is one byte
    let key = vec![b'k'; fits];
    assert_eq!(notify_topic(b"c", &key).len(), MAX_TOPIC_LEN);
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", &key]).0, b"+OK\r\n");
    let key = vec![b'k'; fits + 1];
    assert_eq!(h.reply("c", &[b"KEYNOTIFY", &key]).0, QUOTA);
    // SET of that key is fine: nobody observes it.
    let outcome = h.send("c", &[b"SET", &key, b"v"]);
    assert_eq!(&outcome.reply.payload[..], b"+OK\r\n");
    assert!(common::notifies(&outcome.effects).is_empty());
    // A long client id leaves less room for the key.
    let client = "c".repeat(17_000);
    let key = vec![b'k'; defaults::MAX_KEY_BYTES];
    assert_eq!(h.reply(&client, &[b"KEYNOTIFY", &key]).0, QUOTA);
}

#[test]
fn scan_pattern_length() {
    let mut h = Harness::with_config(Config {
        max_pattern_bytes: 4,
        ..Config::default()
    });
    h.send("c", &[b"SET", b"key", b"v"]);
    assert_eq!(
        h.reply("c", &[b"SCAN", b"key*"]).0,
        b"*1\r\n*1\r\n$3\r\nkey\r\n"
    );
    assert_eq!(h.reply("c", &[b"SCAN", b"key**"]).0, QUOTA);
}

/// Pages until no token comes back, collecting every key and the size of each page.
fn scan_all(h: &mut Harness, pattern: &[u8]) -> (Vec<Vec<u8>>, Vec<usize>) {
    let (mut keys, mut pages) = (Vec::new(), Vec::new());
    let mut token: Option<Vec<u8>> = None;
    loop {
        let mut args: Vec<&[u8]> = vec![b"SCAN", pattern];
        if let Some(token) = &token {
            args.push(token);
        }
        let outcome = h.send("c", &args);
        let (page, next) = parse_scan(&outcome.reply.payload);
        pages.push(page.len());
        keys.extend(page);
        match next {
            Some(next) => token = Some(next),
            None => return (keys, pages),
        }
    }
}

/// The keys and token of a SCAN reply.
fn parse_scan(reply: &[u8]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let mut lines = Lines(reply);
    let outer = lines.header(b'*');
    let count = lines.header(b'*');
    let keys = (0..count).map(|_| lines.bulk()).collect();
    let token = (outer == 2).then(|| lines.bulk());
    assert!(lines.0.is_empty(), "trailing bytes in {reply:?}");
    (keys, token)
}

struct Lines<'a>(&'a [u8]);

impl Lines<'_> {
    fn header(&mut self, prefix: u8) -> usize {
        assert_eq!(self.0[0], prefix);
        let end = self.0.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = std::str::from_utf8(&self.0[1..end])
            .unwrap()
            .parse()
            .unwrap();
        self.0 = &self.0[end + 2..];
        n
    }

    fn bulk(&mut self) -> Vec<u8> {
        let len = self.header(b'$');
        let out = self.0[..len].to_vec();
        self.0 = &self.0[len + 2..];
        out
    }
}

/// A page ends when its work budget is spent, with a token, even with fewer keys than
/// `scan_count` (here none match at all): every key is still visited exactly once.
#[test]
fn scan_work_budget_ends_pages_early() {
    let mut h = Harness::with_config(Config {
        scan_count: 100,
        scan_work: 3_000,
        ..Config::default()
    });
    let keys: Vec<Vec<u8>> = (0..20u8)
        .map(|i| {
            let mut key = vec![b'a' + i];
            key.extend(std::iter::repeat_n(b'x', 999));
            key
        })
        .collect();
    for key in &keys {
        h.send("c", &[b"SET", key, b"v"]);
    }
    let (found, pages) = scan_all(&mut h, b"*");
    assert_eq!(found, keys);
    // 1,000 bytes per key and one pattern word: three keys make a page.
    assert!(pages.iter().all(|&n| n <= 3), "{pages:?}");
    let (found, pages) = scan_all(&mut h, b"*y");
    assert!(found.is_empty());
    assert_eq!(pages.len(), 7, "{pages:?}");
}

#[test]
fn scan_page_bytes_end_pages_early() {
    let mut h = Harness::with_config(Config {
        scan_page_bytes: 2_500,
        ..Config::default()
    });
    let keys: Vec<Vec<u8>> = (0..10u8).map(|i| vec![b'a' + i; 1_000]).collect();
    for key in &keys {
        h.send("c", &[b"SET", key, b"v"]);
    }
    let (found, pages) = scan_all(&mut h, b"*");
    assert_eq!(found, keys);
    assert_eq!(pages, [3, 3, 3, 1]);
}

/// The SCAN, in the machine: one key of 20,000 `[` against `*`, 2,000 `[` and
/// `b`, answered (no match) in one page. (The binary test checks that other clients are
/// served meanwhile.)
#[test]
fn pathological_scan_is_one_cheap_page() {
    let mut h = Harness::with_config(Config {
        max_key_bytes: 20_000,
        ..Config::default()
    });
    let key = vec![b'['; 20_000];
    h.send("c", &[b"SET", &key, b"v"]);
    let mut pattern = vec![b'*'];
    pattern.extend(std::iter::repeat_n(b'[', 2_000));
    pattern.push(b'b');
    assert_eq!(h.reply("c", &[b"SCAN", &pattern]).0, b"*1\r\n*0\r\n");
    pattern.pop();
    assert_eq!(
        h.reply("c", &[b"SCAN", &pattern]).0.len(),
        b"*1\r\n*1\r\n$20000\r\n\r\n".len() + 20_000
    );
}

/// A burst of expiries is removed [`EXPIRY_BATCH`] keys per call, so no call holds the
/// store for long; meanwhile no request sees an expired key.
#[test]
fn expiry_bursts_are_removed_in_batches() {
    use statehub_state_store::machine::EXPIRY_BATCH;
    let mut h = Harness::new();
    let count = 4 * EXPIRY_BATCH + EXPIRY_BATCH / 2;
    let key = |i: usize| format!("k{i:06}").into_bytes();
    for i in 0..count {
        h.send("c", &[b"SET", &key(i), b"v", b"PX", b"1000"]);
    }
    h.send("c", &[b"SET", b"keep", b"v"]);
    let last = key(count - 1);
    h.send("o", &[b"KEYNOTIFY", &last]);
    h.advance(1_000);

    assert!(h.machine.expire(h.now).unwrap().is_empty());
    assert_eq!(
        h.machine.engine().stats().keys as usize,
        count + 1 - EXPIRY_BATCH
    );
    assert!(h
        .machine
        .next_expiry()
        .unwrap()
        .is_some_and(|at| at <= h.now));

    // A request removes another batch, and its own key if due: the observer of the last
    // key, still waiting in the backlog, hears of its deletion now.
    let outcome = h.send("c", &[b"GET", &last]);
    assert_eq!(&outcome.reply.payload[..], b"$-1\r\n");
    let notes = common::notifies(&outcome.effects);
    assert_eq!(notes.len(), 1);
    assert_eq!((notes[0].0.as_str(), &notes[0].1), ("o", &last));
    let left = count - 2 * EXPIRY_BATCH - 1;
    assert_eq!(h.machine.engine().stats().keys as usize, left + 1);
    // SET NX takes a key still due; SCAN skips the ones still due.
    assert_eq!(
        h.reply("c", &[b"SET", &key(count - 2), b"w", b"NX"]).0,
        b"+OK\r\n"
    );
    assert_eq!(
        h.machine.engine().stats().keys as usize,
        left - EXPIRY_BATCH - 1 + 2
    );
    let (found, _) = scan_all(&mut h, b"*");
    assert_eq!(found, [key(count - 2), b"keep".to_vec()]);
    while h.machine.next_expiry().unwrap().is_some() {
        h.machine.expire(h.now).unwrap();
    }
    assert_eq!(h.machine.engine().stats().keys, 2);
}
