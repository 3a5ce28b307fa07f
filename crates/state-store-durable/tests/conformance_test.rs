//! The persistent engine is held to the same contract as the memory engine, plus the
//! reopen checks every persistent engine runs.

use std::cell::Cell;

use statehub_state_store::conformance::{self, Reopen};
use statehub_state_store_durable::DurableEngine;
use statehub_storage::{Options, Store};

/// Fresh engines, each on its own directory under one temporary root.
struct Fresh {
    root: tempfile::TempDir,
    next: Cell<u32>,
}

impl Fresh {
    fn new() -> Self {
        Self {
            root: tempfile::tempdir().unwrap(),
            next: Cell::new(0),
        }
    }

    fn engine(&self) -> DurableEngine {
        self.next.set(self.next.get() + 1);
        let store = Store::open(
            self.root.path().join(self.next.get().to_string()),
            Options::default(),
        )
        .unwrap();
        DurableEngine::open(&store).unwrap()
    }
}

#[test]
fn durable_engine_conforms() {
    let fresh = Fresh::new();
    conformance::run_all(|| fresh.engine());
}

#[test]
fn durable_engine_get_does_not_copy() {
    let fresh = Fresh::new();
    conformance::get_does_not_copy(&mut fresh.engine());
}

struct Place(tempfile::TempDir);

impl Reopen for Place {
    type Engine = DurableEngine;

    fn open(&self) -> DurableEngine {
        let store = Store::open(self.0.path(), Options::default()).unwrap();
        DurableEngine::open(&store).unwrap()
    }

    fn close(&self, engine: DurableEngine) {
        let store = engine.store().clone();
        drop(engine);
        store.close().unwrap();
    }
}

#[test]
fn durable_engine_survives_reopen() {
    conformance::run_persistent(|| Place(tempfile::tempdir().unwrap()));
}
