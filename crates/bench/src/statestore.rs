//! The `statestore` scenario: N MQTT 5 clients calling the Azure IoT Operations
//! state store (SET / GET) the way the Rust SDK does.
//!
//! Every request is a QoS 1 PUBLISH to [`REQUEST_TOPIC`] with Response Topic
//! `clients/<id>/services/<request topic>` (the Rust SDK's response topic, to
//! which each client subscribes at QoS 1 before sending), 16 bytes of
//! Correlation Data, Message Expiry (`--message-expiry`, 10 s by default), Content
//! Type `application/octet-stream`, and the user properties `__srcId`, `__ts` (the
//! client's HLC), `__protVer` = `1.0` and `$partition` (the client id). Clients
//! connect like the SDK, with clean start false and Session Expiry 3600 (ids are
//! unique per run; the session is ended with a Session Expiry 0 DISCONNECT).
//!
//! Phases:
//! 1. connect and subscribe every client (`--connect-timeout`);
//! 2. if GETs are measured (and not `--no-populate`): every client SETs its share
//!    of the `--keys` keys, so that the measured GETs hit; not measured;
//! 3. all clients start together; each keeps `--pipeline` requests outstanding
//!    (1: strict request/response, as an SDK caller awaiting each call), choosing
//!    GET with probability `--ratio-get` and a uniformly random key, until it has
//!    completed `--requests-per-client` requests or `--duration` has passed;
//! 4. report ops/s (total, SET, GET), latency from encoding the request PUBLISH to
//!    reading its response (per command), and every kind of error.
//!
//! A response is an error when it lacks `__stat` = `200`, when its payload is a
//! RESP error (`-...`) or not the expected reply (`+OK` for SET, a bulk string for
//! GET); a GET answered `$-1` is a miss (counted apart; an error after populating).
//! Keys are `key:` and 12 digits, values `x` repeated, like `redis-benchmark -r`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use clap::Args;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use crate::mqtt::{all, base, err_str, now_ns, read_packet, secs};
use crate::proto::{self, ConnAck, Version};
use crate::report::{new_histogram, Latency, Report, Value};

/// The state store's request topic.
pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
/// Default request count when neither `--requests-per-client` nor `--duration` is given.
const DEFAULT_REQUESTS: u64 = 10_000;
/// Requests outstanding per client while populating.
const POPULATE_PIPELINE: usize = 16;
/// Bytes of a key: `key:` and 12 digits.
const KEY_LEN: usize = 16;

#[derive(Debug, Args)]
pub struct StateStoreArgs {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Number of client connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub clients: u32,
    /// Requests each client completes [default: 10000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub requests_per_client: Option<u64>,
    /// Send requests for this many seconds instead of a fixed count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Fraction of requests that are GETs (the rest are SETs); 0 = SET only, 1 = GET only.
    #[arg(long, default_value_t = 0.5)]
    pub ratio_get: f64,
    /// Number of distinct keys; each request picks one uniformly.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=999_999_999_999))]
    pub keys: u64,
    /// Bytes of every SET value.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(0..=16 * 1024 * 1024))]
    pub value_size: u32,
    /// Requests each client keeps outstanding (1: wait for each response before
    /// the next request, like an SDK caller awaiting every call).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub pipeline: u16,
    /// Do not SET every key before measuring (GETs of unset keys are misses).
    #[arg(long)]
    pub no_populate: bool,
    /// Message Expiry Interval of every request, seconds (the SDK's request timeout).
    #[arg(long, default_value_t = 10)]
    pub message_expiry: u32,
    /// Seconds allowed for connecting and subscribing all clients.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Hard limit in seconds on populating and on the measured phase (each).
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Exit with status 1 if any request failed, timed out or (after populating) missed.
    #[arg(long)]
    pub fail_on_error: bool,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Set,
    Get,
}

/// What one client measured in one phase.
#[derive(Debug)]
struct OpStats {
    completed: [u64; 2],
    hist: [Histogram<u64>; 2],
    /// `__stat` missing or not 200.
    bad_status: u64,
    /// RESP error payloads (`-...`).
    resp_errors: u64,
    /// Payloads that are neither the expected reply nor a RESP error.
    unexpected: u64,
    /// GET answered `$-1`.
    misses: u64,
    /// Responses whose Correlation Data matches no outstanding request.
    unmatched: u64,
    /// PUBACKs (for requests) with a reason code >= 0x80.
    puback_failures: u64,
    /// PUBACKs with "no matching subscribers" (no state store listening).
    puback_no_subscribers: u64,
    /// Requests still outstanding when the client gave up.
    timed_out: u64,
    first_error: Option<String>,
    error: Option<String>,
    start_ns: u64,
    end_ns: u64,
}

impl OpStats {
    fn new() -> Self {
        OpStats {
            completed: [0; 2],
            hist: [new_histogram(), new_histogram()],
            bad_status: 0,
            resp_errors: 0,
            unexpected: 0,
            misses: 0,
            unmatched: 0,
            puback_failures: 0,
            puback_no_subscribers: 0,
            timed_out: 0,
            first_error: None,
            error: None,
            start_ns: 0,
            end_ns: 0,
        }
    }

    fn failures(&self) -> u64 {
        self.bad_status
            + self.resp_errors
            + self.unexpected
            + self.unmatched
            + self.puback_failures
            + self.timed_out
    }

    fn note(&mut self, what: impl FnOnce() -> String) {
        if self.first_error.is_none() {
            self.first_error = Some(what());
        }
    }

    fn merge(&mut self, o: &OpStats) {
        for i in 0..2 {
            self.completed[i] += o.completed[i];
            let _ = self.hist[i].add(&o.hist[i]);
        }
        self.bad_status += o.bad_status;
        self.resp_errors += o.resp_errors;
        self.unexpected += o.unexpected;
        self.misses += o.misses;
        self.unmatched += o.unmatched;
        self.puback_failures += o.puback_failures;
        self.puback_no_subscribers += o.puback_no_subscribers;
        self.timed_out += o.timed_out;
        if self.first_error.is_none() {
            self.first_error.clone_from(&o.first_error);
        }
        if self.error.is_none() {
            self.error.clone_from(&o.error);
        }
    }
}

/// The client's hybrid logical clock, for `__ts`.
struct Hlc {
    last_ms: u64,
    counter: u32,
}

impl Hlc {
    /// `{ms:15}:{counter:5}:{node}` into `out` (cleared first).
    fn next(&mut self, node: &str, out: &mut String) {
        use std::fmt::Write as _;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        if ms > self.last_ms {
            self.last_ms = ms;
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        out.clear();
        let _ = write!(out, "{:015}:{:05}:{}", self.last_ms, self.counter, node);
    }
}

/// xorshift64*: cheap, and good enough to spread keys.
struct Rng(u64);

impl Rng {
    #[inline]
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    #[inline]
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
    #[inline]
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[inline]
fn key_bytes(k: u64) -> [u8; KEY_LEN] {
    let mut b = *b"key:000000000000";
    let mut n = k;
    for i in (4..KEY_LEN).rev() {
        b[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    b
}

fn push_bulk_len(out: &mut Vec<u8>, n: usize) {
    out.push(b'$');
    out.extend_from_slice(n.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Everything a client needs to build requests.
struct Client {
    index: u32,
    id: String,
    version: Version,
    /// Properties every request carries (all but Correlation Data and `__ts`).
    static_props: Vec<u8>,
    /// RESP prefix of a SET up to the key's bytes, and what follows the key.
    set_head: Vec<u8>,
    set_tail: Vec<u8>,
    get_head: Vec<u8>,
    get_tail: Vec<u8>,
    hlc: Hlc,
    ts: String,
    seq: u64,
    next_pid: u16,
    /// seq -> (sent ns, op)
    outstanding: HashMap<u64, (u64, Op)>,
    /// PUBACKs still due for our requests.
    pubacks_due: u64,
}

impl Client {
    fn new(index: u32, id: String, message_expiry: u32, value_size: usize) -> Self {
        let response_topic = format!("clients/{id}/services/{REQUEST_TOPIC}");
        let mut sp = Vec::with_capacity(256);
        sp.push(0x02); // message expiry interval
        sp.extend_from_slice(&message_expiry.to_be_bytes());
        proto::put_prop_bin(&mut sp, 0x03, b"application/octet-stream");
        proto::put_prop_bin(&mut sp, 0x08, response_topic.as_bytes());
        proto::put_user_prop(&mut sp, b"__srcId", id.as_bytes());
        proto::put_user_prop(&mut sp, b"__protVer", b"1.0");
        proto::put_user_prop(&mut sp, b"$partition", id.as_bytes());

        let mut set_head = b"*3\r\n$3\r\nSET\r\n".to_vec();
        push_bulk_len(&mut set_head, KEY_LEN);
        let mut set_tail = b"\r\n".to_vec();
        push_bulk_len(&mut set_tail, value_size);
        set_tail.resize(set_tail.len() + value_size, b'x');
        set_tail.extend_from_slice(b"\r\n");
        let mut get_head = b"*2\r\n$3\r\nGET\r\n".to_vec();
        push_bulk_len(&mut get_head, KEY_LEN);
        let get_tail = b"\r\n".to_vec();

        Client {
            index,
            id,
            version: Version::V5,
            static_props: sp,
            set_head,
            set_tail,
            get_head,
            get_tail,
            hlc: Hlc {
                last_ms: 0,
                counter: 0,
            },
            ts: String::with_capacity(64),
            seq: 0,
            next_pid: 0,
            outstanding: HashMap::new(),
            pubacks_due: 0,
        }
    }

    fn response_topic(&self) -> String {
        format!("clients/{}/services/{REQUEST_TOPIC}", self.id)
    }

    /// Appends one request PUBLISH to `out` and registers it as outstanding.
    fn encode(&mut self, out: &mut Vec<u8>, op: Op, key: u64) {
        self.hlc.next(&self.id, &mut self.ts);
        let seq = self.seq;
        self.seq += 1;
        self.next_pid = if self.next_pid == u16::MAX {
            1
        } else {
            self.next_pid + 1
        };
        let mut corr = [0u8; 16];
        corr[..8].copy_from_slice(&seq.to_le_bytes());
        corr[8..12].copy_from_slice(&self.index.to_le_bytes());
        corr[12..].copy_from_slice(b"shb!");
        let props_len = self.static_props.len()
            + 3
            + corr.len()
            + proto::user_prop_len(b"__ts", self.ts.as_bytes());
        let (head, tail) = match op {
            Op::Set => (&self.set_head, &self.set_tail),
            Op::Get => (&self.get_head, &self.get_tail),
        };
        let payload_len = head.len() + KEY_LEN + tail.len();
        proto::encode_publish_v5_qos1_header(
            out,
            REQUEST_TOPIC.as_bytes(),
            self.next_pid,
            props_len,
            payload_len,
        );
        out.extend_from_slice(&self.static_props);
        proto::put_prop_bin(out, 0x09, &corr);
        proto::put_user_prop(out, b"__ts", self.ts.as_bytes());
        out.extend_from_slice(head);
        out.extend_from_slice(&key_bytes(key));
        out.extend_from_slice(tail);
        self.outstanding.insert(seq, (now_ns(), op));
        self.pubacks_due += 1;
    }

    /// Handles every complete packet in `buf`; PUBACKs owed go to `acks`.
    fn handle(
        &mut self,
        buf: &mut BytesMut,
        acks: &mut Vec<u8>,
        st: &mut OpStats,
    ) -> Result<(), String> {
        while let Some((first, hl, rl)) = proto::frame(buf).map_err(|e| e.to_string())? {
            let body = &buf[hl..hl + rl];
            match first & 0xF0 {
                proto::PUBLISH => {
                    let p =
                        proto::parse_publish_rpc(first, body).map_err(|e| err_str("PUBLISH", e))?;
                    let now = now_ns();
                    if p.qos == 1 {
                        proto::encode_puback(acks, p.packet_id);
                    }
                    let entry = p
                        .correlation
                        .filter(|c| c.len() == 16 && c[8..12] == self.index.to_le_bytes())
                        .and_then(|c| {
                            let seq = u64::from_le_bytes(c[..8].try_into().unwrap_or_default());
                            self.outstanding.remove(&seq)
                        });
                    let Some((sent, op)) = entry else {
                        st.unmatched += 1;
                        st.note(|| "response with unknown Correlation Data".into());
                        buf.advance(hl + rl);
                        continue;
                    };
                    let i = op as usize;
                    st.completed[i] += 1;
                    st.hist[i].saturating_record(now.saturating_sub(sent).max(1));
                    let pl = p.payload;
                    if p.status != Some(b"200") {
                        st.bad_status += 1;
                        let s = p.status.map(|s| String::from_utf8_lossy(s).into_owned());
                        st.note(|| format!("{op:?}: __stat {}", s.as_deref().unwrap_or("missing")));
                    } else if pl.first() == Some(&b'-') {
                        st.resp_errors += 1;
                        st.note(|| format!("{op:?}: {}", String::from_utf8_lossy(pl).trim_end()));
                    } else {
                        match op {
                            Op::Set if pl == b"+OK\r\n" => {}
                            Op::Get if pl == b"$-1\r\n" => st.misses += 1,
                            Op::Get if pl.first() == Some(&b'$') && pl.ends_with(b"\r\n") => {}
                            _ => {
                                st.unexpected += 1;
                                st.note(|| {
                                    format!(
                                        "{op:?}: unexpected reply {:?}",
                                        String::from_utf8_lossy(pl)
                                    )
                                });
                            }
                        }
                    }
                }
                proto::PUBACK => {
                    let (_, rc) = proto::parse_puback(body).map_err(|e| err_str("PUBACK", e))?;
                    self.pubacks_due = self.pubacks_due.saturating_sub(1);
                    if rc == 0x10 {
                        st.puback_no_subscribers += 1;
                    } else if rc >= 0x80 {
                        st.puback_failures += 1;
                        st.note(|| format!("PUBACK reason 0x{rc:02x}"));
                    }
                }
                proto::DISCONNECT => return Err(proto::describe_disconnect(self.version, body)),
                _ => {}
            }
            buf.advance(hl + rl);
        }
        Ok(())
    }
}

/// How a phase chooses requests and when it ends.
struct Phase {
    /// Populate: SET these keys in order (then stop).
    populate: Option<Vec<u64>>,
    count: Option<u64>,
    duration: Option<Duration>,
    hard_timeout: Duration,
    pipeline: usize,
    ratio_get: f64,
    keys: u64,
    /// No response for this long: the outstanding requests are given up.
    response_timeout: Duration,
}

/// Runs one phase on a connection (a connection failure ends it with `error` set).
async fn run_phase(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    c: &mut Client,
    rng: &mut Rng,
    ph: &Phase,
) -> OpStats {
    let mut st = OpStats::new();
    st.start_ns = now_ns();
    let start = Instant::now();
    let until = start + ph.duration.unwrap_or(ph.hard_timeout).min(ph.hard_timeout);
    let hard = start + ph.hard_timeout;
    let mut out: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut acks: Vec<u8> = Vec::with_capacity(1024);
    let mut sent = 0u64;
    let mut last_progress = Instant::now();
    let total = match &ph.populate {
        Some(keys) => Some(keys.len() as u64),
        None => ph.count,
    };
    loop {
        // Issue requests up to the pipeline depth.
        out.clear();
        out.extend_from_slice(&acks);
        acks.clear();
        let now = Instant::now();
        while c.outstanding.len() < ph.pipeline && total.is_none_or(|t| sent < t) && now < until {
            let (op, key) = match &ph.populate {
                Some(keys) => (Op::Set, keys[sent as usize]),
                None => {
                    let op = if ph.ratio_get > 0.0 && rng.unit() < ph.ratio_get {
                        Op::Get
                    } else {
                        Op::Set
                    };
                    (op, rng.below(ph.keys))
                }
            };
            c.encode(&mut out, op, key);
            sent += 1;
        }
        if !out.is_empty() {
            if let Err(e) = stream.write_all(&out).await {
                st.error = Some(err_str("write", e));
                break;
            }
        }
        let more = total.is_none_or(|t| sent < t) && Instant::now() < until;
        if c.outstanding.is_empty() && !more {
            break;
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        let deadline = (last_progress + ph.response_timeout).min(hard + ph.response_timeout);
        match timeout_at(deadline.into(), stream.read_buf(buf)).await {
            Ok(Ok(0)) => {
                st.error = Some("connection closed by the broker".into());
                break;
            }
            Ok(Ok(_)) => {
                let before = c.outstanding.len();
                if let Err(e) = c.handle(buf, &mut acks, &mut st) {
                    st.error = Some(e);
                    break;
                }
                if c.outstanding.len() < before {
                    last_progress = Instant::now();
                }
            }
            Ok(Err(e)) => {
                st.error = Some(err_str("read", e));
                break;
            }
            Err(_) => {
                st.note(|| {
                    format!(
                        "no response within {:.0}s",
                        ph.response_timeout.as_secs_f64()
                    )
                });
                break;
            }
        }
    }
    st.end_ns = now_ns();
    if !acks.is_empty() {
        let _ = stream.write_all(&acks).await;
    }
    st.timed_out = c.outstanding.len() as u64;
    c.outstanding.clear();
    st
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    ack: ConnAck,
}

async fn connect(addr: SocketAddr, c: &Client, keep_alive: u16) -> Result<Conn, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| err_str("connect", e))?;
    stream
        .set_nodelay(true)
        .map_err(|e| err_str("set_nodelay", e))?;
    let mut out = Vec::with_capacity(64);
    proto::encode_connect_v5_session(&mut out, &c.id, keep_alive, false, 3600);
    stream
        .write_all(&out)
        .await
        .map_err(|e| err_str("write CONNECT", e))?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let (first, body) = read_packet(&mut stream, &mut buf).await?;
    if first & 0xF0 != proto::CONNACK {
        return Err(format!("expected CONNACK, got packet type 0x{first:02x}"));
    }
    let ack = proto::parse_connack(Version::V5, &body).map_err(|e| err_str("CONNACK", e))?;
    if ack.reason != 0 {
        return Err(format!(
            "broker refused the connection: reason 0x{:02x}{}",
            ack.reason,
            ack.reason_string
                .as_deref()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default()
        ));
    }
    // Like the SDK: SUBSCRIBE to the response topic once connected.
    out.clear();
    proto::encode_subscribe(&mut out, Version::V5, 1, &[c.response_topic()], 1);
    stream
        .write_all(&out)
        .await
        .map_err(|e| err_str("write SUBSCRIBE", e))?;
    loop {
        let (first, body) = read_packet(&mut stream, &mut buf).await?;
        match first & 0xF0 {
            proto::SUBACK => {
                let (_, codes) =
                    proto::parse_suback(Version::V5, &body).map_err(|e| err_str("SUBACK", e))?;
                if let Some(bad) = codes.iter().find(|c| **c >= 0x80) {
                    return Err(format!("subscription refused: reason 0x{bad:02x}"));
                }
                break;
            }
            proto::DISCONNECT => return Err(proto::describe_disconnect(Version::V5, &body)),
            _ => {}
        }
    }
    Ok(Conn { stream, buf, ack })
}

struct ClientResult {
    populate: Option<OpStats>,
    measure: Option<OpStats>,
}

#[allow(clippy::too_many_arguments)]
async fn run_client(
    mut conn: Conn,
    mut c: Client,
    populate: Option<Phase>,
    measure: Phase,
    populated: Arc<Barrier>,
    go: Arc<Barrier>,
    seed: u64,
) -> ClientResult {
    let mut rng = Rng(seed | 1);
    let mut res = ClientResult {
        populate: None,
        measure: None,
    };
    let mut alive = true;
    if let Some(ph) = &populate {
        let st = run_phase(&mut conn.stream, &mut conn.buf, &mut c, &mut rng, ph).await;
        alive = st.error.is_none();
        res.populate = Some(st);
    }
    populated.wait().await;
    go.wait().await;
    if alive {
        res.measure =
            Some(run_phase(&mut conn.stream, &mut conn.buf, &mut c, &mut rng, &measure).await);
        // Collect the PUBACKs still due, briefly, so they are not reported as missing
        // only because the run ended.
        let deadline = Instant::now() + Duration::from_millis(200);
        while c.pubacks_due > 0 {
            match timeout_at(deadline.into(), conn.stream.read_buf(&mut conn.buf)).await {
                Ok(Ok(n)) if n > 0 => {
                    let mut acks = Vec::new();
                    let mut scratch = OpStats::new();
                    if c.handle(&mut conn.buf, &mut acks, &mut scratch).is_err() {
                        break;
                    }
                    if let Some(m) = res.measure.as_mut() {
                        m.puback_failures += scratch.puback_failures;
                        m.unmatched += scratch.unmatched;
                    }
                    if !acks.is_empty() {
                        let _ = conn.stream.write_all(&acks).await;
                    }
                }
                _ => break,
            }
        }
    }
    let mut out = Vec::with_capacity(16);
    proto::encode_disconnect_v5_end_session(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.stream.write_all(&out).await;
        let _ = conn.stream.shutdown().await;
    })
    .await;
    res
}

/// CPU seconds (user + system) this process has used, from /proc (Linux only).
fn process_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux platform Rust supports.
    Some(ticks as f64 / 100.0)
}

pub async fn run(args: StateStoreArgs) -> Result<Report, String> {
    let _ = base();
    if !(0.0..=1.0).contains(&args.ratio_get) {
        return Err("--ratio-get must be between 0 and 1".into());
    }
    let n = args.clients as usize;
    let duration = args.duration.map(secs).transpose()?;
    let count = match duration {
        Some(_) => None,
        None => Some(args.requests_per_client.unwrap_or(DEFAULT_REQUESTS)),
    };
    let hard_timeout = secs(args.timeout)?;
    let connect_timeout = secs(args.connect_timeout)?;
    if duration.is_some_and(|d| d > hard_timeout) {
        return Err("--duration is longer than --timeout".into());
    }
    let response_timeout = Duration::from_secs(u64::from(args.message_expiry) + 5);

    let addr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await
        .map_err(|e| err_str(&format!("resolve {}", args.host), e))?
        .next()
        .ok_or_else(|| format!("{} did not resolve", args.host))?;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let run_id = format!("{:x}-{:x}", std::process::id(), nanos);
    let run_bound = duration.unwrap_or(hard_timeout) * 2 + Duration::from_secs(60);
    let keep_alive = run_bound.as_secs().clamp(60, u64::from(u16::MAX)) as u16;

    let progress = |msg: String| {
        if !args.quiet {
            eprintln!("[statehub-bench] {msg}");
        }
    };

    progress(format!("connecting {n} state store clients to {addr}"));
    let deadline = Instant::now() + connect_timeout;
    let expiry = args.message_expiry;
    let value_size = args.value_size as usize;
    let conns = {
        let run_id = run_id.clone();
        all(n, deadline, "client", move |i| {
            let c = Client::new(i as u32, format!("shb-{run_id}-{i}"), expiry, value_size);
            async move {
                let conn = connect(addr, &c, keep_alive).await?;
                Ok((conn, c))
            }
        })
        .await?
    };

    let mut report = Report::new("statestore");
    let mut pipeline = args.pipeline;
    let receive_maximum = conns
        .iter()
        .filter_map(|(c, _)| c.ack.receive_maximum)
        .min();
    if let Some(rm) = receive_maximum {
        if rm < pipeline {
            report.warn(format!(
                "--pipeline {pipeline} capped to the broker's Receive Maximum {rm}"
            ));
            pipeline = rm.max(1);
        }
    }

    let populate = args.ratio_get > 0.0 && !args.no_populate;
    let populated = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let seed_base = u64::from(nanos) ^ (u64::from(std::process::id()) << 32);
    if populate {
        progress(format!("populating {} keys", args.keys));
    }
    let handles: Vec<JoinHandle<ClientResult>> = conns
        .into_iter()
        .enumerate()
        .map(|(i, (conn, c))| {
            let pop = populate.then(|| Phase {
                populate: Some((i as u64..args.keys).step_by(n).collect()),
                count: None,
                duration: None,
                hard_timeout,
                pipeline: usize::from(pipeline)
                    .max(POPULATE_PIPELINE)
                    .min(usize::from(receive_maximum.unwrap_or(u16::MAX).max(1))),
                ratio_get: 0.0,
                keys: args.keys,
                response_timeout,
            });
            let measure = Phase {
                populate: None,
                count,
                duration,
                hard_timeout,
                pipeline: usize::from(pipeline),
                ratio_get: args.ratio_get,
                keys: args.keys,
                response_timeout,
            };
            let seed = seed_base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            tokio::spawn(run_client(
                conn,
                c,
                pop,
                measure,
                populated.clone(),
                go.clone(),
                seed,
            ))
        })
        .collect();
    populated.wait().await;
    progress(match (count, duration) {
        (Some(k), _) => format!("measuring: {k} requests per client, pipeline {pipeline}"),
        (None, Some(d)) => format!("measuring for {:.1}s, pipeline {pipeline}", d.as_secs_f64()),
        _ => String::new(),
    });
    let cpu0 = process_cpu_secs();
    let t0 = now_ns();
    go.wait().await;

    let finish_by = Instant::now() + hard_timeout + response_timeout * 2 + Duration::from_secs(5);
    let mut pop_total = OpStats::new();
    let mut total = OpStats::new();
    let mut end_ns = t0;
    for (i, h) in handles.into_iter().enumerate() {
        let abort = h.abort_handle();
        match timeout_at(finish_by.into(), h).await {
            Ok(Ok(r)) => {
                if let Some(p) = &r.populate {
                    if let Some(e) = &p.error {
                        report.error(format!("client {i} while populating: {e}"));
                    }
                    pop_total.merge(p);
                }
                if let Some(m) = &r.measure {
                    if let Some(e) = &m.error {
                        report.error(format!("client {i}: {e}"));
                    }
                    end_ns = end_ns.max(m.end_ns);
                    total.merge(m);
                }
            }
            Ok(Err(e)) => report.error(format!("client {i}: task failed: {e}")),
            Err(_) => {
                abort.abort();
                report.error(format!("client {i}: did not finish in time"));
            }
        }
    }
    let cpu1 = process_cpu_secs();
    let elapsed = end_ns.saturating_sub(t0) as f64 / 1e9;
    let rate = |k: u64| {
        if elapsed > 0.0 {
            k as f64 / elapsed
        } else {
            0.0
        }
    };

    report.param("broker", "broker", Value::Str(addr.to_string()));
    report.param("clients", "clients", Value::Int(n as u64));
    report.param(
        "pipeline",
        "pipeline (requests outstanding per client)",
        Value::Int(u64::from(pipeline)),
    );
    report.param("ratio_get", "GET ratio", Value::Float(args.ratio_get));
    report.param("keys", "keys", Value::Int(args.keys));
    report.param(
        "value_size",
        "value bytes",
        Value::Int(u64::from(args.value_size)),
    );
    match (count, duration) {
        (Some(k), _) => report.param("requests_per_client", "requests per client", Value::Int(k)),
        (None, Some(d)) => {
            report.param("duration_s", "duration (s)", Value::Float(d.as_secs_f64()))
        }
        _ => {}
    }
    if populate {
        let done = pop_total.completed[Op::Set as usize];
        report.result(
            "populated",
            "keys populated (SET before measuring)",
            Value::Int(done),
        );
        if pop_total.failures() > 0 {
            report.error(format!(
                "{} populate requests failed (first: {})",
                pop_total.failures(),
                pop_total.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    let sets = total.completed[Op::Set as usize];
    let gets = total.completed[Op::Get as usize];
    report.result("seconds", "measured time (s)", Value::Float(elapsed));
    report.result("requests", "requests completed", Value::Int(sets + gets));
    report.result("ops_per_sec", "ops/s", Value::Float(rate(sets + gets)));
    report.result("set", "SETs completed", Value::Int(sets));
    report.result("set_per_sec", "SET ops/s", Value::Float(rate(sets)));
    report.result("get", "GETs completed", Value::Int(gets));
    report.result("get_per_sec", "GET ops/s", Value::Float(rate(gets)));
    report.result("get_misses", "GET misses ($-1)", Value::Int(total.misses));
    report.result(
        "bad_status",
        "responses without __stat 200",
        Value::Int(total.bad_status),
    );
    report.result(
        "resp_errors",
        "RESP error replies",
        Value::Int(total.resp_errors),
    );
    report.result(
        "unexpected",
        "unexpected replies",
        Value::Int(total.unexpected),
    );
    report.result(
        "unmatched",
        "unmatched responses",
        Value::Int(total.unmatched),
    );
    report.result(
        "puback_failures",
        "request PUBACK failures",
        Value::Int(total.puback_failures),
    );
    report.result(
        "timed_out",
        "requests without response",
        Value::Int(total.timed_out),
    );
    let errors = total.failures() + if populate { total.misses } else { 0 };
    report.result("error_count", "errors (total)", Value::Int(errors));
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        let cpu = (b - a).max(0.0);
        report.result("bench_cpu_seconds", "bench CPU time (s)", Value::Float(cpu));
        report.result(
            "bench_cpu_pct",
            "bench CPU % of one core",
            Value::Float(if elapsed > 0.0 {
                cpu * 100.0 / elapsed
            } else {
                0.0
            }),
        );
    }
    let mut both = new_histogram();
    let _ = both.add(&total.hist[0]);
    let _ = both.add(&total.hist[1]);
    report.latency("latency", "latency (all)", Latency::from_histogram(&both));
    report.latency(
        "set_latency",
        "latency SET",
        Latency::from_histogram(&total.hist[Op::Set as usize]),
    );
    report.latency(
        "get_latency",
        "latency GET",
        Latency::from_histogram(&total.hist[Op::Get as usize]),
    );

    if total.puback_no_subscribers > 0 {
        report.warn(format!(
            "{} request PUBACKs said \"no matching subscribers\": is a state store running?",
            total.puback_no_subscribers
        ));
    }
    if let Some(e) = &total.first_error {
        report.warn(format!("first failure: {e}"));
    }
    if let Some(k) = count {
        if sets + gets < k * n as u64 {
            report.warn(format!(
                "{} of {} requests were not completed",
                k * n as u64 - sets - gets,
                k * n as u64
            ));
        }
    }
    if args.fail_on_error && errors > 0 {
        report.fail();
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_width() {
        assert_eq!(&key_bytes(0), b"key:000000000000");
        assert_eq!(&key_bytes(1234), b"key:000000001234");
    }

    #[test]
    fn request_encoding() {
        let mut c = Client::new(3, "cid".into(), 10, 5);
        let mut out = Vec::new();
        c.encode(&mut out, Op::Set, 7);
        let (first, hl, rl) = proto::frame(&out).unwrap().unwrap();
        assert_eq!(hl + rl, out.len());
        assert_eq!(first, 0x32);
        assert!(out.ends_with(b"*3\r\n$3\r\nSET\r\n$16\r\nkey:000000000007\r\n$5\r\nxxxxx\r\n"));
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("clients/cid/services/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke"));
        assert!(text.contains(":00000:cid"));
        // Parse it back as a PUBLISH: properties are well formed.
        let p = proto::parse_publish_rpc(first, &out[hl..]).unwrap();
        assert_eq!(p.correlation.map(<[u8]>::len), Some(16));
        assert!(p.payload.starts_with(b"*3\r\n"));
        out.clear();
        c.encode(&mut out, Op::Get, 8);
        assert!(out.ends_with(b"*2\r\n$3\r\nGET\r\n$16\r\nkey:000000000008\r\n"));
        assert_eq!(c.outstanding.len(), 2);
    }
}
