//! Helpers shared by every scenario: the process' time base, argument parsing
//! helpers, MQTT connection setup (CONNECT/CONNACK, SUBSCRIBE/SUBACK) and task
//! orchestration (start N tasks under a deadline, collect their results).
//!
//! They live here, not in one scenario, so that each scenario uses the same code
//! and reports setup failures with the same wording.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::timeout_at;

use crate::proto::{self, ConnAck, Version};
use crate::report::Report;

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

/// Resolves `--host`/`--port` to the first address found.
pub(crate) async fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| err_str(&format!("resolve {host}"), e))?
        .next()
        .ok_or_else(|| format!("{host} did not resolve"))
}

/// CPU time (user + system, all threads) process `pid` has used, in seconds, from
/// /proc/`pid`/stat; `None` where that cannot be read.
pub(crate) fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at field 3;
    // utime and stime are fields 14 and 15, in clock ticks (USER_HZ, 100 on Linux).
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

/// Prints a progress line on stderr unless `quiet`.
pub(crate) fn progress(quiet: bool, msg: String) {
    if !quiet {
        eprintln!("[statehub-bench] {msg}");
    }
}

/// A connection to the broker, plain or TLS.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}
pub(crate) type Stream = Box<dyn Io>;
pub(crate) type ReadHalf = tokio::io::ReadHalf<Stream>;
pub(crate) type WriteHalf = tokio::io::WriteHalf<Stream>;

/// The TLS client settings every connection of this run uses, when set.
static TLS: OnceLock<(
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
)> = OnceLock::new();

/// Connects over TLS from now on, verifying the broker against the PEM CA file and
/// the name `server_name`.
pub(crate) fn use_tls(ca_file: &Path, server_name: &str) -> Result<(), String> {
    let pem = std::fs::read(ca_file).map_err(|e| format!("{}: {e}", ca_file.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| format!("{}: {e}", ca_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("{}: {e}", ca_file.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned())
        .map_err(|e| format!("--tls-name {server_name}: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    TLS.set((connector, name))
        .map_err(|_| "TLS is set once".to_owned())
}

/// Source addresses that connections take in turn, when set: one source address
/// has about 28,000 ephemeral ports towards one broker port, too few for 50,000
/// connections on one machine.
static SOURCES: OnceLock<Vec<IpAddr>> = OnceLock::new();
static NEXT_SOURCE: AtomicUsize = AtomicUsize::new(0);

/// Spreads connections from now on over the loopback source addresses 127.0.0.1
/// to 127.0.0.`n` (every 127/8 address is local on Linux).
pub(crate) fn use_loopback_sources(n: u8) -> Result<(), String> {
    let sources = (1..=n.max(1))
        .map(|i| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i)))
        .collect();
    SOURCES
        .set(sources)
        .map_err(|_| "source addresses are set once".to_owned())
}

/// A TCP connection to `addr`, from the next source address if any are set.
pub(crate) async fn tcp_connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let Some(sources) = SOURCES.get().filter(|s| !s.is_empty()) else {
        return TcpStream::connect(addr).await;
    };
    let ip = sources[NEXT_SOURCE.fetch_add(1, Ordering::Relaxed) % sources.len()];
    let socket = match ip {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(ip, 0))?;
    socket.connect(addr).await
}

/// A connected MQTT client: its stream, what was read past the CONNACK, and the
/// CONNACK itself.
pub(crate) struct Conn {
    pub stream: Stream,
    pub buf: BytesMut,
    pub ack: ConnAck,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("buf", &self.buf.len())
            .field("ack", &self.ack)
            .finish_non_exhaustive()
    }
}

/// Reads one whole packet during setup; returns its first byte and body.
pub(crate) async fn read_packet(
    stream: &mut Stream,
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

/// Calls `f(first byte, body)` for every complete packet at the start of `buf`,
/// consuming each packet once `f` accepted it; stops at the first error (a
/// malformed frame, `f`'s, or a DISCONNECT from the broker, described).
pub(crate) fn for_each_packet(
    buf: &mut BytesMut,
    v: Version,
    mut f: impl FnMut(u8, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    while let Some((first, hl, rl)) = proto::frame(buf).map_err(|e| e.to_string())? {
        let body = &buf[hl..hl + rl];
        if first & 0xF0 == proto::DISCONNECT {
            return Err(proto::describe_disconnect(v, body));
        }
        f(first, body)?;
        buf.advance(hl + rl);
    }
    Ok(())
}

/// Opens a TCP connection, sends the encoded CONNECT `connect` and waits for a
/// successful CONNACK.
pub(crate) async fn connect(addr: SocketAddr, v: Version, connect: &[u8]) -> Result<Conn, String> {
    let tcp = tcp_connect(addr).await.map_err(|e| err_str("connect", e))?;
    tcp.set_nodelay(true)
        .map_err(|e| err_str("set_nodelay", e))?;
    let mut stream: Stream = match TLS.get() {
        Some((connector, name)) => Box::new(
            connector
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| err_str("TLS handshake", e))?,
        ),
        None => Box::new(tcp),
    };
    stream
        .write_all(connect)
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

/// Sends SUBSCRIBE (packet id 1) for `filters` and returns the SUBACK's reason
/// codes; packets other than SUBACK or DISCONNECT before it are ignored.
pub(crate) async fn subscribe(
    conn: &mut Conn,
    v: Version,
    filters: &[String],
    qos: u8,
) -> Result<Vec<u8>, String> {
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
                return Ok(codes);
            }
            proto::DISCONNECT => return Err(proto::describe_disconnect(v, &body)),
            _ => {} // nothing else is expected before SUBACK; ignore
        }
    }
}

/// Fails if any SUBACK reason code refuses the subscription.
pub(crate) fn check_granted(codes: &[u8]) -> Result<(), String> {
    match codes.iter().find(|c| **c >= 0x80) {
        Some(bad) => Err(format!("subscription refused: reason 0x{bad:02x}")),
        None => Ok(()),
    }
}

/// Connections being set up at once at most in [`all`]: a broker's listen backlog
/// (Mosquitto's is 100) overflows when thousands of SYNs arrive together, and the
/// dropped ones are retried only after a second or more.
const SETUP_CONCURRENCY: usize = 256;

/// Runs `f(i)` for i in 0..n, [`SETUP_CONCURRENCY`] at a time, with a deadline;
/// the first error wins.
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
    let permits = Arc::new(Semaphore::new(SETUP_CONCURRENCY));
    let handles: Vec<JoinHandle<Result<T, String>>> = (0..n)
        .map(|i| {
            let permits = Arc::clone(&permits);
            let setup = f(i);
            tokio::spawn(async move {
                let _permit = permits
                    .acquire_owned()
                    .await
                    .map_err(|e| err_str("setup", e))?;
                setup.await
            })
        })
        .collect();
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

/// Awaits every task in order, all by `deadline`, handing each result to
/// `done(i, result, report)`. A task that panicked is reported as
/// `"{what} {i}: task failed: …"`; one still running at the deadline is aborted
/// and reported as `"{what} {i}: {late}"`.
pub(crate) async fn join_each<T>(
    handles: Vec<JoinHandle<T>>,
    deadline: Instant,
    what: &str,
    late: &str,
    report: &mut Report,
    mut done: impl FnMut(usize, T, &mut Report),
) {
    for (i, h) in handles.into_iter().enumerate() {
        let abort = h.abort_handle();
        match timeout_at(deadline.into(), h).await {
            Ok(Ok(r)) => done(i, r, report),
            Ok(Err(e)) => report.error(format!("{what} {i}: task failed: {e}")),
            Err(_) => {
                abort.abort();
                report.error(format!("{what} {i}: {late}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_cpu_time_of_a_running_process() {
        // Burn a little CPU so the figure is readable; only its presence is checked.
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let secs = proc_cpu_secs(std::process::id()).expect("/proc is readable");
        assert!(secs >= 0.0);
        assert_eq!(proc_cpu_secs(u32::MAX), None);
    }
}
