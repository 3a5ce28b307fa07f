//! What the session store counts (exported as metrics by the binary).

use std::sync::atomic::AtomicU64;

/// What the session store counted.
#[derive(Debug, Default)]
pub struct SessionCounters {
    /// Changes refused because another node owns the session now.
    pub fenced: AtomicU64,
    /// Sessions moved here from another node (released or dead).
    pub adopted: AtomicU64,
    /// Messages replayed from the stream into a session moved here.
    pub replayed: AtomicU64,
    /// Stream messages the reader did not deliver to a session moved here because its
    /// copy held them already (appended late by the node it came from; `origins.rs`).
    pub not_redelivered: AtomicU64,
    /// Copies taken back because their publisher was refused, given by this node's
    /// reader when the message's entry reached the stream after all (`origins.rs`).
    pub withdrawn_given: AtomicU64,
    /// Origins of sessions that moved here forgotten past `adopted::MAX_ADOPTED`.
    pub adopted_forgotten: AtomicU64,
    /// Batches that failed to reach Redis (retried).
    pub failed: AtomicU64,
    /// Sessions of dead owners whose expiry clock this node's sweeper started.
    pub expiring: AtomicU64,
    /// Sessions this node's sweeper forgot at their expiry (their owner was dead or
    /// nobody claimed them).
    pub swept: AtomicU64,
    /// Batches written (one script call each).
    pub written: AtomicU64,
    /// Batches fewer replicas acknowledged than `wait_replicas` asks (their barriers
    /// failed).
    pub not_replicated: AtomicU64,
}
