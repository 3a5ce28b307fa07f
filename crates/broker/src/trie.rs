//! The subscription index: a trie over topic levels.
//!
//! Publishing walks the trie under a read lock (readers never wait for each other);
//! only SUBSCRIBE/UNSUBSCRIBE and session ends take the write lock. Each leaf holds
//! the plain subscriptions by client id and the shared-subscription groups by name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;
use statehub_mqtt_codec::{ByteString, SubscriptionOptions};

use crate::session::Session;
use crate::topic;

/// One client's subscription as stored in the index.
#[derive(Debug, Clone)]
pub struct SubEntry {
    pub session: Arc<Session>,
    pub options: SubscriptionOptions,
    pub identifier: Option<u32>,
}

/// A `$share/{group}/{filter}` group: one member gets each message.
#[derive(Debug)]
pub struct SharedGroup {
    /// The group name and the filter it shares: together they name the group.
    pub name: Box<str>,
    pub filter: Box<str>,
    pub members: Vec<SubEntry>,
    next: AtomicUsize,
}

impl SharedGroup {
    /// Round-robin pick, preferring members whose client is connected and not `except`.
    pub fn pick(&self, except: Option<&str>) -> Option<&SubEntry> {
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let eligible = |e: &&SubEntry| except != Some(e.session.client_id());
        let online = (0..n)
            .map(|i| &self.members[(start + i) % n])
            .filter(eligible)
            .find(|e| e.session.is_connected());
        online.or_else(|| {
            (0..n)
                .map(|i| &self.members[(start + i) % n])
                .find(eligible)
        })
    }
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    /// Whether `children` holds a `+` / a `#` level. Most nodes have neither (a response
    /// topic like `clients/{id}/...` walks eight of them), and a flag is cheaper than
    /// hashing `+` and `#` at every level of every publish.
    has_plus: bool,
    has_hash: bool,
    plain: HashMap<ByteString, SubEntry>,
    shared: HashMap<Box<str>, SharedGroup>,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.plain.is_empty() && self.shared.is_empty()
    }

    /// Clears a wildcard flag once its child `level` is gone.
    fn removed_child(&mut self, level: &str) {
        match level {
            "+" => self.has_plus = false,
            "#" => self.has_hash = false,
            _ => {}
        }
    }
}

/// What a topic matched: plain subscriptions and shared groups.
#[derive(Debug, Default)]
pub struct Matches<'a> {
    /// Inline for the usual few (a response topic has one subscriber): no allocation per
    /// publish.
    pub plain: SmallVec<[(&'a str, &'a SubEntry); 4]>,
    pub shared: SmallVec<[&'a SharedGroup; 2]>,
}

/// The index itself. Not synchronized: the router wraps it in a lock.
///
/// Filters without wildcards (most of them: a requester's response topic, a device's
/// own topic) are not in the trie but in `exact`, keyed by the whole filter: such a
/// filter matches one topic only, so a publish finds them with one hash of its topic
/// instead of one per level, and the trie holds only wildcard filters (often none, and
/// then the walk stops at the root).
#[derive(Debug, Default)]
pub struct SubscriptionTrie {
    root: Node,
    exact: HashMap<Box<str>, Node>,
    count: usize,
}

impl SubscriptionTrie {
    /// Adds or replaces a subscription; returns true if one existed already.
    pub fn insert(&mut self, filter: &str, group: Option<&str>, entry: SubEntry) -> bool {
        let node = if topic::has_wildcard(filter) {
            let mut node = &mut self.root;
            for level in filter.split('/') {
                match level {
                    "+" => node.has_plus = true,
                    "#" => node.has_hash = true,
                    _ => {}
                }
                node = node.children.entry(level.into()).or_default();
            }
            node
        } else {
            self.exact.entry(filter.into()).or_default()
        };
        let client: ByteString = entry.session.client_id().into();
        let existed = match group {
            None => node.plain.insert(client, entry).is_some(),
            Some(g) => {
                let grp = node.shared.entry(g.into()).or_insert_with(|| SharedGroup {
                    name: g.into(),
                    filter: filter.into(),
                    members: Vec::new(),
                    next: AtomicUsize::new(0),
                });
                match grp
                    .members
                    .iter_mut()
                    .find(|m| m.session.client_id() == &*client)
                {
                    Some(m) => {
                        *m = entry;
                        true
                    }
                    None => {
                        grp.members.push(entry);
                        false
                    }
                }
            }
        };
        if !existed {
            self.count += 1;
        }
        existed
    }

    /// Removes a client's subscription; returns true if it existed.
    pub fn remove(&mut self, filter: &str, group: Option<&str>, client_id: &str) -> bool {
        let removed = if topic::has_wildcard(filter) {
            let levels: Vec<&str> = filter.split('/').collect();
            remove_at(&mut self.root, &levels, group, client_id)
        } else {
            let Some(node) = self.exact.get_mut(filter) else {
                return false;
            };
            let removed = remove_at(node, &[], group, client_id);
            if node.is_empty() {
                self.exact.remove(filter);
            }
            removed
        };
        if removed {
            self.count -= 1;
        }
        removed
    }

    /// Number of subscriptions (a shared group member counts as one).
    pub fn len(&self) -> usize {
        self.count
    }

    /// The shared group `name` on `filter`, if it has members.
    pub fn shared_group(&self, filter: &str, name: &str) -> Option<&SharedGroup> {
        if !topic::has_wildcard(filter) {
            return self.exact.get(filter)?.shared.get(name);
        }
        let mut node = &self.root;
        for level in filter.split('/') {
            node = node.children.get(level)?;
        }
        node.shared.get(name)
    }

    /// Everything that matches `topic`.
    pub fn matches<'a>(&'a self, topic: &str) -> Matches<'a> {
        let mut out = Matches::default();
        let walk = Walk {
            exact: self.exact.get(topic),
            dollar: topic.starts_with('$'),
        };
        collect(&self.root, Some(topic), true, true, &walk, &mut out);
        out
    }
}

fn remove_at(node: &mut Node, levels: &[&str], group: Option<&str>, client_id: &str) -> bool {
    let Some((first, rest)) = levels.split_first() else {
        return match group {
            None => node.plain.remove(client_id).is_some(),
            Some(g) => {
                let Some(grp) = node.shared.get_mut(g) else {
                    return false;
                };
                let before = grp.members.len();
                grp.members.retain(|m| m.session.client_id() != client_id);
                let removed = grp.members.len() != before;
                if grp.members.is_empty() {
                    node.shared.remove(g);
                }
                removed
            }
        };
    };
    let Some(child) = node.children.get_mut(*first) else {
        return false;
    };
    let removed = remove_at(child, rest, group, client_id);
    if child.is_empty() {
        node.children.remove(*first);
        node.removed_child(first);
    }
    removed
}

/// What stays the same during one topic's walk.
struct Walk<'a> {
    /// The subscriptions whose filter is exactly the topic.
    exact: Option<&'a Node>,
    /// The topic starts with `$` (wildcards at its first level do not match it).
    dollar: bool,
}

/// Matches the levels of `rest` (`None` once every level is consumed; levels are split
/// off as the walk goes, no vector of them) below `node`; `first` is the topic's first
/// level, `literal` whether the path so far took no wildcard. The exact subscriptions
/// come where the literal path ends (after the `#` filters along it, before any `+`
/// branch), the order the single trie of before gave them.
fn collect<'a>(
    node: &'a Node,
    rest: Option<&str>,
    first: bool,
    literal: bool,
    walk: &Walk<'a>,
    out: &mut Matches<'a>,
) {
    let wildcard_ok = !(walk.dollar && first);
    if wildcard_ok && node.has_hash {
        if let Some(hash) = node.children.get("#") {
            push_leaf(hash, out);
        }
    }
    let Some(rest) = rest else {
        push_leaf(node, out);
        if literal {
            walk.exact
                .into_iter()
                .for_each(|exact| push_leaf(exact, out));
        }
        return;
    };
    let (level, next) = match rest.split_once('/') {
        Some((level, next)) => (level, Some(next)),
        None => (rest, None),
    };
    match node.children.get(level) {
        Some(child) => collect(child, next, false, literal, walk, out),
        None if literal => walk
            .exact
            .into_iter()
            .for_each(|exact| push_leaf(exact, out)),
        None => {}
    }
    if wildcard_ok && node.has_plus {
        if let Some(plus) = node.children.get("+") {
            collect(plus, next, false, false, walk, out);
        }
    }
}

fn push_leaf<'a>(node: &'a Node, out: &mut Matches<'a>) {
    out.plain.extend(node.plain.iter().map(|(k, v)| (&**k, v)));
    out.shared.extend(node.shared.values());
}

#[cfg(test)]
mod tests {
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
}
