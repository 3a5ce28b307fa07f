use super::*;
use crate::topic;
use bytes::Bytes;
use statehub_mqtt_codec::Publish;

fn msg(topic: &str) -> Arc<Message> {
    let p = Publish {
        topic: topic.into(),
        payload: Bytes::from_static(b"x"),
        retain: true,
        ..Default::default()
    };
    Arc::new(Message::from_publish(p, None, Instant::now()))
}

fn topics(index: &RetainedIndex, filter: &str) -> Vec<String> {
    let mut out = Vec::new();
    index.matching(filter, Instant::now(), &mut out);
    let mut t: Vec<String> = out.iter().map(|m| m.topic.to_string()).collect();
    t.sort();
    t
}

#[test]
fn filters_walk_levels_and_respect_dollar_topics() {
    let mut index = RetainedIndex::default();
    for t in ["a", "a/b", "a/b/c", "a/c", "/x", "$sys/x", "b//c"] {
        index.insert(msg(t));
    }
    assert_eq!(index.len(), 7);
    assert_eq!(topics(&index, "a/#"), ["a", "a/b", "a/b/c", "a/c"]);
    assert_eq!(topics(&index, "a/+"), ["a/b", "a/c"]);
    assert_eq!(topics(&index, "+/x"), ["/x"]);
    assert_eq!(
        topics(&index, "#"),
        ["/x", "a", "a/b", "a/b/c", "a/c", "b//c"]
    );
    assert_eq!(topics(&index, "$sys/+"), ["$sys/x"]);
    assert_eq!(topics(&index, "b/+/c"), ["b//c"]);
    assert_eq!(topics(&index, "a/b"), ["a/b"]);
    assert!(index.remove("a/b"));
    assert!(!index.remove("a/b"));
    assert_eq!(topics(&index, "a/#"), ["a", "a/b/c", "a/c"]);
    assert_eq!(index.len(), 6);
}

#[test]
fn removing_prunes_the_nodes_that_lead_nowhere() {
    let mut index = RetainedIndex::default();
    index.insert(msg("a/b/c/d"));
    index.insert(msg("a/x"));
    assert!(index.remove("a/b/c/d"));
    assert!(!index.root.children["a"].children.contains_key("b"));
    assert!(index.remove("a/x"));
    assert!(index.root.is_empty());
    assert!(index.get("a/x").is_none());
}

#[test]
fn topics_of_many_levels_are_walked_and_dropped_without_recursion() {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(|| {
            let deep = |last: &str| format!("{}{last}", "a/".repeat(99_999));
            let mut index = RetainedIndex::default();
            index.insert(msg(&deep("a")));
            index.insert(msg(&deep("b")));
            assert_eq!(topics(&index, "#").len(), 2);
            assert_eq!(topics(&index, &deep("+")).len(), 2);
            assert_eq!(topics(&index, &deep("b")).len(), 1);
            assert!(index.remove(&deep("b")));
            assert_eq!(topics(&index, "a/#").len(), 1);
            drop(index);
        })
        .unwrap()
        .join()
        .unwrap();
}

#[test]
fn a_wildcard_filter_visits_only_the_branch_it_can_match() {
    let mut index = RetainedIndex::default();
    for i in 0..1000 {
        index.insert(msg(&format!("devices/{i}/state")));
    }
    let mut out = Vec::new();
    let visited = index.matching("other/+/state", Instant::now(), &mut out);
    assert!(out.is_empty());
    assert!(visited <= 2, "visited {visited} nodes");
    let visited = index.matching("devices/7/+", Instant::now(), &mut out);
    assert_eq!(out.len(), 1);
    assert!(visited <= 5, "visited {visited} nodes");
}

mod property {
    use super::*;
    use crate::topic::strategies::{filter, topic_name};
    use proptest::prelude::*;

    proptest! {
        /// After any stores and clears, a filter finds exactly the topics
        /// `topic::matches` accepts, and an emptied index holds no node.
        #[test]
        fn matching_agrees_with_the_filter_matcher(
            ops in prop::collection::vec((topic_name(), any::<bool>()), 1..40),
            filters in prop::collection::vec(filter(), 1..10),
        ) {
            let mut index = RetainedIndex::default();
            let mut live = std::collections::BTreeSet::new();
            for (t, add) in &ops {
                if *add {
                    index.insert(msg(t));
                    live.insert(t.clone());
                } else {
                    prop_assert_eq!(index.remove(t), live.remove(t));
                }
            }
            prop_assert_eq!(index.len(), live.len());
            for f in &filters {
                let want: Vec<String> =
                    live.iter().filter(|t| topic::matches(f, t)).cloned().collect();
                prop_assert_eq!(topics(&index, f), want, "filter {}", f);
            }
            for t in &live {
                index.remove(t);
            }
            prop_assert!(index.root.is_empty());
        }
    }
}
