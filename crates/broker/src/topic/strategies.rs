//! Random topics and filters for the property tests of the indexes keyed by topic level
//! (the subscription trie, the retained index): few distinct levels, so filters and
//! topics often share a prefix, with the empty level and a `$` level among them.

use proptest::prelude::*;

fn level() -> impl Strategy<Value = String> {
    prop_oneof![Just("a"), Just("b"), Just(""), Just("$s")].prop_map(str::to_owned)
}

/// A filter of 1 to 4 levels, some `+`, maybe ending in `#`.
pub(crate) fn filter() -> impl Strategy<Value = String> {
    let lvl = prop_oneof![3 => level(), 1 => Just("+".to_owned())];
    (prop::collection::vec(lvl, 1..5), any::<bool>()).prop_map(|(mut levels, hash)| {
        if hash {
            levels.push("#".into());
        }
        levels.join("/")
    })
}

/// A topic name of 1 to 5 levels.
pub(crate) fn topic_name() -> impl Strategy<Value = String> {
    prop::collection::vec(level(), 1..6).prop_map(|l| l.join("/"))
}
