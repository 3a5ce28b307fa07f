//! `idle`: opens many connections, holds them idle, and closes them — to measure
//! what an idle connection costs a server (the caller reads the server's RSS while
//! the connections are held; `scripts/bench-idle.sh` does).
//!
//! MQTT connections send CONNECT (clean session, a keep-alive longer than the
//! hold) and, with `--subscribe`, one SUBSCRIBE to a topic of their own, as an
//! idle device does. WebSocket connections (`--target statehub`: Web PubSub's
//! reliable JSON subprotocol, in one group; `--target socketio`: Socket.IO, in one
//! room) complete their handshake and then only answer pings.
//!
//! When every connection is up, the number of connections is written to
//! `--ready-file`; the connections are then held for `--hold` seconds.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use crate::common::{self, all, check_granted, progress, resolve, secs, Conn};
use crate::fanout::client::{self as ws_client, Shared};
use crate::fanout::{client_url, Target as WsTarget};
use crate::proto::{self, Version};
use crate::report::{Report, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IdleTarget {
    /// Any MQTT broker (`--host`, `--port`).
    Mqtt,
    /// statehub's Web PubSub endpoint, reliable JSON subprotocol (`--url`).
    Webpubsub,
    /// A Socket.IO 4 server (`--url`).
    Socketio,
}

#[derive(Debug, Args)]
pub struct IdleArgs {
    /// What kind of connection to open.
    #[arg(long, value_enum, default_value_t = IdleTarget::Mqtt)]
    pub target: IdleTarget,
    /// MQTT broker host.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// MQTT broker port.
    #[arg(long, default_value_t = 1883)]
    pub port: u16,
    /// WebSocket targets: base URL of the server, e.g. http://127.0.0.1:8080.
    #[arg(long, default_value = "")]
    pub url: String,
    /// Web PubSub: the access key tokens are signed with.
    #[arg(long, default_value = "")]
    pub access_key: String,
    /// Web PubSub: the hub.
    #[arg(long, default_value = "bench")]
    pub hub: String,
    /// Connections to open.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub connections: u32,
    /// MQTT: each connection also subscribes (QoS 1) to a topic of its own.
    #[arg(long)]
    pub subscribe: bool,
    /// MQTT: speak MQTT 3.1.1 instead of MQTT 5.
    #[arg(long)]
    pub v311: bool,
    /// Spread connections over this many loopback source addresses (127.0.0.1 to
    /// 127.0.0.N); one address has about 28,000 ephemeral ports per server port.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..))]
    pub sources: u8,
    /// Seconds allowed for opening every connection.
    #[arg(long, default_value_t = 300.0)]
    pub connect_timeout: f64,
    /// Seconds the connections are held once all are open.
    #[arg(long, default_value_t = 10.0)]
    pub hold: f64,
    /// File written (with the connection count) once every connection is open.
    #[arg(long)]
    pub ready_file: Option<std::path::PathBuf>,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What is held open during the hold.
enum Held {
    Mqtt(Vec<Conn>),
    Ws(
        Vec<tokio::task::JoinHandle<ws_client::SubResult>>,
        Arc<Shared>,
    ),
}

pub async fn run(args: IdleArgs) -> Result<Report, String> {
    let n = args.connections as usize;
    let hold = secs(args.hold)?;
    let deadline = Instant::now() + secs(args.connect_timeout)?;
    if args.sources > 1 {
        common::use_loopback_sources(args.sources)?;
    }
    progress(
        args.quiet,
        format!("opening {n} {:?} connections", args.target),
    );
    let started = Instant::now();
    let held = match args.target {
        IdleTarget::Mqtt => Held::Mqtt(open_mqtt(&args, hold, deadline).await?),
        IdleTarget::Webpubsub | IdleTarget::Socketio => {
            let (handles, shared) = open_ws(&args, deadline).await?;
            Held::Ws(handles, shared)
        }
    };
    let open_secs = started.elapsed().as_secs_f64();
    if let Some(path) = &args.ready_file {
        std::fs::write(path, format!("{n}\n")).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    progress(
        args.quiet,
        format!("{n} connections open in {open_secs:.1} s; holding {hold:?}"),
    );
    tokio::time::sleep(hold).await;

    let mut report = Report::new("idle");
    report.param(
        "target",
        "target",
        Value::Str(format!("{:?}", args.target).to_lowercase()),
    );
    report.param("connections", "connections", Value::Int(n as u64));
    report.param(
        "subscriptions",
        "subscriptions per connection",
        Value::Int(u64::from(args.subscribe)),
    );
    report.result(
        "open_s",
        "seconds to open them all",
        Value::Float(open_secs),
    );
    let closed = match held {
        Held::Mqtt(conns) => drop_mqtt(conns),
        Held::Ws(handles, shared) => {
            shared.stop.store(true, Ordering::Relaxed);
            let mut closed = 0u64;
            for h in handles {
                if let Ok(r) = h.await {
                    closed += u64::from(r.error.is_some());
                }
            }
            closed
        }
    };
    report.result(
        "closed_by_server",
        "connections the server closed during the hold",
        Value::Int(closed),
    );
    if closed > 0 {
        report.fail();
    }
    Ok(report)
}

async fn open_mqtt(
    args: &IdleArgs,
    hold: Duration,
    deadline: Instant,
) -> Result<Vec<Conn>, String> {
    let v = if args.v311 {
        Version::V311
    } else {
        Version::V5
    };
    let addr = resolve(&args.host, args.port).await?;
    // Long enough that no PINGREQ is due while the connections are held.
    let keep_alive = (hold.as_secs() + 300).min(u64::from(u16::MAX)) as u16;
    let subscribe = args.subscribe;
    let run_id = std::process::id();
    all(
        args.connections as usize,
        deadline,
        "connection",
        move |i| async move {
            let mut out = Vec::with_capacity(64);
            proto::encode_connect(&mut out, v, &format!("idle-{run_id}-{i}"), keep_alive);
            let mut conn = common::connect(addr, v, &out).await?;
            if subscribe {
                let filters = [format!("idle/{run_id}/{i}/cmd")];
                check_granted(&common::subscribe(&mut conn, v, &filters, 1).await?)?;
            }
            Ok(conn)
        },
    )
    .await
}

/// Counts the connections the broker closed while they were held (a read sees
/// the end of the stream or an error), then drops them all.
fn drop_mqtt(conns: Vec<Conn>) -> u64 {
    let mut closed = 0u64;
    let mut probe = [0u8; 64];
    for mut c in conns {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut buf = tokio::io::ReadBuf::new(&mut probe);
        let polled =
            tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut c.stream), &mut cx, &mut buf);
        if let std::task::Poll::Ready(r) = polled {
            closed += u64::from(r.is_err() || buf.filled().is_empty());
        }
    }
    closed
}

async fn open_ws(
    args: &IdleArgs,
    deadline: Instant,
) -> Result<
    (
        Vec<tokio::task::JoinHandle<ws_client::SubResult>>,
        Arc<Shared>,
    ),
    String,
> {
    let target = match args.target {
        IdleTarget::Webpubsub => WsTarget::Statehub,
        _ => WsTarget::Socketio,
    };
    let url = client_url(target, &args.url, &args.access_key, &args.hub, "sub")?;
    let url = Arc::new(url);
    let wss = all(
        args.connections as usize,
        deadline,
        "connection",
        move |_| {
            let url = Arc::clone(&url);
            async move { ws_client::connect(target, &url, "sub").await }
        },
    )
    .await?;
    let shared = Arc::new(Shared::default());
    let handles = wss
        .into_iter()
        .map(|ws| {
            tokio::spawn(ws_client::subscribe(
                target,
                ws,
                Arc::clone(&shared),
                Duration::from_secs(1),
            ))
        })
        .collect();
    Ok((handles, shared))
}
