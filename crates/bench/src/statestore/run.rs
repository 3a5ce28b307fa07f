//! Phases 1 to 3 of the `statestore` scenario (see the module documentation of
//! [`super`]): check the arguments, connect and subscribe every client, cap the
//! pipeline to the broker's Receive Maximum, run the populate and measure
//! phases in step across clients, and collect their statistics. Turning those
//! into the report (phase 4) is in [`super::summary`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use super::args::StateStoreArgs;
use super::client::Client;
use super::phase::Phase;
use super::session::{connect, run_client, ClientResult};
use super::stats::OpStats;
use super::summary::{self, Outcome};
use super::{DEFAULT_REQUESTS, POPULATE_PIPELINE};
use crate::common::{self, all, base, join_each, now_ns, resolve, secs, Conn};
use crate::report::Report;

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

/// The run's bounds in time, from the arguments.
struct Timing {
    /// Requests per client (`None`: measure for `duration`).
    count: Option<u64>,
    duration: Option<Duration>,
    hard_timeout: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl Timing {
    fn new(args: &StateStoreArgs) -> Result<Self, String> {
        if !(0.0..=1.0).contains(&args.ratio_get) {
            return Err("--ratio-get must be between 0 and 1".into());
        }
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
        Ok(Timing {
            count,
            duration,
            hard_timeout,
            connect_timeout,
            response_timeout: Duration::from_secs(u64::from(args.message_expiry) + 5),
        })
    }
}

pub async fn run(args: StateStoreArgs) -> Result<Report, String> {
    let _ = base();
    let timing = Timing::new(&args)?;
    let (count, duration) = (timing.count, timing.duration);
    let n = args.clients as usize;
    let addr = resolve(&args.host, args.port).await?;
    if let Some(ca) = &args.tls_ca {
        crate::common::use_tls(ca, &args.tls_name)?;
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let run_id = format!("{:x}-{:x}", std::process::id(), nanos);
    let progress = |msg: String| common::progress(args.quiet, msg);

    progress(format!("connecting {n} state store clients to {addr}"));
    let conns = connect_clients(&args, &timing, addr, run_id).await?;
    let mut report = Report::new("statestore");
    let (pipeline, receive_maximum) = cap_pipeline(&mut report, args.pipeline, &conns);
    let populate = args.ratio_get > 0.0 && !args.no_populate;
    let populated = Arc::new(Barrier::new(n + 1));
    let go = Arc::new(Barrier::new(n + 1));
    let seed_base = u64::from(nanos) ^ (u64::from(std::process::id()) << 32);
    if populate {
        progress(format!("populating {} keys", args.keys));
    }
    let measure = Phase {
        populate: None,
        count,
        duration,
        hard_timeout: timing.hard_timeout,
        pipeline: usize::from(pipeline),
        ratio_get: args.ratio_get,
        keys: args.keys,
        response_timeout: timing.response_timeout,
    };
    // Populating keeps at least POPULATE_PIPELINE in flight, within the broker's
    // Receive Maximum.
    let populate_pipeline = populate.then(|| {
        usize::from(pipeline)
            .max(POPULATE_PIPELINE)
            .min(usize::from(receive_maximum.unwrap_or(u16::MAX).max(1)))
    });
    let barriers = (populated.clone(), go.clone());
    let handles = spawn_clients(conns, populate_pipeline, &measure, barriers, seed_base);
    populated.wait().await;
    progress(match (count, duration) {
        (Some(k), _) => format!("measuring: {k} requests per client, pipeline {pipeline}"),
        (None, Some(d)) => format!("measuring for {:.1}s, pipeline {pipeline}", d.as_secs_f64()),
        _ => String::new(),
    });
    let cpu0 = process_cpu_secs();
    let t0 = now_ns();
    go.wait().await;

    let finish_by =
        Instant::now() + timing.hard_timeout + timing.response_timeout * 2 + Duration::from_secs(5);
    let (pop_total, total, end_ns) = collect(&mut report, handles, finish_by, t0).await;
    let cpu1 = process_cpu_secs();
    let elapsed = end_ns.saturating_sub(t0) as f64 / 1e9;

    Ok(summary::summarize(
        report,
        &args,
        Outcome {
            addr,
            pipeline,
            count,
            duration,
            populate,
            pop_total,
            total,
            elapsed,
            cpu: cpu0.zip(cpu1),
        },
    ))
}

/// Starts every client's task: with `populate` (its pipeline), SETting its share of
/// the keys first, then the `measure` phase, in step with the others through the
/// barriers.
fn spawn_clients(
    conns: Vec<(Conn, Client)>,
    populate: Option<usize>,
    measure: &Phase,
    barriers: (Arc<Barrier>, Arc<Barrier>),
    seed_base: u64,
) -> Vec<JoinHandle<ClientResult>> {
    let n = conns.len();
    conns
        .into_iter()
        .enumerate()
        .map(|(i, (conn, c))| {
            let pop = populate.map(|pipeline| Phase {
                populate: Some((i as u64..measure.keys).step_by(n).collect()),
                count: None,
                duration: None,
                pipeline,
                ratio_get: 0.0,
                ..measure.clone()
            });
            let seed = seed_base ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            tokio::spawn(run_client(
                conn,
                c,
                pop,
                measure.clone(),
                barriers.clone(),
                seed,
            ))
        })
        .collect()
}

/// Every client connected and subscribed to its response topic.
async fn connect_clients(
    args: &StateStoreArgs,
    timing: &Timing,
    addr: SocketAddr,
    run_id: String,
) -> Result<Vec<(Conn, Client)>, String> {
    // Long enough that the broker times no client out during the run.
    let run_bound = timing.duration.unwrap_or(timing.hard_timeout) * 2 + Duration::from_secs(60);
    let keep_alive = run_bound.as_secs().clamp(60, u64::from(u16::MAX)) as u16;
    let deadline = Instant::now() + timing.connect_timeout;
    let expiry = args.message_expiry;
    let value_size = args.value_size as usize;
    all(args.clients as usize, deadline, "client", move |i| {
        let c = Client::new(i as u32, format!("shb-{run_id}-{i}"), expiry, value_size);
        async move {
            let conn = connect(addr, &c, keep_alive).await?;
            Ok((conn, c))
        }
    })
    .await
}

/// The pipeline asked for, capped to the lowest Receive Maximum the broker gave the
/// clients (a warning if it was), and that Receive Maximum.
fn cap_pipeline(
    report: &mut Report,
    mut pipeline: u16,
    conns: &[(Conn, Client)],
) -> (u16, Option<u16>) {
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
    (pipeline, receive_maximum)
}

/// Every client's statistics once it finished (by `finish_by`): the populate phase's
/// and the measured phase's, merged, and when the last measured request ended (from
/// `t0`, ns since the time base).
async fn collect(
    report: &mut Report,
    handles: Vec<JoinHandle<ClientResult>>,
    finish_by: Instant,
    t0: u64,
) -> (OpStats, OpStats, u64) {
    let mut pop_total = OpStats::new();
    let mut total = OpStats::new();
    let mut end_ns = t0;
    join_each(
        handles,
        finish_by,
        "client",
        "did not finish in time",
        report,
        |i, r: ClientResult, report| {
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
        },
    )
    .await;
    (pop_total, total, end_ns)
}
