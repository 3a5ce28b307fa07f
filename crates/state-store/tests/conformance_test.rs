//! The engine conformance suite, run against `MemoryEngine`.

use statehub_state_store::conformance;
use statehub_state_store::MemoryEngine;

#[test]
fn memory_engine_conforms() {
    conformance::run_all(MemoryEngine::new);
}

#[test]
fn memory_engine_get_does_not_copy() {
    conformance::get_does_not_copy(&mut MemoryEngine::new());
}
