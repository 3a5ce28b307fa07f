//! `fanout`: reliable fan-out throughput, the Web PubSub way and the Socket.IO way.
//!
//! One publisher sends JSON messages to one group (room) that `--subscribers`
//! connections are in, keeping `--window` publishes unacknowledged at most; each
//! subscriber counts what it receives, checks the publish numbers arrive in order
//! without gaps, and measures end-to-end latency from the send time in the payload.
//! Against statehub every connection uses `json.reliable.webpubsub.azure.v1` and the
//! subscribers send `sequenceAck` once per `--ack-interval-ms`, like the JS client;
//! against Socket.IO (`scripts/socketio-bench/server.mjs`, connection state recovery
//! on) the publisher emits with an ack callback and the server relays to the room.
//! Both targets face the same client code: only the framing differs (`wire`).

pub(crate) mod client;
mod token;
mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use tokio::task::JoinHandle;

use crate::common::progress;
use crate::report::{new_histogram, Latency, Report, Value};
use client::{Shared, SubResult};
pub use wire::Target;

#[derive(Debug, Args)]
pub struct FanoutArgs {
    /// Which server: statehub (Web PubSub reliable JSON) or socketio.
    #[arg(long, value_enum)]
    pub target: Target,
    /// Base URL of the server, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub url: String,
    /// statehub: the access key tokens are signed with.
    #[arg(long, default_value = "")]
    pub access_key: String,
    /// statehub: the hub.
    #[arg(long, default_value = "bench")]
    pub hub: String,
    /// Subscriber connections.
    #[arg(long, default_value_t = 1000)]
    pub subscribers: u32,
    /// Publishes in flight (sent, not yet acknowledged) at most.
    #[arg(long, default_value_t = 100)]
    pub window: u64,
    /// Approximate payload size in bytes.
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Seconds of publishing before measuring.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    /// Seconds measured.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// How often reliable subscribers acknowledge (the JS client: 1000 ms).
    #[arg(long, default_value_t = 1000)]
    pub ack_interval_ms: u64,
    /// Print the human-readable report on stderr and one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress messages on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

fn ws_url(args: &FanoutArgs, role: &str) -> Result<String, String> {
    client_url(args.target, &args.url, &args.access_key, &args.hub, role)
}

/// The WebSocket URL a `role` (`sub` or `pub`) connection of `target` opens, for
/// the server at `url`; statehub's carries a client token signed with `access_key`.
pub(crate) fn client_url(
    target: Target,
    url: &str,
    access_key: &str,
    hub: &str,
    role: &str,
) -> Result<String, String> {
    let base = url.trim_end_matches('/');
    let ws_base = base.replacen("http", "ws", 1);
    Ok(match target {
        Target::Statehub => {
            let aud = format!("{base}/client/hubs/{hub}");
            let jwt = token::client_token(access_key, &aud, role)?;
            format!("{ws_base}/client/hubs/{hub}?access_token={jwt}")
        }
        Target::Socketio => format!("{ws_base}/socket.io/?EIO=4&transport=websocket"),
    })
}

pub async fn run(args: FanoutArgs) -> Result<Report, String> {
    let shared = Arc::new(Shared::default());
    let subs = start_subscribers(&args, &shared).await?;
    let pub_ws = client::connect(args.target, &ws_url(&args, "pub")?, "pub").await?;
    let stop_publishing = Arc::new(AtomicBool::new(false));
    let padding = "x".repeat(args.payload_bytes.saturating_sub(40));
    let publisher = tokio::spawn(client::publish(
        args.target,
        pub_ws,
        args.window.max(1),
        padding,
        Arc::clone(&stop_publishing),
    ));

    progress(
        args.quiet,
        format!(
            "publishing; warm-up {} s, measuring {} s",
            args.warmup, args.duration
        ),
    );
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let start_count = shared.delivered.load(Ordering::Relaxed);
    shared.measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
    let measured = shared.delivered.load(Ordering::Relaxed) - start_count;
    let elapsed = started.elapsed().as_secs_f64();
    shared.measuring.store(false, Ordering::Relaxed);
    stop_publishing.store(true, Ordering::Relaxed);
    let published = publisher
        .await
        .map_err(|e| format!("publisher task: {e}"))?;
    // Let the last messages reach every subscriber before counting losses.
    let expected_total = published.acked * u64::from(args.subscribers);
    let drain_until = Instant::now() + Duration::from_secs(10);
    while shared.delivered.load(Ordering::Relaxed) < expected_total && Instant::now() < drain_until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shared.stop.store(true, Ordering::Relaxed);

    let mut report = Report::new("fanout");
    add_params(&mut report, &args, elapsed);
    let subs = Received::collect(&mut report, subs).await?;
    if let Some(e) = published.error {
        report.error(format!("publisher: {e}"));
    }
    let lost = expected_total.saturating_sub(subs.received);
    report.result(
        "delivered_per_s",
        "delivered msg/s",
        Value::Float(measured as f64 / elapsed),
    );
    report.result(
        "published",
        "publishes acknowledged",
        Value::Int(published.acked),
    );
    subs.add_results(&mut report, lost);
    if lost > 0 || subs.out_of_order > 0 {
        report.fail();
    }
    Ok(report)
}

/// Connects the subscribers one after the other, each then receiving on a task.
async fn start_subscribers(
    args: &FanoutArgs,
    shared: &Arc<Shared>,
) -> Result<Vec<JoinHandle<SubResult>>, String> {
    let sub_url = ws_url(args, "sub")?;
    progress(
        args.quiet,
        format!(
            "connecting {} subscribers to {}",
            args.subscribers, args.url
        ),
    );
    let mut subs = Vec::with_capacity(args.subscribers as usize);
    for _ in 0..args.subscribers {
        let ws = client::connect(args.target, &sub_url, "sub").await?;
        let ack_every = Duration::from_millis(args.ack_interval_ms.max(1));
        subs.push(tokio::spawn(client::subscribe(
            args.target,
            ws,
            Arc::clone(shared),
            ack_every,
        )));
    }
    Ok(subs)
}

/// The run's parameters, with the time measured.
fn add_params(report: &mut Report, args: &FanoutArgs, elapsed: f64) {
    report.param(
        "target",
        "target",
        Value::Str(format!("{:?}", args.target).to_lowercase()),
    );
    report.param(
        "subscribers",
        "subscribers",
        Value::Int(u64::from(args.subscribers)),
    );
    report.param("window", "publish window", Value::Int(args.window));
    report.param(
        "payload_bytes",
        "payload bytes",
        Value::Int(args.payload_bytes as u64),
    );
    report.param("duration_s", "measured seconds", Value::Float(elapsed));
}

/// What the subscribers received, all together.
struct Received {
    received: u64,
    out_of_order: u64,
    /// Subscribers that failed.
    errors: u64,
    latency: hdrhistogram::Histogram<u64>,
}

impl Received {
    /// Waits for every subscriber's result; the first three failures are reported.
    async fn collect(
        report: &mut Report,
        subs: Vec<JoinHandle<SubResult>>,
    ) -> Result<Self, String> {
        let mut all = Received {
            received: 0,
            out_of_order: 0,
            errors: 0,
            latency: new_histogram(),
        };
        for sub in subs {
            let r = sub.await.map_err(|e| format!("subscriber task: {e}"))?;
            all.received += r.received;
            all.out_of_order += r.out_of_order;
            let _ = all.latency.add(&r.latency);
            if let Some(e) = r.error {
                all.errors += 1;
                if all.errors <= 3 {
                    report.error(format!("subscriber: {e}"));
                }
            }
        }
        Ok(all)
    }

    fn add_results(&self, report: &mut Report, lost: u64) {
        report.result(
            "received",
            "messages received (all subscribers)",
            Value::Int(self.received),
        );
        report.result("lost", "acknowledged but not received", Value::Int(lost));
        report.result(
            "out_of_order",
            "out of order or duplicated",
            Value::Int(self.out_of_order),
        );
        report.result(
            "subscriber_errors",
            "subscribers that failed",
            Value::Int(self.errors),
        );
        report.latency(
            "latency",
            "end-to-end latency",
            Latency::from_histogram(&self.latency),
        );
    }
}
