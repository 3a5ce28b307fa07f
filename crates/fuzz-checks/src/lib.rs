//! The checks the fuzz targets run, one function per target, so that the targets in
//! `fuzz/` (cargo-fuzz, nightly) and the corpus replay test here (stable, part of the
//! ordinary test run) run the same code on the same inputs.
//!
//! Every check takes arbitrary bytes and panics when an invariant breaks; "no panic,
//! no hang" is always one of them. What each target feeds and asserts is documented on
//! its function and in `docs/security.md` ("Fuzzing").

mod input;
mod mqtt;
mod state_store;
mod storage;
mod webpubsub;

pub use mqtt::mqtt_codec;
pub use state_store::{resp, state_store};
pub use storage::storage_recovery;
pub use webpubsub::{jwt, odata_filter, webpubsub_json, webpubsub_protobuf};

/// A target's check: panics when an invariant breaks.
pub type Check = fn(&[u8]);

/// Every target: its name (`fuzz/fuzz_targets/<name>.rs`, `fuzz/corpus/<name>/`) and
/// its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("mqtt_codec", mqtt_codec),
    ("resp", resp),
    ("state_store", state_store),
    ("webpubsub_json", webpubsub_json),
    ("webpubsub_protobuf", webpubsub_protobuf),
    ("odata_filter", odata_filter),
    ("jwt", jwt),
    ("storage_recovery", storage_recovery),
];
