//! Phase 4 of the `statestore` scenario: turning the merged [`OpStats`] of the
//! populate and measure phases into the [`Report`] (ops/s, latency per
//! command, every kind of error), with the run's parameters and warnings.
//!
//! Separate from [`super::run`] because it is pure bookkeeping: no I/O, no
//! timing.

use std::net::SocketAddr;
use std::time::Duration;

use super::args::StateStoreArgs;
use super::stats::OpStats;
use super::Op;
use crate::report::{new_histogram, Latency, Report, Value};

/// What phases 1 to 3 of a run produced.
#[derive(Debug)]
pub(super) struct Outcome {
    pub(super) addr: SocketAddr,
    /// Requests outstanding per client actually used.
    pub(super) pipeline: u16,
    /// Requests per client, if the run was bounded by a count.
    pub(super) count: Option<u64>,
    /// Measured time, if the run was bounded by `--duration`.
    pub(super) duration: Option<Duration>,
    /// Whether keys were SET before measuring.
    pub(super) populate: bool,
    /// All clients' populate statistics.
    pub(super) pop_total: OpStats,
    /// All clients' measured statistics.
    pub(super) total: OpStats,
    /// Seconds from the start of measuring to the last client's end.
    pub(super) elapsed: f64,
    /// Process CPU seconds before and after measuring, where known.
    pub(super) cpu: Option<(f64, f64)>,
}

/// Adds the parameters, results and warnings of a finished run to `report`.
pub(super) fn summarize(mut report: Report, args: &StateStoreArgs, o: Outcome) -> Report {
    let n = args.clients as usize;
    add_params(&mut report, args, &o);
    if o.populate {
        let done = o.pop_total.completed[Op::Set as usize];
        report.result(
            "populated",
            "keys populated (SET before measuring)",
            Value::Int(done),
        );
        if o.pop_total.failures() > 0 {
            report.error(format!(
                "{} populate requests failed (first: {})",
                o.pop_total.failures(),
                o.pop_total.first_error.as_deref().unwrap_or("?")
            ));
        }
    }
    let (completed, errors) = add_results(&mut report, &o);
    add_latency(&mut report, &o.total);
    if o.total.puback_no_subscribers > 0 {
        report.warn(format!(
            "{} request PUBACKs said \"no matching subscribers\": is a state store running?",
            o.total.puback_no_subscribers
        ));
    }
    if let Some(e) = &o.total.first_error {
        report.warn(format!("first failure: {e}"));
    }
    if let Some(k) = o.count {
        if completed < k * n as u64 {
            report.warn(format!(
                "{} of {} requests were not completed",
                k * n as u64 - completed,
                k * n as u64
            ));
        }
    }
    if args.fail_on_error && errors > 0 {
        report.fail();
    }
    report
}

/// The run's parameters.
fn add_params(report: &mut Report, args: &StateStoreArgs, o: &Outcome) {
    report.param("broker", "broker", Value::Str(o.addr.to_string()));
    report.param("clients", "clients", Value::Int(u64::from(args.clients)));
    report.param(
        "pipeline",
        "pipeline (requests outstanding per client)",
        Value::Int(u64::from(o.pipeline)),
    );
    report.param("ratio_get", "GET ratio", Value::Float(args.ratio_get));
    report.param("keys", "keys", Value::Int(args.keys));
    report.param(
        "value_size",
        "value bytes",
        Value::Int(u64::from(args.value_size)),
    );
    match (o.count, o.duration) {
        (Some(k), _) => report.param("requests_per_client", "requests per client", Value::Int(k)),
        (None, Some(d)) => {
            report.param("duration_s", "duration (s)", Value::Float(d.as_secs_f64()))
        }
        _ => {}
    }
}

/// The measured phase's counts and rates, each kind of failure, and the bench's CPU
/// time: the requests completed and the errors.
fn add_results(report: &mut Report, o: &Outcome) -> (u64, u64) {
    let rate = |k: u64| {
        if o.elapsed > 0.0 {
            k as f64 / o.elapsed
        } else {
            0.0
        }
    };
    let sets = o.total.completed[Op::Set as usize];
    let gets = o.total.completed[Op::Get as usize];
    report.result("seconds", "measured time (s)", Value::Float(o.elapsed));
    report.result("requests", "requests completed", Value::Int(sets + gets));
    report.result("ops_per_sec", "ops/s", Value::Float(rate(sets + gets)));
    report.result("set", "SETs completed", Value::Int(sets));
    report.result("set_per_sec", "SET ops/s", Value::Float(rate(sets)));
    report.result("get", "GETs completed", Value::Int(gets));
    report.result("get_per_sec", "GET ops/s", Value::Float(rate(gets)));
    report.result("get_misses", "GET misses ($-1)", Value::Int(o.total.misses));
    for (key, label, n) in [
        (
            "bad_status",
            "responses without __stat 200",
            o.total.bad_status,
        ),
        ("resp_errors", "RESP error replies", o.total.resp_errors),
        ("unexpected", "unexpected replies", o.total.unexpected),
        ("unmatched", "unmatched responses", o.total.unmatched),
        (
            "puback_failures",
            "request PUBACK failures",
            o.total.puback_failures,
        ),
        ("timed_out", "requests without response", o.total.timed_out),
    ] {
        report.result(key, label, Value::Int(n));
    }
    let errors = o.total.failures() + if o.populate { o.total.misses } else { 0 };
    report.result("error_count", "errors (total)", Value::Int(errors));
    if let Some((a, b)) = o.cpu {
        let cpu = (b - a).max(0.0);
        report.result("bench_cpu_seconds", "bench CPU time (s)", Value::Float(cpu));
        report.result(
            "bench_cpu_pct",
            "bench CPU % of one core",
            Value::Float(if o.elapsed > 0.0 {
                cpu * 100.0 / o.elapsed
            } else {
                0.0
            }),
        );
    }
    (sets + gets, errors)
}

/// Latency of all requests and per command, and how many others were answered while
/// one waited.
fn add_latency(report: &mut Report, total: &OpStats) {
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
    let m = &total.meanwhile;
    if !m.is_empty() {
        for (key, label, q) in [
            ("answered_meanwhile_p50", "answered meanwhile p50", 0.5),
            ("answered_meanwhile_p99", "answered meanwhile p99", 0.99),
            ("answered_meanwhile_max", "answered meanwhile max", 1.0),
        ] {
            report.result(key, label, Value::Int(m.value_at_quantile(q)));
        }
    }
}
