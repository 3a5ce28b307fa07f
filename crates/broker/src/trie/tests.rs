use super::*;

fn entry(session: &Arc<Session>, id: u32) -> SubEntry {
    SubEntry {
        session: session.clone(),
        options: SubscriptionOptions::default(),
        identifier: Some(id),
    }
}

fn ids(trie: &SubscriptionTrie, topic: &str) -> Vec<u32> {
    trie.matches(topic)
        .plain
        .iter()
        .filter_map(|(_, e)| e.identifier)
        .collect()
}

#[test]
fn exact_filters_keep_their_place_among_wildcards() {
    let mut trie = SubscriptionTrie::default();
    let sessions: Vec<Arc<Session>> = (0..5)
        .map(|i| Arc::new(Session::new(format!("c{i}").into(), 0)))
        .collect();
    trie.insert("a/b", None, entry(&sessions[0], 1));
    trie.insert("a/#", None, entry(&sessions[1], 2));
    trie.insert("a/+", None, entry(&sessions[2], 3));
    trie.insert("+/b", None, entry(&sessions[3], 4));
    trie.insert("a/b/#", None, entry(&sessions[4], 5));
    // The order the single trie gave: `#` filters along the literal path, the exact
    // filter where that path ends, then the `+` branches from the deepest up.
    assert_eq!(ids(&trie, "a/b"), [2, 5, 1, 3, 4]);
    assert_eq!(ids(&trie, "a/c"), [2, 3]);
    assert!(trie.remove("a/b/#", None, "c4"));
    assert_eq!(ids(&trie, "a/b"), [2, 1, 3, 4]);
    assert!(trie.remove("a/b", None, "c0"));
    assert!(!trie.remove("a/b", None, "c0"));
    assert_eq!(ids(&trie, "a/b"), [2, 3, 4]);
    assert_eq!(trie.len(), 3);
    // `$` topics: exact filters match them, wildcards at the first level do not.
    trie.insert("$sys/x", None, entry(&sessions[0], 6));
    trie.insert("+/x", None, entry(&sessions[1], 7));
    assert_eq!(ids(&trie, "$sys/x"), [6]);
}

#[test]
fn exact_filters_match_alone_once_no_wildcard_is_left() {
    let mut trie = SubscriptionTrie::default();
    let sessions: Vec<Arc<Session>> = (0..3)
        .map(|i| Arc::new(Session::new(format!("c{i}").into(), 0)))
        .collect();
    trie.insert("a/b", None, entry(&sessions[0], 1));
    trie.insert("a/b", Some("g"), entry(&sessions[1], 2));
    trie.insert("a/#", None, entry(&sessions[2], 3));
    assert_eq!(ids(&trie, "a/b"), [3, 1]);
    assert!(trie.remove("a/#", None, "c2"));
    assert!(trie.root.children.is_empty());
    let only = trie.matches("a/b");
    assert_eq!(only.plain.len(), 1);
    assert_eq!(only.plain[0].0, "c0");
    assert_eq!(only.shared.len(), 1);
    assert!(trie.matches("a/c").plain.is_empty());
    assert!(trie.matches("a").shared.is_empty());
}

/// Runs `f` on a thread with a small stack, as a deep recursion would overflow it.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap();
}

fn deep(levels: usize, last: &str) -> String {
    let mut s = "a/".repeat(levels - 1);
    s.push_str(last);
    s
}

#[test]
fn filters_of_many_levels_are_matched_removed_and_dropped_without_recursion() {
    on_small_stack(|| {
        let session = Arc::new(Session::new("deep".into(), 0));
        let mut trie = SubscriptionTrie::default();
        let filter = deep(100_000, "#");
        trie.insert(&filter, None, entry(&session, 1));
        trie.insert(&deep(100_000, "+"), Some("g"), entry(&session, 2));
        trie.insert(&deep(50_000, "a/+/#"), None, entry(&session, 3));
        // The literal path's `#` first, then the `+` branch's.
        assert_eq!(ids(&trie, &deep(100_000, "a")), [1, 3]);
        assert_eq!(trie.matches(&deep(100_000, "x")).shared.len(), 1);
        assert_eq!(ids(&trie, &deep(50_000, "z")), Vec::<u32>::new());
        assert!(trie.remove(&filter, None, "deep"));
        assert_eq!(ids(&trie, &deep(100_000, "a")), [3]);
        assert!(trie.remove(&deep(100_000, "+"), Some("g"), "deep"));
        assert_eq!(trie.len(), 1);
        // Dropped with a 50,000-level chain still in it.
        drop(trie);
    });
}

#[test]
fn removing_the_last_subscription_of_a_path_prunes_it_and_keeps_the_rest() {
    let s = Arc::new(Session::new("c".into(), 0));
    let mut trie = SubscriptionTrie::default();
    trie.insert("a/b/c/#", None, entry(&s, 1));
    trie.insert("a/+", None, entry(&s, 2));
    trie.insert("a/b/+/d", None, entry(&s, 3));
    assert!(trie.remove("a/b/c/#", None, "c"));
    assert!(!trie.remove("a/b/c/#", None, "c"));
    // `a/b` still leads to `+/d`; `c` under it is gone.
    let b = &trie.root.children["a"].children["b"];
    assert!(!b.children.contains_key("c") && b.children.contains_key("+"));
    assert!(trie.remove("a/b/+/d", None, "c"));
    assert!(!trie.root.children["a"].children.contains_key("b"));
    assert!(trie.remove("a/+", None, "c"));
    assert!(trie.root.is_empty());
    assert_eq!(trie.len(), 0);
}

mod property {
    use super::*;
    use crate::topic::strategies::{filter, topic_name};
    use proptest::prelude::*;

    proptest! {
        /// After any inserts and removals, a topic matches exactly the filters
        /// `topic::matches` accepts, and an emptied trie holds no node.
        #[test]
        fn matches_agree_with_the_filter_matcher(
            ops in prop::collection::vec((filter(), any::<bool>()), 1..40),
            topics in prop::collection::vec(topic_name(), 1..10),
        ) {
            let s = Arc::new(Session::new("p".into(), 0));
            let mut trie = SubscriptionTrie::default();
            let mut live = std::collections::BTreeSet::new();
            for (f, add) in &ops {
                if *add {
                    trie.insert(f, None, entry(&s, 0));
                    live.insert(f.clone());
                } else {
                    prop_assert_eq!(trie.remove(f, None, "p"), live.remove(f));
                }
            }
            prop_assert_eq!(trie.len(), live.len());
            for t in &topics {
                let got = trie.matches(t).plain.len();
                let want = live.iter().filter(|f| topic::matches(f, t)).count();
                prop_assert_eq!(got, want, "topic {}", t);
            }
            for f in &live {
                trie.remove(f, None, "p");
            }
            prop_assert!(trie.root.is_empty() && trie.exact.is_empty());
        }
    }
}
