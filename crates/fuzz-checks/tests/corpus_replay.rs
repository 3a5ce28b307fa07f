//! Replays the fuzz corpora (`fuzz/corpus/<target>/`) through the checks the fuzz
//! targets run: every input the fuzzers kept, and every crash they found (kept in the
//! corpus once fixed), passes on the stable toolchain in the ordinary test run.

use std::path::PathBuf;
use std::time::Instant;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).expect("read an input");
            (path, bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

fn replay(target: &str) {
    let (_, check) = statehub_fuzz_checks::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a known target");
    let inputs = corpus(target);
    assert!(!inputs.is_empty(), "the {target} corpus is empty");
    let start = Instant::now();
    for (path, bytes) in &inputs {
        let outcome = std::panic::catch_unwind(|| check(bytes));
        assert!(outcome.is_ok(), "{target}: {} fails", path.display());
    }
    eprintln!("{target}: {} inputs in {:?}", inputs.len(), start.elapsed());
}

/// One test per target, and the list they cover.
macro_rules! replay_tests {
    ($($target:ident),* $(,)?) => {
        const REPLAYED: &[&str] = &[$(stringify!($target)),*];
        $(
            #[test]
            fn $target() {
                replay(stringify!($target));
            }
        )*
    };
}

replay_tests!(
    mqtt_codec,
    resp,
    state_store,
    webpubsub_json,
    webpubsub_protobuf,
    odata_filter,
    jwt,
    storage_recovery,
);

#[test]
fn every_target_is_replayed() {
    let targets: Vec<&str> = statehub_fuzz_checks::TARGETS
        .iter()
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(targets, REPLAYED);
}
