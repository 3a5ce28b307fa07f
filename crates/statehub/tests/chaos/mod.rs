//! The clients of the cluster chaos test, each of which outlives the nodes it talks to:
//! the [`Directory`] of live nodes (the test's balancer), MQTT publishers that move to
//! another node when theirs dies and resend what was not acknowledged, an MQTT
//! subscriber, Web PubSub members and a REST sender.
#![allow(dead_code)]

pub mod mqtt;
pub mod webpubsub;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one call may take on a loaded machine before the client gives its node up.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// A node's listeners.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    pub mqtt: SocketAddr,
    pub http: SocketAddr,
}

/// The live nodes, as a balancer knows them: the test takes a node out before it kills
/// it and puts it back once it restarted. Clients ask it for a node, round robin.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    nodes: Arc<Mutex<Vec<Option<Addrs>>>>,
    turn: Arc<AtomicUsize>,
}

impl Directory {
    pub fn new(nodes: &[Addrs]) -> Self {
        Self {
            nodes: Arc::new(Mutex::new(nodes.iter().copied().map(Some).collect())),
            turn: Arc::default(),
        }
    }

    /// The next live node among `among` (indices), round robin; waits while none is.
    pub async fn pick(&self, among: &[usize]) -> (usize, Addrs) {
        loop {
            let turn = self.turn.fetch_add(1, Ordering::Relaxed);
            {
                let nodes = self.nodes.lock().unwrap();
                for k in 0..among.len() {
                    let i = among[(turn + k) % among.len()];
                    if let Some(addrs) = nodes[i] {
                        return (i, addrs);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn set(&self, i: usize, addrs: Option<Addrs>) {
        self.nodes.lock().unwrap()[i] = addrs;
    }
}

/// What the clients of one kind share with the test: when to stop, and how much they
/// got done (so the test kills a node while they are busy and restarts it once they
/// moved on).
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub stop: Arc<AtomicBool>,
    pub acked: Arc<AtomicUsize>,
    /// Times a client lost its node and moved to another (all kinds).
    pub moved: Arc<AtomicUsize>,
}

impl Progress {
    /// The progress of another kind of client, stopped and moved with this one.
    pub fn another(&self) -> Self {
        Self {
            acked: Arc::default(),
            ..self.clone()
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn ack(&self) {
        self.acked.fetch_add(1, Ordering::Relaxed);
    }

    pub fn moved(&self) {
        self.moved.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits until every kind of client got `n` more acknowledgements than now (at
    /// most a minute).
    pub async fn advance(kinds: &[&Progress], n: usize) {
        let targets: Vec<usize> = kinds
            .iter()
            .map(|k| k.acked.load(Ordering::Relaxed) + n)
            .collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        for (kind, target) in kinds.iter().zip(targets) {
            while kind.acked.load(Ordering::Relaxed) < target {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "some clients made no progress for a minute"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
