//! Phases 1 to 4 of the `mqtt` scenario (see the module documentation of
//! [`super`]): validate the arguments, connect and subscribe, start the
//! publishers and subscribers, wait for publishing and delivery to finish.
//! Phase 5, turning the collected statistics into a report, is in
//! [`super::summary`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::args::MqttArgs;
use super::client::{connect, subscribe};
use super::publisher::{run_publisher, PubPlan, PubStats};
use super::subscriber::{run_subscriber, SubStats};
use super::summary::{self, Outcome};
use super::topics::{self, TopicPlan};
use super::DEFAULT_MESSAGES;
use crate::common::{self, all, base, join_each, now_ns, resolve, secs, Conn};
use crate::proto::Version;
use crate::report::Report;

/// The run's bounds in time, from the arguments.
#[derive(Clone, Copy)]
struct Timing {
    /// Messages per publisher (`None`: publish for `duration`).
    count: Option<u64>,
    duration: Option<Duration>,
    hard_timeout: Duration,
    drain: Duration,
    connect_timeout: Duration,
}

impl Timing {
    fn new(args: &MqttArgs) -> Result<Self, String> {
        if !(args.rate >= 0.0 && args.rate.is_finite()) {
            return Err("--rate must be a non-negative number".into());
        }
        let duration = args.duration.map(secs).transpose()?;
        let count = match duration {
            Some(_) => None,
            None => Some(args.messages_per_publisher.unwrap_or(DEFAULT_MESSAGES)),
        };
        let hard_timeout = secs(args.timeout)?;
        if let Some(d) = duration {
            if d > hard_timeout {
                return Err("--duration is longer than --timeout".into());
            }
        }
        Ok(Timing {
            count,
            duration,
            hard_timeout,
            drain: secs(args.drain_timeout)?,
            connect_timeout: secs(args.connect_timeout)?,
        })
    }

    /// What the publishers are about to do.
    fn publishing(&self) -> String {
        match (self.count, self.duration) {
            (Some(k), _) => format!("publishing {k} messages per publisher"),
            (None, Some(d)) => format!("publishing for {:.1}s", d.as_secs_f64()),
            _ => String::new(),
        }
    }

    /// How long the whole run may take: the broker must not time out a subscriber
    /// that hears nothing meanwhile.
    fn run_bound(&self) -> Duration {
        self.duration.unwrap_or(self.hard_timeout) + self.drain * 2 + Duration::from_secs(60)
    }
}

/// How every client of the run connects.
#[derive(Clone)]
struct Clients {
    version: Version,
    keep_alive: u16,
    /// Client ids are this, `-s{j}` or `-p{i}`.
    prefix: String,
}

/// Everything the run needs before it connects.
struct Setup {
    timing: Timing,
    clients: Clients,
    addr: SocketAddr,
    sub_addr: SocketAddr,
    topics: TopicPlan,
    run_bound: Duration,
}

impl Setup {
    async fn new(args: &MqttArgs) -> Result<Self, String> {
        let version = if args.v311 {
            Version::V311
        } else {
            Version::V5
        };
        let timing = Timing::new(args)?;
        let addr = resolve(&args.host, args.port).await?;
        let sub_addr = match args.subscriber_port {
            Some(port) => resolve(&args.host, port).await?,
            None => addr,
        };
        if let Some(ca) = &args.tls_ca {
            crate::common::use_tls(ca, &args.tls_name)?;
        }
        let run_id = run_id();
        let (n_pub, n_sub) = (args.publishers as usize, args.subscribers as usize);
        let topics = topics::plan(args.topic_mode, &args.topic_prefix, &run_id, n_pub, n_sub);
        let run_bound = timing.run_bound();
        let clients = Clients {
            version,
            keep_alive: run_bound.as_secs().clamp(60, u64::from(u16::MAX)) as u16,
            prefix: format!("shb-{run_id}"),
        };
        Ok(Setup {
            timing,
            clients,
            addr,
            sub_addr,
            topics,
            run_bound,
        })
    }
}

pub async fn run(args: MqttArgs) -> Result<Report, String> {
    let _ = base();
    let setup = Setup::new(&args).await?;
    let (n_pub, n_sub, qos) = (
        args.publishers as usize,
        args.subscribers as usize,
        args.qos,
    );
    let (version, addr, sub_addr) = (setup.clients.version, setup.addr, setup.sub_addr);
    let progress = |msg: String| common::progress(args.quiet, msg);

    // Phase 1: subscribers connected and subscribed.
    progress(format!(
        "connecting {n_sub} subscribers to {sub_addr} ({version:?}, QoS {qos})"
    ));
    let deadline = Instant::now() + setup.timing.connect_timeout;
    let filters = setup.topics.filters.clone();
    let sub_conns = connect_subscribers(&setup.clients, sub_addr, filters, qos, deadline).await?;
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
    let deadline = Instant::now() + setup.timing.connect_timeout;
    let pub_conns = all(n_pub, deadline, "publisher", {
        let clients = setup.clients.clone();
        move |i| {
            let id = format!("{}-p{i}", clients.prefix);
            let (version, keep_alive) = (clients.version, clients.keep_alive);
            async move { connect(addr, version, &id, keep_alive).await }
        }
    })
    .await?;
    let conns = (&pub_conns[..], &sub_conns[..]);
    let window = check_connacks(&args, &mut report, conns, setup.run_bound)?;

    // Phases 3 and 4, then 5: the report.
    let outcome = measure(&args, &setup, &mut report, (pub_conns, sub_conns), window).await;
    Ok(summary::summarize(report, &args, outcome))
}

/// Phases 3 and 4: the subscribers receive and the publishers publish, until every
/// message expected was delivered or delivery stopped.
async fn measure(
    args: &MqttArgs,
    setup: &Setup,
    report: &mut Report,
    (pub_conns, sub_conns): (Vec<Conn>, Vec<(Conn, u8)>),
    window: u16,
) -> Outcome {
    let Timing {
        count,
        duration,
        hard_timeout,
        drain,
        ..
    } = setup.timing;
    let version = setup.clients.version;
    let n_pub = pub_conns.len();
    let received_total = Arc::new(AtomicU64::new(0));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sub_handles: Vec<JoinHandle<SubStats>> = sub_conns
        .into_iter()
        .map(|(c, _)| {
            let counted = (received_total.clone(), stop_rx.clone());
            tokio::spawn(run_subscriber(c, version, n_pub, counted.0, counted.1))
        })
        .collect();
    common::progress(args.quiet, setup.timing.publishing());
    let cpu_at_start = args.broker_pid.and_then(common::proc_cpu_secs);
    let start = Instant::now();
    let t0_ns = now_ns();
    let plan = PubPlan {
        index: 0,
        version,
        qos: args.qos,
        topic: Vec::new(),
        payload_size: args.payload_size as usize,
        count,
        until: start + duration.unwrap_or(hard_timeout).min(hard_timeout),
        start,
        rate: args.rate,
        window,
        drain,
    };
    let pubs = publish(report, plan, pub_conns, &setup.topics.topics).await;

    // Phase 4: wait for deliveries.
    let published: u64 = pubs.iter().map(|p| p.published).sum();
    // Each message once per subscriber its topic matches.
    let matching = &setup.topics.matching;
    let expected: u64 = pubs
        .iter()
        .zip(matching)
        .map(|(p, m)| p.published * m)
        .sum();
    common::progress(
        args.quiet,
        format!("published {published}; waiting for {expected} deliveries"),
    );
    let within = hard_timeout.max(drain);
    await_deliveries(&received_total, expected, (drain, within), &sub_handles).await;
    let broker_cpu_s = cpu_at_start
        .zip(args.broker_pid.and_then(common::proc_cpu_secs))
        .map(|(a, b)| b - a);
    let _ = stop_tx.send(true);
    let subs = stop_subscribers(report, sub_handles).await;
    Outcome {
        addr: setup.addr,
        count,
        duration,
        window,
        t0_ns,
        published,
        expected,
        pubs,
        subs,
        broker_cpu_s,
    }
}

/// Tells this run's topics and client ids from any other's.
fn run_id() -> String {
    format!(
        "{:x}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// Phase 1: every subscriber connected and subscribed to its filters; each with the
/// lowest QoS granted.
async fn connect_subscribers(
    clients: &Clients,
    sub_addr: SocketAddr,
    filters: Vec<Vec<String>>,
    qos: u8,
    deadline: Instant,
) -> Result<Vec<(Conn, u8)>, String> {
    let filters = Arc::new(filters);
    let clients = clients.clone();
    all(filters.len(), deadline, "subscriber", move |j| {
        let id = format!("{}-s{j}", clients.prefix);
        let (version, keep_alive) = (clients.version, clients.keep_alive);
        let filters = filters.clone();
        async move {
            let mut c = connect(sub_addr, version, &id, keep_alive).await?;
            let granted = subscribe(&mut c, version, &filters[j], qos).await?;
            Ok((c, granted))
        }
    })
    .await
}

/// What the brokers' CONNACKs allow: the publishers' in-flight window (capped by
/// their Receive Maximum at QoS 1); an error when the QoS asked for is above their
/// Maximum QoS; a warning for a keep-alive shorter than the run.
fn check_connacks(
    args: &MqttArgs,
    report: &mut Report,
    (pub_conns, sub_conns): (&[Conn], &[(Conn, u8)]),
    run_bound: Duration,
) -> Result<u16, String> {
    let qos = args.qos;
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
    Ok(window)
}

/// Phase 3: each publisher runs `plan` on its own topic; their statistics once they
/// stopped (by `plan.until`, then draining acks for at most a few drain periods).
async fn publish(
    report: &mut Report,
    plan: PubPlan,
    pub_conns: Vec<Conn>,
    topics: &[String],
) -> Vec<PubStats> {
    let (until, drain, count) = (plan.until, plan.drain, plan.count);
    let pub_handles: Vec<JoinHandle<PubStats>> = pub_conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let plan = PubPlan {
                index: i as u32,
                topic: topics[i].clone().into_bytes(),
                ..plan.clone()
            };
            tokio::spawn(run_publisher(c, plan))
        })
        .collect();
    let pub_deadline = until + drain * 4 + Duration::from_secs(5);
    let mut pubs = Vec::with_capacity(pub_handles.len());
    join_each(
        pub_handles,
        pub_deadline,
        "publisher",
        "did not finish in time",
        report,
        |i, st: PubStats, report| {
            if let Some(e) = &st.error {
                report.error(format!("publisher {i}: {e}"));
            }
            pubs.push(st);
        },
    )
    .await;
    if count.is_some() && Instant::now() >= until {
        report.warn("publishing hit --timeout before sending all messages".into());
    }
    pubs
}

/// Phase 4: waits until `expected` messages were received, or none came for `drain`,
/// or `within` passed, or every subscriber ended.
async fn await_deliveries(
    received_total: &AtomicU64,
    expected: u64,
    (drain, within): (Duration, Duration),
    sub_handles: &[JoinHandle<SubStats>],
) {
    let mut last = received_total.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    let deadline = Instant::now() + within;
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
            || now >= deadline
            || sub_handles.iter().all(|h| h.is_finished())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The subscribers' statistics once they stopped (told to, within 5 s).
async fn stop_subscribers(
    report: &mut Report,
    sub_handles: Vec<JoinHandle<SubStats>>,
) -> Vec<SubStats> {
    let mut subs = Vec::with_capacity(sub_handles.len());
    let sub_deadline = Instant::now() + Duration::from_secs(5);
    join_each(
        sub_handles,
        sub_deadline,
        "subscriber",
        "did not stop",
        report,
        |j, st: SubStats, report| {
            if let Some(e) = &st.error {
                report.error(format!("subscriber {j}: {e}"));
            }
            subs.push(st);
        },
    )
    .await;
    subs
}
