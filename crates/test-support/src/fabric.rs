//! A fake cluster for broker tests: a [`Fabric`] of which this node is the only one
//! that says anything, whose forwards end as the test sets ([`ForwardOutcome`]) and which
//! takes refused copies on ([`Fabric::withdraw`]) if the test says so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use statehub_broker::{BoxFuture, Fabric, FabricError, Message, SharedPicks};
use tokio::sync::oneshot;

type Done = oneshot::Sender<Result<(), FabricError>>;

/// How a forward ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardOutcome {
    /// At once, accepted.
    Accept,
    /// At once, refused (as an append that timed out).
    Refuse,
    /// When the test ends it ([`FakeFabric::end`]), in any order.
    Hold,
}

#[derive(Debug)]
pub struct FakeFabric {
    outcome: Mutex<ForwardOutcome>,
    /// The held forwards, in the order they came.
    held: Mutex<Vec<Option<Done>>>,
    takes: AtomicBool,
    /// What each `withdraw` was asked: the message's payload and the client ids.
    asked: Mutex<Vec<(Vec<u8>, Vec<String>)>>,
}

impl FakeFabric {
    pub fn new(outcome: ForwardOutcome) -> Arc<Self> {
        Arc::new(Self {
            outcome: Mutex::new(outcome),
            held: Mutex::default(),
            takes: AtomicBool::new(false),
            asked: Mutex::default(),
        })
    }

    /// How the next forwards end.
    pub fn set_outcome(&self, outcome: ForwardOutcome) {
        *self.outcome.lock().unwrap() = outcome;
    }

    /// Whether `withdraw` takes the copies on (it says it will give them again).
    pub fn set_takes(&self, takes: bool) {
        self.takes.store(takes, Ordering::SeqCst);
    }

    /// How many forwards were held so far.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    /// Ends the `n`th held forward (from 1) with `result`.
    pub fn end(&self, n: usize, result: Result<(), FabricError>) {
        let done = self.held.lock().unwrap()[n - 1].take();
        let _ = done.expect("ended twice").send(result);
    }

    /// What each `withdraw` was asked: the payload and the client ids, sorted.
    pub fn asked(&self) -> Vec<(Vec<u8>, Vec<String>)> {
        self.asked.lock().unwrap().clone()
    }
}

impl Fabric for FakeFabric {
    fn is_available(&self) -> bool {
        true
    }
    fn shared_picks(&self, _topic: &str) -> SharedPicks {
        SharedPicks::default()
    }
    fn forward(&self, _: &Message, _: SharedPicks) -> BoxFuture<'static, Result<(), FabricError>> {
        match *self.outcome.lock().unwrap() {
            ForwardOutcome::Accept => Box::pin(async { Ok(()) }),
            ForwardOutcome::Refuse => {
                Box::pin(async { Err(FabricError::Unavailable("timed out".into())) })
            }
            ForwardOutcome::Hold => {
                let (tx, rx) = oneshot::channel();
                self.held.lock().unwrap().push(Some(tx));
                Box::pin(async move {
                    rx.await
                        .unwrap_or_else(|_| Err(FabricError::Unavailable("dropped".into())))
                })
            }
        }
    }
    fn connected(&self, _: &str, _: bool) -> BoxFuture<'static, Result<(), FabricError>> {
        Box::pin(async { Ok(()) })
    }
    fn announcing(&self, _client_id: &str) -> bool {
        false
    }
    fn shared_group_changed(&self, _filter: &str, _group: &str, _present: bool) {}
    fn withdraw(&self, msg: &Message, clients: &[Arc<str>]) -> bool {
        let mut clients: Vec<String> = clients.iter().map(|c| c.to_string()).collect();
        clients.sort();
        let asked = (msg.payload.to_vec(), clients);
        self.asked.lock().unwrap().push(asked);
        self.takes.load(Ordering::SeqCst)
    }
}
