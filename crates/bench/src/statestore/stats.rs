//! Per-client, per-phase statistics of the `statestore` scenario
//! ([`OpStats`]): completions and latency per command, every kind of failure,
//! and merging them across clients.

use std::sync::atomic::AtomicU64;

use hdrhistogram::Histogram;

use crate::report::new_histogram;

/// Responses matched so far, all clients together. A request's "answered meanwhile" is
/// this count at its response minus the count when it was sent: a fairness measure in
/// units of the server's work, which a loaded machine's preemption (of the server or of
/// this tool) does not stretch as it stretches wall-clock latency. With every client
/// served in turn it stays near the number of requests in flight; a client left waiting
/// while others are served sees it grow.
pub(super) static ANSWERED: AtomicU64 = AtomicU64::new(0);

/// What one client measured in one phase.
#[derive(Debug)]
pub(super) struct OpStats {
    pub(super) completed: [u64; 2],
    pub(super) hist: [Histogram<u64>; 2],
    /// Per request: how many requests of all clients were answered while it waited
    /// (see [`ANSWERED`]).
    pub(super) meanwhile: Histogram<u64>,
    /// `__stat` missing or not 200.
    pub(super) bad_status: u64,
    /// RESP error payloads (`-...`).
    pub(super) resp_errors: u64,
    /// Payloads that are neither the expected reply nor a RESP error.
    pub(super) unexpected: u64,
    /// GET answered `$-1`.
    pub(super) misses: u64,
    /// Responses whose Correlation Data matches no outstanding request.
    pub(super) unmatched: u64,
    /// PUBACKs (for requests) with a reason code >= 0x80.
    pub(super) puback_failures: u64,
    /// PUBACKs with "no matching subscribers" (no state store listening).
    pub(super) puback_no_subscribers: u64,
    /// Requests still outstanding when the client gave up.
    pub(super) timed_out: u64,
    pub(super) first_error: Option<String>,
    pub(super) error: Option<String>,
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
}

impl OpStats {
    pub(super) fn new() -> Self {
        OpStats {
            completed: [0; 2],
            hist: [new_histogram(), new_histogram()],
            meanwhile: new_histogram(),
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

    pub(super) fn failures(&self) -> u64 {
        self.bad_status
            + self.resp_errors
            + self.unexpected
            + self.unmatched
            + self.puback_failures
            + self.timed_out
    }

    pub(super) fn note(&mut self, what: impl FnOnce() -> String) {
        if self.first_error.is_none() {
            self.first_error = Some(what());
        }
    }

    pub(super) fn merge(&mut self, o: &OpStats) {
        for i in 0..2 {
            self.completed[i] += o.completed[i];
            let _ = self.hist[i].add(&o.hist[i]);
        }
        let _ = self.meanwhile.add(&o.meanwhile);
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
