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
    let qos = args.qos;
    let n_pub = args.publishers as usize;
    let n_sub = args.subscribers as usize;
    let received: u64 = o.subs.iter().map(|s| s.received).sum();
    let duplicates: u64 = o.subs.iter().map(|s| s.duplicates).sum();
    let foreign: u64 = o.subs.iter().map(|s| s.foreign).sum();
    let gaps: u64 = o.subs.iter().map(|s| s.gaps).sum();
    let unique = received.saturating_sub(duplicates).saturating_sub(foreign);
    let lost = o.expected.saturating_sub(unique);
    let acked: u64 = o.pubs.iter().map(|p| p.acked).sum();
    let ack_failures: u64 = o.pubs.iter().map(|p| p.ack_failures).sum();
    let secs_since_t0 = |ns: u64| ns.saturating_sub(o.t0_ns) as f64 / 1e9;
    let publish_secs = secs_since_t0(
        o.pubs
            .iter()
            .map(|p| p.done_publishing_ns)
            .max()
            .unwrap_or(o.t0_ns),
    );
    let delivery_secs = secs_since_t0(
        o.subs
            .iter()
            .map(|s| s.last_recv_ns)
            .max()
            .unwrap_or(o.t0_ns),
    );
    let ack_secs = secs_since_t0(
        o.pubs
            .iter()
            .map(|p| p.last_ack_ns)
            .max()
            .unwrap_or(o.t0_ns),
    );
    let rate = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };

    let mut e2e = new_histogram();
    for s in &o.subs {
        let _ = e2e.add(&s.hist);
    }
    let mut ack_hist = new_histogram();
    for p in &o.pubs {
        let _ = ack_hist.add(&p.ack_hist);
    }

    report.param("broker", "broker", Value::Str(o.addr.to_string()));
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
    if qos == 1 {
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

    let mut results = vec![
        ("published", "messages published", Value::Int(o.published)),
        (
            "publish_seconds",
            "publish time (s)",
            Value::Float(publish_secs),
        ),
        (
            "publish_per_sec",
            "published msg/s",
            Value::Float(rate(o.published, publish_secs)),
        ),
    ];
    if qos == 1 {
        results.extend([
            ("acked", "PUBACKs received", Value::Int(acked)),
            (
                "ack_failures",
                "PUBACK failure codes",
                Value::Int(ack_failures),
            ),
            (
                "acks_per_sec",
                "PUBACKs/s",
                Value::Float(rate(acked, ack_secs)),
            ),
        ]);
    }
    let loss_pct = if o.expected > 0 {
        lost as f64 * 100.0 / o.expected as f64
    } else {
        0.0
    };
    results.extend([
        ("expected", "messages expected", Value::Int(o.expected)),
        ("received", "messages received", Value::Int(received)),
        ("duplicates", "duplicates", Value::Int(duplicates)),
        ("lost", "lost", Value::Int(lost)),
        ("loss_pct", "lost %", Value::Float(loss_pct)),
        (
            "delivery_seconds",
            "delivery time (s)",
            Value::Float(delivery_secs),
        ),
        (
            "delivered_per_sec",
            "delivered msg/s",
            Value::Float(rate(received, delivery_secs)),
        ),
    ]);
    if let Some(cpu) = o.broker_cpu_s {
        results.push(("broker_cpu_s", "broker CPU (s)", Value::Float(cpu)));
        if received > 0 {
            results.push((
                "broker_cpu_us_per_msg",
                "broker CPU per delivered message (µs)",
                Value::Float(cpu * 1e6 / received as f64),
            ));
        }
    }
    for (key, label, value) in results {
        report.result(key, label, value);
    }
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
    let missing_acks = qos == 1 && acked < o.published;
    if missing_acks {
        report.warn(format!("{} PUBACKs missing", o.published - acked));
    }
    if args.fail_on_loss && (lost > 0 || missing_acks || ack_failures > 0) {
        report.fail();
    }
    report
}
