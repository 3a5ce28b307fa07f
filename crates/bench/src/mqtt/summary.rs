//! Phase 5 of the `mqtt` scenario: aggregating what the publishers and
//! subscribers measured (counts, loss, rates, latency histograms) into the
//! [`Report`], with the run's parameters and any warnings.
//!
//! Separate from [`super::run`] because it is pure bookkeeping: no I/O, no
//! timing, only the collected [`PubStats`] and [`SubStats`].

use std::net::SocketAddr;
use std::time::Duration;

use super::args::{MqttArgs, TopicMode};
use super::publisher::PubStats;
use super::subscriber::SubStats;
use crate::report::{new_histogram, Latency, Report, Value};

/// What phases 1 to 4 of a run produced.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) addr: SocketAddr,
    /// Messages per publisher, if the run was bounded by a count.
    pub(super) count: Option<u64>,
    /// Publishing time, if the run was bounded by `--duration`.
    pub(super) duration: Option<Duration>,
    /// The QoS 1 in-flight window actually used.
    pub(super) window: u16,
    /// When publishing started (ns since the time base).
    pub(super) t0_ns: u64,
    pub(super) published: u64,
    pub(super) expected: u64,
    pub(super) pubs: Vec<PubStats>,
    pub(super) subs: Vec<SubStats>,
    /// The broker's CPU seconds from the start of publishing to the end of
    /// delivery (with `--broker-pid`).
    pub(super) broker_cpu_s: Option<f64>,
}

/// Adds the parameters, results and warnings of a finished run to `report`.
pub(super) fn summarize(mut report: Report, args: &MqttArgs, o: Outcome) -> Report {
    let t = Totals::of(&o);
    add_params(&mut report, args, &o);
    add_results(&mut report, args.qos, &o, &t);
    let mut e2e = new_histogram();
    for s in &o.subs {
        let _ = e2e.add(&s.hist);
    }
    report.latency(
        "latency",
        "latency publish->receive",
        Latency::from_histogram(&e2e),
    );
    if args.qos == 1 {
        let mut ack_hist = new_histogram();
        for p in &o.pubs {
            let _ = ack_hist.add(&p.ack_hist);
        }
        report.latency(
            "ack_latency",
            "latency publish->PUBACK",
            Latency::from_histogram(&ack_hist),
        );
    }
    if t.foreign > 0 {
        report.warn(format!(
            "{} messages without a valid benchmark header",
            t.foreign
        ));
    }
    if t.gaps > t.lost {
        report.warn(format!("{} sequence gaps (out-of-order delivery)", t.gaps));
    }
    let missing_acks = args.qos == 1 && t.acked < o.published;
    if missing_acks {
        report.warn(format!("{} PUBACKs missing", o.published - t.acked));
    }
    if args.fail_on_loss && (t.lost > 0 || missing_acks || t.ack_failures > 0) {
        report.fail();
    }
    report
}

/// The publishers' and subscribers' statistics added up.
struct Totals {
    received: u64,
    duplicates: u64,
    foreign: u64,
    gaps: u64,
    lost: u64,
    acked: u64,
    ack_failures: u64,
    /// Seconds from the start of publishing to the last message published, received
    /// and acknowledged.
    publish_secs: f64,
    delivery_secs: f64,
    ack_secs: f64,
}

impl Totals {
    fn of(o: &Outcome) -> Self {
        let received: u64 = o.subs.iter().map(|s| s.received).sum();
        let duplicates: u64 = o.subs.iter().map(|s| s.duplicates).sum();
        let foreign: u64 = o.subs.iter().map(|s| s.foreign).sum();
        let unique = received.saturating_sub(duplicates).saturating_sub(foreign);
        let secs_since_t0 =
            |last: Option<u64>| last.unwrap_or(o.t0_ns).saturating_sub(o.t0_ns) as f64 / 1e9;
        Totals {
            received,
            duplicates,
            foreign,
            gaps: o.subs.iter().map(|s| s.gaps).sum(),
            lost: o.expected.saturating_sub(unique),
            acked: o.pubs.iter().map(|p| p.acked).sum(),
            ack_failures: o.pubs.iter().map(|p| p.ack_failures).sum(),
            publish_secs: secs_since_t0(o.pubs.iter().map(|p| p.done_publishing_ns).max()),
            delivery_secs: secs_since_t0(o.subs.iter().map(|s| s.last_recv_ns).max()),
            ack_secs: secs_since_t0(o.pubs.iter().map(|p| p.last_ack_ns).max()),
        }
    }
}

/// The run's parameters.
fn add_params(report: &mut Report, args: &MqttArgs, o: &Outcome) {
    report.param("broker", "broker", Value::Str(o.addr.to_string()));
    report.param(
        "protocol",
        "protocol",
        Value::Str(if args.v311 { "3.1.1" } else { "5" }.into()),
    );
    report.param("qos", "QoS", Value::Int(u64::from(args.qos)));
    report.param(
        "publishers",
        "publishers",
        Value::Int(u64::from(args.publishers)),
    );
    report.param(
        "subscribers",
        "subscribers",
        Value::Int(u64::from(args.subscribers)),
    );
    report.param(
        "topic_mode",
        "topic mode",
        Value::Str(
            match args.topic_mode {
                TopicMode::Shared => "shared",
                TopicMode::PerPublisher => "per-publisher",
                TopicMode::Wildcard => "wildcard",
            }
            .into(),
        ),
    );
    report.param(
        "payload_size",
        "payload bytes",
        Value::Int(u64::from(args.payload_size)),
    );
    match (o.count, o.duration) {
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
    if args.qos == 1 {
        report.param(
            "inflight",
            "in-flight window",
            Value::Int(u64::from(o.window)),
        );
    }
    if args.rate > 0.0 {
        report.param(
            "rate_per_publisher",
            "rate per publisher (msg/s)",
            Value::Float(args.rate),
        );
    }
}

/// The run's results: what was published, acknowledged (QoS 1) and delivered, at
/// which rates, and the broker's CPU time if known.
fn add_results(report: &mut Report, qos: u8, o: &Outcome, t: &Totals) {
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let mut results = vec![
        ("published", "messages published", Value::Int(o.published)),
        (
            "publish_seconds",
            "publish time (s)",
            Value::Float(t.publish_secs),
        ),
        (
            "publish_per_sec",
            "published msg/s",
            Value::Float(rate(o.published, t.publish_secs)),
        ),
    ];
    if qos == 1 {
        results.extend([
            ("acked", "PUBACKs received", Value::Int(t.acked)),
            (
                "ack_failures",
                "PUBACK failure codes",
                Value::Int(t.ack_failures),
            ),
            (
                "acks_per_sec",
                "PUBACKs/s",
                Value::Float(rate(t.acked, t.ack_secs)),
            ),
        ]);
    }
    let loss_pct = if o.expected > 0 {
        t.lost as f64 * 100.0 / o.expected as f64
    } else {
        0.0
    };
    results.extend([
        ("expected", "messages expected", Value::Int(o.expected)),
        ("received", "messages received", Value::Int(t.received)),
        ("duplicates", "duplicates", Value::Int(t.duplicates)),
        ("lost", "lost", Value::Int(t.lost)),
        ("loss_pct", "lost %", Value::Float(loss_pct)),
        (
            "delivery_seconds",
            "delivery time (s)",
            Value::Float(t.delivery_secs),
        ),
        (
            "delivered_per_sec",
            "delivered msg/s",
            Value::Float(rate(t.received, t.delivery_secs)),
        ),
    ]);
    if let Some(cpu) = o.broker_cpu_s {
        results.push(("broker_cpu_s", "broker CPU (s)", Value::Float(cpu)));
        if t.received > 0 {
            results.push((
                "broker_cpu_us_per_msg",
                "broker CPU per delivered message (µs)",
                Value::Float(cpu * 1e6 / t.received as f64),
            ));
        }
    }
    for (key, label, value) in results {
        report.result(key, label, value);
    }
}
