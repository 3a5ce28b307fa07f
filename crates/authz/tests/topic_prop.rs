//! Properties checked against brute force: `covers(g, f)` holds exactly when every
//! topic `f` matches, `g` matches too; and a substituted name, whatever it holds, grants
//! nothing outside the place the rule gives it.

use proptest::prelude::*;
use std::collections::BTreeMap;

use statehub_authz::rules::{self, Format};
use statehub_authz::topic::{check_filter, covers, matches};
use statehub_authz::{Policy, Principal};

/// Levels filters are made of; topics also use `z`, a level no filter names, standing
/// for "any other name".
fn filter_level() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["a", "b", "$s", "", "+", "#"])
}

fn filter() -> impl Strategy<Value = String> {
    prop::collection::vec(filter_level(), 1..4)
        .prop_map(|levels| levels.join("/"))
        .prop_filter("valid filter", |f| check_filter(f).is_ok())
}

/// Every topic of up to 5 levels over the names filters use, plus `z` (computed once).
fn topics() -> &'static [String] {
    static ALL: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    ALL.get_or_init(|| all_topics(5))
}

fn all_topics(depth: usize) -> Vec<String> {
    let names = ["a", "b", "$s", "", "z"];
    let mut all: Vec<Vec<&str>> = vec![vec![]];
    let mut out = Vec::new();
    for _ in 0..depth {
        let next: Vec<Vec<&str>> = all
            .iter()
            .flat_map(|t| names.iter().map(move |n| [t.as_slice(), &[*n]].concat()))
            .collect();
        out.extend(next.iter().map(|t| t.join("/")));
        all = next;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn covers_is_exactly_inclusion(grant in filter(), filter in filter()) {
        // Filters have at most 3 levels, so 5-level topics show every difference.
        let included = topics()
            .iter()
            .all(|t| !matches(&filter, t) || matches(&grant, t));
        prop_assert_eq!(covers(&grant, &filter), included, "grant {} filter {}", grant, filter);
    }

    #[test]
    fn a_filter_covers_itself(f in filter()) {
        prop_assert!(covers(&f, &f));
    }
}

/// A rule sandboxing each user under its name, in topics and keys.
fn sandbox() -> &'static Policy {
    static POLICY: std::sync::OnceLock<Policy> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        let text = "
- principals: {clientIds: ['*']}
  brokerResources:
    - {method: Publish, topics: ['users/{principal.username}/out']}
    - {method: Subscribe, topics: ['users/{principal.username}/#']}
  stateStoreResources:
    - {method: ReadWrite, keys: ['users/{principal.username}/*']}
";
        Policy::compile(&rules::parse(text, Format::Yaml).unwrap()).unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn a_username_stays_in_its_sandbox(
        name in "[a-b+#/*?\\[\\]!$-]{0,4}",
        other in "[a-b+#/*?\\[\\]!$-]{0,4}",
        rest in "[a-b/*+#]{0,3}",
    ) {
        let attributes = BTreeMap::new();
        let access = sandbox().access(&Principal {
            client_id: "c",
            username: Some(&name),
            attributes: &attributes,
        });
        let filter = format!("users/{other}/{rest}");
        if check_filter(&filter).is_ok() && access.may_subscribe(&filter) {
            // Whatever it names, the filter stays under the user's own level.
            prop_assert!(!name.contains(['/', '+', '#']));
            prop_assert!(filter.split('/').nth(1) == Some(name.as_str()), "{} may subscribe to {}", name, filter);
        }
        let topic = format!("users/{other}/out");
        if access.may_publish(&topic) {
            prop_assert!(topic == format!("users/{name}/out"), "{} may publish on {}", name, topic);
        }
        let key = format!("users/{other}/{rest}");
        if access.may_read(key.as_bytes()) {
            prop_assert!(key.starts_with(&format!("users/{name}/")), "{} may read {}", name, key);
        }
    }
}
