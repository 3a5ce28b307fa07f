//! The `mqtt` scenario: N publishers, M subscribers, QoS 0 or 1, MQTT 5 or 3.1.1.
//!
//! Phases, each bounded in time:
//! 1. connect every subscriber and wait for every SUBACK (`--connect-timeout`);
//! 2. connect every publisher (CONNACK);
//! 3. start all publishers at once; each stops after `--messages-per-publisher`
//!    messages or `--duration` seconds (and never later than `--timeout`); a QoS 1
//!    publisher then waits up to `--drain-timeout` for its outstanding PUBACKs;
//! 4. wait until subscribers have received every expected message, or until no
//!    message arrived for `--drain-timeout` seconds;
//! 5. stop, disconnect, report.
//!
//! Every payload starts with a 20-byte header — publisher index (u32), sequence
//! number (u64) and send time (u64, ns since the process' time base), little
//! endian — so subscribers compute publish-to-receive latency and detect gaps and
//! duplicates per publisher. Publishers and subscribers live in one process, so
//! both ends read the same monotonic clock.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use crate::proto::{self, ConnAck, Version};
use crate::report::{new_histogram, Latency, Report, Value};

/// Bytes of the payload header (publisher index, sequence, timestamp).
pub const HEADER_LEN: usize = 20;
/// Messages published per batch (one write syscall) at most.
const MAX_BATCH_MSGS: usize = 64;
/// Bytes per batch at most.
const MAX_BATCH_BYTES: usize = 32 * 1024;
/// Default message count when neither `--messages-per-publisher` nor `--duration` is given.
const DEFAULT_MESSAGES: u64 = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TopicMode {
    /// Every publisher publishes to one topic; every subscriber subscribes to it.
    Shared,
    /// Publisher i publishes to its own topic. Subscribers are spread over the
    /// topics: with M >= N subscriber j takes topic j mod N, otherwise subscriber j
    /// takes every topic i with i mod M == j.
    PerPublisher,
}

#[derive(Debug, Args)]
pub struct MqttArgs {
    /// Broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Broker MQTT port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// Number of publishing connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub publishers: u32,
    /// Number of subscribing connections (0: measure publishing only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub subscribers: u32,
    /// QoS of publishes and subscriptions.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub qos: u8,
    /// Messages each publisher sends [default: 10000 unless --duration is given].
    #[arg(long, conflicts_with = "duration")]
    pub messages_per_publisher: Option<u64>,
    /// Publish for this many seconds instead of a fixed message count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Payload bytes per message (at least 20: the timestamp header).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(HEADER_LEN as i64..=16 * 1024 * 1024))]
    pub payload_size: u32,
    /// Topic layout.
    #[arg(long, value_enum, default_value_t = TopicMode::Shared)]
    pub topic_mode: TopicMode,
    /// Speak MQTT 3.1.1 instead of MQTT 5.
    #[arg(long)]
    pub v311: bool,
    /// QoS 1: PUBLISHes in flight (awaiting PUBACK) per publisher; capped by the
    /// broker's Receive Maximum under MQTT 5.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub inflight: u16,
    /// Messages per second per publisher (0: as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Seconds allowed for connecting and subscribing all clients.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// After publishing: seconds without progress before outstanding PUBACKs and
    /// deliveries are given up as lost.
    #[arg(long, default_value_t = 5.0)]
    pub drain_timeout: f64,
    /// Hard limit in seconds on the publishing phase.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Topic prefix; a per-run id is appended so runs never see each other's messages.
    #[arg(long, default_value = "statehub-bench")]
    pub topic_prefix: String,
    /// Exit with status 1 if any expected message was lost (or any QoS 1 PUBACK missing).
    #[arg(long)]
    pub fail_on_loss: bool,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

static TIME_BASE: OnceLock<Instant> = OnceLock::new();

pub(crate) fn base() -> Instant {
    *TIME_BASE.get_or_init(Instant::now)
}

#[inline]
pub(crate) fn now_ns() -> u64 {
    base().elapsed().as_nanos() as u64
}

pub(crate) fn secs(s: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(s).map_err(|e| format!("bad duration {s}: {e}"))
}

pub(crate) fn err_str(context: &str, e: impl std::fmt::Display) -> String {
    format!("{context}: {e}")
}

// ---------------------------------------------------------------------------
// Connection setup
// ---------------------------------------------------------------------------

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    ack: ConnAck,
}

/// Reads one whole packet during setup; returns its first byte and body.
pub(crate) async fn read_packet(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
) -> Result<(u8, Vec<u8>), String> {
    loop {
        if let Some((first, hl, rl)) = proto::frame(buf).map_err(|e| e.to_string())? {
            let body = buf[hl..hl + rl].to_vec();
            buf.advance(hl + rl);
            return Ok((first, body));
        }
        if stream.read_buf(buf).await.map_err(|e| err_str("read", e))? == 0 {
            return Err("connection closed by the broker".into());
        }
    }
}

async fn connect(
    addr: SocketAddr,
    v: Version,
    client_id: &str,
    keep_alive: u16,
) -> Result<Conn, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| err_str("connect", e))?;
    stream
        .set_nodelay(true)
        .map_err(|e| err_str("set_nodelay", e))?;
    let mut out = Vec::with_capacity(64);
    proto::encode_connect(&mut out, v, client_id, keep_alive);
    stream
        .write_all(&out)
        .await
        .map_err(|e| err_str("write CONNECT", e))?;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let (first, body) = read_packet(&mut stream, &mut buf).await?;
    if first & 0xF0 != proto::CONNACK {
        return Err(format!("expected CONNACK, got packet type 0x{first:02x}"));
    }
    let ack = proto::parse_connack(v, &body).map_err(|e| err_str("CONNACK", e))?;
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
    Ok(Conn { stream, buf, ack })
}

async fn subscribe(conn: &mut Conn, v: Version, filters: &[String], qos: u8) -> Result<u8, String> {
    let mut out = Vec::new();
    proto::encode_subscribe(&mut out, v, 1, filters, qos);
    conn.stream
        .write_all(&out)
        .await
        .map_err(|e| err_str("write SUBSCRIBE", e))?;
    loop {
        let (first, body) = read_packet(&mut conn.stream, &mut conn.buf).await?;
        match first & 0xF0 {
            proto::SUBACK => {
                let (_, codes) = proto::parse_suback(v, &body).map_err(|e| err_str("SUBACK", e))?;
                if codes.len() != filters.len() {
                    return Err(format!(
                        "SUBACK has {} codes for {} filters",
                        codes.len(),
                        filters.len()
                    ));
                }
                if let Some(bad) = codes.iter().find(|c| **c >= 0x80) {
                    return Err(format!("subscription refused: reason 0x{bad:02x}"));
                }
                return Ok(codes.iter().copied().min().unwrap_or(qos));
            }
            proto::DISCONNECT => return Err(proto::describe_disconnect(v, &body)),
            _ => {} // nothing else is expected before SUBACK; ignore
        }
    }
}

// ---------------------------------------------------------------------------
// Subscribers
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct SubStats {
    received: u64,
    duplicates: u64,
    gaps: u64,
    foreign: u64,
    last_recv_ns: u64,
    hist: Histogram<u64>,
    error: Option<String>,
}

async fn run_subscriber(
    conn: Conn,
    v: Version,
    n_publishers: usize,
    received_total: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> SubStats {
    let (mut rd, mut wr) = conn.stream.into_split();
    let mut buf = conn.buf;
    let mut st = SubStats {
        received: 0,
        duplicates: 0,
        gaps: 0,
        foreign: 0,
        last_recv_ns: 0,
        hist: new_histogram(),
        error: None,
    };
    let mut next_seq = vec![0u64; n_publishers];
    let mut acks: Vec<u8> = Vec::with_capacity(4096);

    'outer: loop {
        let mut n = 0u64;
        loop {
            let (first, hl, rl) = match proto::frame(&buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    st.error = Some(e.to_string());
                    break 'outer;
                }
            };
            let body = &buf[hl..hl + rl];
            match first & 0xF0 {
                proto::PUBLISH => {
                    let p = match proto::parse_publish(v, first, body) {
                        Ok(p) => p,
                        Err(e) => {
                            st.error = Some(err_str("PUBLISH", e));
                            break 'outer;
                        }
                    };
                    if p.qos == 1 {
                        proto::encode_puback(&mut acks, p.packet_id);
                    }
                    let now = now_ns();
                    n += 1;
                    st.last_recv_ns = now;
                    let pl = p.payload;
                    if pl.len() < HEADER_LEN {
                        st.foreign += 1;
                    } else {
                        let pub_id = u32::from_le_bytes([pl[0], pl[1], pl[2], pl[3]]) as usize;
                        let seq = u64::from_le_bytes(pl[4..12].try_into().unwrap_or_default());
                        let ts = u64::from_le_bytes(pl[12..20].try_into().unwrap_or_default());
                        match next_seq.get_mut(pub_id) {
                            None => st.foreign += 1,
                            Some(next) => {
                                st.hist.saturating_record(now.saturating_sub(ts).max(1));
                                if seq == *next {
                                    *next += 1;
                                } else if seq > *next {
                                    st.gaps += seq - *next;
                                    *next = seq + 1;
                                } else {
                                    st.duplicates += 1;
                                }
                            }
                        }
                    }
                }
                proto::DISCONNECT => {
                    st.error = Some(proto::describe_disconnect(v, body));
                    break 'outer;
                }
                _ => {}
            }
            buf.advance(hl + rl);
        }
        if n > 0 {
            st.received += n;
            received_total.fetch_add(n, Ordering::Relaxed);
        }
        if !acks.is_empty() {
            if let Err(e) = wr.write_all(&acks).await {
                st.error = Some(err_str("write PUBACK", e));
                break;
            }
            acks.clear();
        }
        if *stop.borrow() {
            break;
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => {
                    if !*stop.borrow() {
                        st.error = Some("connection closed by the broker".into());
                    }
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    st.error = Some(err_str("read", e));
                    break;
                }
            },
            _ = stop.changed() => break,
        }
    }
    disconnect(wr).await;
    st
}

async fn disconnect(mut wr: OwnedWriteHalf) {
    let mut out = Vec::with_capacity(2);
    proto::encode_disconnect(&mut out);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = wr.write_all(&out).await;
        let _ = wr.shutdown().await;
    })
    .await;
}

// ---------------------------------------------------------------------------
// Publishers
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct PubStats {
    published: u64,
    acked: u64,
    ack_failures: u64,
    done_publishing_ns: u64,
    last_ack_ns: u64,
    ack_hist: Histogram<u64>,
    error: Option<String>,
}

#[derive(Debug, Clone)]
struct PubPlan {
    index: u32,
    version: Version,
    qos: u8,
    topic: Vec<u8>,
    payload_size: usize,
    /// Stop after this many messages (None: until `until`).
    count: Option<u64>,
    /// Stop publishing at this instant (the end of `--duration`, or the hard timeout).
    until: Instant,
    start: Instant,
    rate: f64,
    window: u16,
    drain: Duration,
}

impl PubPlan {
    /// Appends message `seq` to `out`.
    #[inline]
    fn encode(&self, out: &mut Vec<u8>, seq: u64, packet_id: u16) {
        proto::encode_publish_header(
            out,
            self.version,
            &self.topic,
            self.qos,
            packet_id,
            self.payload_size,
        );
        out.extend_from_slice(&self.index.to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&now_ns().to_le_bytes());
        out.resize(out.len() + self.payload_size - HEADER_LEN, 0);
    }

    fn done(&self, seq: u64) -> bool {
        self.count.is_some_and(|k| seq >= k)
    }

    /// How many messages may be sent now (rate limiting), or when the next is due.
    fn allowance(&self, seq: u64) -> Result<usize, Instant> {
        if self.rate <= 0.0 {
            return Ok(MAX_BATCH_MSGS);
        }
        let due = (self.start.elapsed().as_secs_f64() * self.rate) as u64 + 1;
        if due > seq {
            Ok((due - seq).min(MAX_BATCH_MSGS as u64) as usize)
        } else {
            Err(self.start + Duration::from_secs_f64(seq as f64 / self.rate))
        }
    }
}

async fn run_publisher(conn: Conn, plan: PubPlan) -> PubStats {
    let (rd, wr) = conn.stream.into_split();
    if plan.qos == 0 {
        publish_qos0(rd, wr, conn.buf, plan).await
    } else {
        publish_qos1(rd, wr, conn.buf, plan).await
    }
}

/// Watches the read side of a QoS 0 publisher, only to notice a broker disconnect.
async fn watch_qos0(mut rd: OwnedReadHalf, mut buf: BytesMut, v: Version) -> String {
    loop {
        while let Ok(Some((first, hl, rl))) = proto::frame(&buf) {
            if first & 0xF0 == proto::DISCONNECT {
                return proto::describe_disconnect(v, &buf[hl..hl + rl]);
            }
            buf.advance(hl + rl);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => return "connection closed by the broker".into(),
            Ok(_) => {}
            Err(e) => return err_str("read", e),
        }
    }
}

async fn publish_qos0(
    rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    buf: BytesMut,
    plan: PubPlan,
) -> PubStats {
    let mut watcher = tokio::spawn(watch_qos0(rd, buf, plan.version));
    let mut st = PubStats {
        published: 0,
        acked: 0,
        ack_failures: 0,
        done_publishing_ns: 0,
        last_ack_ns: 0,
        ack_hist: new_histogram(),
        error: None,
    };
    let mut out = Vec::with_capacity(MAX_BATCH_BYTES + plan.payload_size + 256);
    let mut seq = 0u64;
    while !plan.done(seq) && Instant::now() < plan.until {
        let allowed = match plan.allowance(seq) {
            Ok(n) => n,
            Err(at) => {
                tokio::time::sleep_until(at.min(plan.until).into()).await;
                continue;
            }
        };
        out.clear();
        let first = seq;
        for _ in 0..allowed {
            if plan.done(seq) || out.len() >= MAX_BATCH_BYTES {
                break;
            }
            plan.encode(&mut out, seq, 0);
            seq += 1;
        }
        match timeout_at(plan.until.max(Instant::now()).into(), wr.write_all(&out)).await {
            Ok(Ok(())) => st.published = seq,
            Ok(Err(e)) => {
                st.published = first;
                st.error = Some(err_str("write PUBLISH", e));
                break;
            }
            Err(_) => {
                // Stuck behind the broker's back-pressure at the deadline: the batch
                // may be partly sent; count it so losses are not hidden.
                st.published = seq;
                break;
            }
        }
        if watcher.is_finished() {
            break;
        }
    }
    st.done_publishing_ns = now_ns();
    if watcher.is_finished() {
        if let Ok(e) = (&mut watcher).await {
            st.error.get_or_insert(e);
        }
    } else {
        watcher.abort();
    }
    disconnect(wr).await;
    st
}

struct AckStats {
    acked: u64,
    failures: u64,
    last_ack_ns: u64,
    hist: Histogram<u64>,
    error: Option<String>,
}

async fn read_acks(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    v: Version,
    sent_at: Arc<Vec<AtomicU64>>,
    ids: mpsc::UnboundedSender<u16>,
    mut stop: oneshot::Receiver<()>,
) -> AckStats {
    let mut st = AckStats {
        acked: 0,
        failures: 0,
        last_ack_ns: 0,
        hist: new_histogram(),
        error: None,
    };
    'outer: loop {
        loop {
            let (first, hl, rl) = match proto::frame(&buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    st.error = Some(e.to_string());
                    break 'outer;
                }
            };
            let body = &buf[hl..hl + rl];
            match first & 0xF0 {
                proto::PUBACK => {
                    let (pid, rc) = match proto::parse_puback(body) {
                        Ok(x) => x,
                        Err(e) => {
                            st.error = Some(err_str("PUBACK", e));
                            break 'outer;
                        }
                    };
                    let now = now_ns();
                    st.acked += 1;
                    st.last_ack_ns = now;
                    if rc >= 0x80 {
                        st.failures += 1;
                    }
                    if let Some(t) = sent_at.get(usize::from(pid)) {
                        st.hist.saturating_record(
                            now.saturating_sub(t.load(Ordering::Relaxed)).max(1),
                        );
                    }
                    let _ = ids.send(pid);
                }
                proto::DISCONNECT => {
                    st.error = Some(proto::describe_disconnect(v, body));
                    break 'outer;
                }
                _ => {}
            }
            buf.advance(hl + rl);
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        tokio::select! {
            r = rd.read_buf(&mut buf) => match r {
                Ok(0) => {
                    st.error = Some("connection closed by the broker".into());
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    st.error = Some(err_str("read", e));
                    break;
                }
            },
            _ = &mut stop => break,
        }
    }
    st
}

async fn publish_qos1(
    rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    buf: BytesMut,
    plan: PubPlan,
) -> PubStats {
    let sent_at: Arc<Vec<AtomicU64>> =
        Arc::new((0..=u16::MAX as usize).map(|_| AtomicU64::new(0)).collect());
    let (id_tx, mut id_rx) = mpsc::unbounded_channel::<u16>();
    for id in 1..=plan.window {
        let _ = id_tx.send(id);
    }
    let (stop_tx, stop_rx) = oneshot::channel();
    let reader: JoinHandle<AckStats> = tokio::spawn(read_acks(
        rd,
        buf,
        plan.version,
        sent_at.clone(),
        id_tx,
        stop_rx,
    ));

    let mut error = None;
    let mut out = Vec::with_capacity(MAX_BATCH_BYTES + plan.payload_size + 256);
    let mut seq = 0u64;
    // A free packet id taken from the pool but not used yet.
    let mut spare: Option<u16> = None;
    while !plan.done(seq) && Instant::now() < plan.until {
        let allowed = match plan.allowance(seq) {
            Ok(n) => n,
            Err(at) => {
                tokio::time::sleep_until(at.min(plan.until).into()).await;
                continue;
            }
        };
        // Wait for one free packet id, then take whatever else is free without waiting.
        let mut id = match spare.take() {
            Some(id) => Some(id),
            None => match timeout_at(plan.until.into(), id_rx.recv()).await {
                Ok(Some(id)) => Some(id),
                Ok(None) => break, // the reader ended: the broker disconnected
                Err(_) => break,   // deadline
            },
        };
        out.clear();
        let mut n = 0;
        while n < allowed && !plan.done(seq) && out.len() < MAX_BATCH_BYTES {
            let pid = match id.take().or_else(|| id_rx.try_recv().ok()) {
                Some(pid) => pid,
                None => break,
            };
            sent_at[usize::from(pid)].store(now_ns(), Ordering::Relaxed);
            plan.encode(&mut out, seq, pid);
            seq += 1;
            n += 1;
        }
        spare = id;
        if let Err(e) = wr.write_all(&out).await {
            error = Some(err_str("write PUBLISH", e));
            break;
        }
    }
    let done_publishing_ns = now_ns();

    // Every packet id is either free (in the channel or `spare`) or in flight:
    // wait until all are free again, as long as PUBACKs keep coming.
    let mut free = usize::from(spare.is_some());
    let mut drain_deadline = Instant::now() + plan.drain;
    while free < usize::from(plan.window) {
        match timeout_at(drain_deadline.into(), id_rx.recv()).await {
            Ok(Some(_)) => {
                free += 1;
                drain_deadline = Instant::now() + plan.drain;
            }
            Ok(None) | Err(_) => break,
        }
    }
    let _ = stop_tx.send(());
    let acks = match tokio::time::timeout(Duration::from_secs(2), reader).await {
        Ok(Ok(a)) => Some(a),
        _ => None,
    };
    disconnect(wr).await;
    let mut st = PubStats {
        published: seq,
        acked: 0,
        ack_failures: 0,
        done_publishing_ns,
        last_ack_ns: 0,
        ack_hist: new_histogram(),
        error,
    };
    if let Some(a) = acks {
        st.acked = a.acked;
        st.ack_failures = a.failures;
        st.last_ack_ns = a.last_ack_ns;
        st.ack_hist = a.hist;
        if st.error.is_none() {
            st.error = a.error;
        }
    } else if st.error.is_none() {
        st.error = Some("PUBACK reader did not stop".into());
    }
    st
}

// ---------------------------------------------------------------------------
// Orchestration
// ---------------------------------------------------------------------------

/// Runs `f(i)` for i in 0..n concurrently with a deadline; the first error wins.
pub(crate) async fn all<T, F, Fut>(
    n: usize,
    deadline: Instant,
    what: &str,
    f: F,
) -> Result<Vec<T>, String>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
{
    let handles: Vec<JoinHandle<Result<T, String>>> = (0..n).map(|i| tokio::spawn(f(i))).collect();
    let mut out = Vec::with_capacity(n);
    let mut first_err = None;
    for (i, h) in handles.into_iter().enumerate() {
        if first_err.is_some() {
            h.abort();
            continue;
        }
        let abort = h.abort_handle();
        match timeout_at(deadline.into(), h).await {
            Ok(Ok(Ok(v))) => out.push(v),
            Ok(Ok(Err(e))) => first_err = Some(format!("{what} {i}: {e}")),
            Ok(Err(e)) => first_err = Some(format!("{what} {i}: task failed: {e}")),
            Err(_) => {
                abort.abort();
                first_err = Some(format!("{what} {i}: timed out (--connect-timeout)"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

pub async fn run(args: MqttArgs) -> Result<Report, String> {
    let _ = base();
    let version = if args.v311 {
        Version::V311
    } else {
        Version::V5
    };
    let n_pub = args.publishers as usize;
    let n_sub = args.subscribers as usize;
    let qos = args.qos;
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err("--rate must be a non-negative number".into());
    }
    let duration = args.duration.map(secs).transpose()?;
    let count = match duration {
        Some(_) => None,
        None => Some(args.messages_per_publisher.unwrap_or(DEFAULT_MESSAGES)),
    };
    let hard_timeout = secs(args.timeout)?;
    let drain = secs(args.drain_timeout)?;
    let connect_timeout = secs(args.connect_timeout)?;
    if let Some(d) = duration {
        if d > hard_timeout {
            return Err("--duration is longer than --timeout".into());
        }
    }

    let addr = tokio::net::lookup_host((args.host.as_str(), args.port))
        .await
        .map_err(|e| err_str(&format!("resolve {}", args.host), e))?
        .next()
        .ok_or_else(|| format!("{} did not resolve", args.host))?;

    let run_id = format!(
        "{:x}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let topics: Vec<String> = (0..n_pub)
        .map(|i| match args.topic_mode {
            TopicMode::Shared => format!("{}/{run_id}/shared", args.topic_prefix),
            TopicMode::PerPublisher => format!("{}/{run_id}/p/{i}", args.topic_prefix),
        })
        .collect();
    // Which publishers' topics each subscriber subscribes to.
    let sub_topics: Vec<Vec<usize>> = (0..n_sub)
        .map(|j| match args.topic_mode {
            TopicMode::Shared => (0..n_pub).collect(),
            TopicMode::PerPublisher if n_sub >= n_pub => vec![j % n_pub],
            TopicMode::PerPublisher => (0..n_pub).filter(|i| i % n_sub == j).collect(),
        })
        .collect();
    let mut matching = vec![0u64; n_pub];
    for list in &sub_topics {
        for &i in list {
            matching[i] += 1;
        }
    }
    let filters: Vec<Vec<String>> = sub_topics
        .iter()
        .map(|list| match args.topic_mode {
            TopicMode::Shared => vec![topics[0].clone()],
            TopicMode::PerPublisher => list.iter().map(|&i| topics[i].clone()).collect(),
        })
        .collect();

    // Nothing is sent while a subscriber waits; make sure the broker does not
    // time it out during the run.
    let run_bound = duration.unwrap_or(hard_timeout) + drain * 2 + Duration::from_secs(60);
    let keep_alive = run_bound.as_secs().clamp(60, u64::from(u16::MAX)) as u16;

    let progress = |msg: String| {
        if !args.quiet {
            eprintln!("[statehub-bench] {msg}");
        }
    };

    // Phase 1: subscribers connected and subscribed.
    progress(format!(
        "connecting {n_sub} subscribers to {addr} ({version:?}, QoS {qos})"
    ));
    let deadline = Instant::now() + connect_timeout;
    let client_prefix = format!("shb-{run_id}");
    let filters = Arc::new(filters);
    let sub_conns = {
        let prefix = client_prefix.clone();
        let filters = filters.clone();
        all(n_sub, deadline, "subscriber", move |j| {
            let id = format!("{prefix}-s{j}");
            let filters = filters.clone();
            async move {
                let mut c = connect(addr, version, &id, keep_alive).await?;
                let granted = subscribe(&mut c, version, &filters[j], qos).await?;
                Ok((c, granted))
            }
        })
        .await?
    };
    let mut report = Report::new("mqtt");
    if let Some(g) = sub_conns.iter().map(|(_, g)| *g).min() {
        if g < qos {
            report.warn(format!(
                "broker granted subscription QoS {g} < requested {qos}"
            ));
        }
    }

    // Phase 2: publishers connected.
    progress(format!("connecting {n_pub} publishers"));
    let deadline = Instant::now() + connect_timeout;
    let pub_conns = {
        let prefix = client_prefix.clone();
        all(n_pub, deadline, "publisher", move |i| {
            let id = format!("{prefix}-p{i}");
            async move { connect(addr, version, &id, keep_alive).await }
        })
        .await?
    };
    let mut window = args.inflight;
    if qos == 1 {
        if let Some(rm) = pub_conns.iter().filter_map(|c| c.ack.receive_maximum).min() {
            if rm < window {
                report.warn(format!(
                    "--inflight {window} capped to the broker's Receive Maximum {rm}"
                ));
                window = rm.max(1);
            }
        }
    }
    if let Some(mq) = pub_conns.iter().filter_map(|c| c.ack.maximum_qos).min() {
        if mq < qos {
            return Err(format!("broker supports at most QoS {mq}"));
        }
    }
    if let Some(ka) = pub_conns
        .iter()
        .chain(sub_conns.iter().map(|(c, _)| c))
        .filter_map(|c| c.ack.server_keep_alive)
        .min()
    {
        if ka != 0 && Duration::from_secs(u64::from(ka)) < run_bound {
            report.warn(format!(
                "broker imposed keep-alive {ka}s; idle subscribers may be disconnected"
            ));
        }
    }

    // Phase 3: go.
    let received_total = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sub_handles: Vec<JoinHandle<SubStats>> = sub_conns
        .into_iter()
        .map(|(c, _)| {
            tokio::spawn(run_subscriber(
                c,
                version,
                n_pub,
                received_total.clone(),
                stop_rx.clone(),
            ))
        })
        .collect();

    progress(match (count, duration) {
        (Some(k), _) => format!("publishing {k} messages per publisher"),
        (None, Some(d)) => format!("publishing for {:.1}s", d.as_secs_f64()),
        _ => String::new(),
    });
    let start = Instant::now();
    let t0_ns = now_ns();
    let until = start + duration.unwrap_or(hard_timeout).min(hard_timeout);
    let pub_handles: Vec<JoinHandle<PubStats>> = pub_conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let plan = PubPlan {
                index: i as u32,
                version,
                qos,
                topic: topics[i].clone().into_bytes(),
                payload_size: args.payload_size as usize,
                count,
                until,
                start,
                rate: args.rate,
                window,
                drain,
            };
            tokio::spawn(run_publisher(c, plan))
        })
        .collect();

    // Publishers stop by `until`, then drain acks for at most a few drain periods.
    let pub_deadline = until + drain * 4 + Duration::from_secs(5);
    let mut pubs = Vec::with_capacity(n_pub);
    for (i, h) in pub_handles.into_iter().enumerate() {
        let abort = h.abort_handle();
        match timeout_at(pub_deadline.into(), h).await {
            Ok(Ok(st)) => {
                if let Some(e) = &st.error {
                    report.error(format!("publisher {i}: {e}"));
                }
                pubs.push(st);
            }
            Ok(Err(e)) => report.error(format!("publisher {i}: task failed: {e}")),
            Err(_) => {
                abort.abort();
                report.error(format!("publisher {i}: did not finish in time"));
            }
        }
    }
    if count.is_some() && Instant::now() >= until {
        report.warn("publishing hit --timeout before sending all messages".into());
    }

    // Phase 4: wait for deliveries.
    let published: u64 = pubs.iter().map(|p| p.published).sum();
    let expected: u64 = pubs
        .iter()
        .enumerate()
        .map(|(i, p)| p.published * matching[i])
        .sum();
    progress(format!(
        "published {published}; waiting for {expected} deliveries"
    ));
    let mut last = received_total.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    let delivery_deadline = Instant::now() + hard_timeout.max(drain);
    loop {
        let r = received_total.load(Ordering::Relaxed);
        if r >= expected {
            break;
        }
        let now = Instant::now();
        if r != last {
            last = r;
            last_change = now;
        } else if now.duration_since(last_change) >= drain
            || now >= delivery_deadline
            || sub_handles.iter().all(|h| h.is_finished())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop_tx.send(true);
    let mut subs = Vec::with_capacity(n_sub);
    let sub_deadline = Instant::now() + Duration::from_secs(5);
    for (j, h) in sub_handles.into_iter().enumerate() {
        let abort = h.abort_handle();
        match timeout_at(sub_deadline.into(), h).await {
            Ok(Ok(st)) => {
                if let Some(e) = &st.error {
                    report.error(format!("subscriber {j}: {e}"));
                }
                subs.push(st);
            }
            Ok(Err(e)) => report.error(format!("subscriber {j}: task failed: {e}")),
            Err(_) => {
                abort.abort();
                report.error(format!("subscriber {j}: did not stop"));
            }
        }
    }

    // Phase 5: report.
    let received: u64 = subs.iter().map(|s| s.received).sum();
    let duplicates: u64 = subs.iter().map(|s| s.duplicates).sum();
    let foreign: u64 = subs.iter().map(|s| s.foreign).sum();
    let gaps: u64 = subs.iter().map(|s| s.gaps).sum();
    let unique = received.saturating_sub(duplicates).saturating_sub(foreign);
    let lost = expected.saturating_sub(unique);
    let acked: u64 = pubs.iter().map(|p| p.acked).sum();
    let ack_failures: u64 = pubs.iter().map(|p| p.ack_failures).sum();
    let secs_since_t0 = |ns: u64| ns.saturating_sub(t0_ns) as f64 / 1e9;
    let publish_secs = secs_since_t0(
        pubs.iter()
            .map(|p| p.done_publishing_ns)
            .max()
            .unwrap_or(t0_ns),
    );
    let delivery_secs = secs_since_t0(subs.iter().map(|s| s.last_recv_ns).max().unwrap_or(t0_ns));
    let ack_secs = secs_since_t0(pubs.iter().map(|p| p.last_ack_ns).max().unwrap_or(t0_ns));
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };

    let mut e2e = new_histogram();
    for s in &subs {
        let _ = e2e.add(&s.hist);
    }
    let mut ack_hist = new_histogram();
    for p in &pubs {
        let _ = ack_hist.add(&p.ack_hist);
    }

    report.param("broker", "broker", Value::Str(addr.to_string()));
    report.param(
        "protocol",
        "protocol",
        Value::Str(if args.v311 { "3.1.1" } else { "5" }.into()),
    );
    report.param("qos", "QoS", Value::Int(u64::from(qos)));
    report.param("publishers", "publishers", Value::Int(n_pub as u64));
    report.param("subscribers", "subscribers", Value::Int(n_sub as u64));
    report.param(
        "topic_mode",
        "topic mode",
        Value::Str(
            match args.topic_mode {
                TopicMode::Shared => "shared",
                TopicMode::PerPublisher => "per-publisher",
            }
            .into(),
        ),
    );
    report.param(
        "payload_size",
        "payload bytes",
        Value::Int(u64::from(args.payload_size)),
    );
    match (count, duration) {
        (Some(k), _) => report.param(
            "messages_per_publisher",
            "messages per publisher",
            Value::Int(k),
        ),
        (None, Some(d)) => {
            report.param("duration_s", "duration (s)", Value::Float(d.as_secs_f64()))
        }
        _ => {}
    }
    if qos == 1 {
        report.param(
            "inflight",
            "in-flight window",
            Value::Int(u64::from(window)),
        );
    }
    if args.rate > 0.0 {
        report.param(
            "rate_per_publisher",
            "rate per publisher (msg/s)",
            Value::Float(args.rate),
        );
    }

    report.result("published", "messages published", Value::Int(published));
    report.result(
        "publish_seconds",
        "publish time (s)",
        Value::Float(publish_secs),
    );
    report.result(
        "publish_per_sec",
        "published msg/s",
        Value::Float(rate(published, publish_secs)),
    );
    if qos == 1 {
        report.result("acked", "PUBACKs received", Value::Int(acked));
        report.result(
            "ack_failures",
            "PUBACK failure codes",
            Value::Int(ack_failures),
        );
        report.result(
            "acks_per_sec",
            "PUBACKs/s",
            Value::Float(rate(acked, ack_secs)),
        );
    }
    report.result("expected", "messages expected", Value::Int(expected));
    report.result("received", "messages received", Value::Int(received));
    report.result("duplicates", "duplicates", Value::Int(duplicates));
    report.result("lost", "lost", Value::Int(lost));
    report.result(
        "loss_pct",
        "lost %",
        Value::Float(if expected > 0 {
            lost as f64 * 100.0 / expected as f64
        } else {
            0.0
        }),
    );
    report.result(
        "delivery_seconds",
        "delivery time (s)",
        Value::Float(delivery_secs),
    );
    report.result(
        "delivered_per_sec",
        "delivered msg/s",
        Value::Float(rate(received, delivery_secs)),
    );
    report.latency(
        "latency",
        "latency publish->receive",
        Latency::from_histogram(&e2e),
    );
    if qos == 1 {
        report.latency(
            "ack_latency",
            "latency publish->PUBACK",
            Latency::from_histogram(&ack_hist),
        );
    }
    if foreign > 0 {
        report.warn(format!(
            "{foreign} messages without a valid benchmark header"
        ));
    }
    if gaps > lost {
        report.warn(format!("{gaps} sequence gaps (out-of-order delivery)"));
    }
    let missing_acks = qos == 1 && acked < published;
    if missing_acks {
        report.warn(format!("{} PUBACKs missing", published - acked));
    }
    if args.fail_on_loss && (lost > 0 || missing_acks || ack_failures > 0) {
        report.fail();
    }
    Ok(report)
}
