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

#[test]
fn memory_engine_built_from_entries_equals_one_built_by_puts() {
    use bytes::Bytes;
    use statehub_state_store::{Engine, Entry, Hlc};
    let entry = |value: &'static [u8], expires_at_ms| Entry {
        value: statehub_state_store::Value::new(value),
        version: Hlc::new(1, 0, "n"),
        fencing_token: None,
        expires_at_ms,
    };
    let input = vec![
        (Bytes::from_static(b"b"), entry(b"1", Some(50))),
        (Bytes::from_static(b"a"), entry(b"22", None)),
        (Bytes::from_static(b"c"), entry(b"333", Some(10))),
        (Bytes::from_static(b"a"), entry(b"4444", Some(70))),
    ];
    let mut by_puts = MemoryEngine::new();
    for (k, e) in input.clone() {
        by_puts.put(&k, e).unwrap();
    }
    let built = MemoryEngine::from_entries(input);
    assert_eq!(built.stats(), by_puts.stats());
    assert_eq!(
        built.expired(u64::MAX, 10).unwrap(),
        by_puts.expired(u64::MAX, 10).unwrap()
    );
    assert_eq!(built.next_expiry().unwrap(), Some(10));
    assert_eq!(
        built.scan(None, 10).unwrap(),
        by_puts.scan(None, 10).unwrap()
    );
    assert_eq!(built.get(b"a").unwrap(), by_puts.get(b"a").unwrap());
}
