//! The subscription index: a trie over topic levels.
//!
//! Publishing walks the trie under a read lock (readers never wait for each other);
//! only SUBSCRIBE/UNSUBSCRIBE and session ends take the write lock. Each leaf holds
//! the plain subscriptions by client id and the shared-subscription groups by name.

// Topic levels and client ids are chosen by clients: a hasher seeded per process and per
// map, a few instructions per level where SipHash took a few hundred.
use foldhash::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;
use statehub_mqtt_codec::{ByteString, SubscriptionOptions};

use crate::levels;
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
    /// Round-robin pick among the members not `except`, preferring those whose client is
    /// connected, and among those the ones below their high-water mark (see below).
    pub fn pick(&self, except: Option<&str>) -> Option<&SubEntry> {
        let n = self.members.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let eligible = |e: &&SubEntry| except != Some(e.session.client_id());
        let members = || (0..n).map(|i| &self.members[(start + i) % n]);
        // Connected with room first (one past its high-water mark would hold the
        // publisher back); if every connected one is past it, the one that passed it
        // last: the publisher waits for it, and a member that drains passes the mark
        // again and again while one that stopped reading stays past it; then any.
        let roomy = members()
            .filter(eligible)
            .find(|e| e.session.is_connected() && !e.session.is_pressed());
        let online = || {
            members()
                .filter(eligible)
                .filter(|e| e.session.is_connected())
                .max_by_key(|e| e.session.pressed_since())
        };
        roomy.or_else(online).or_else(|| members().find(eligible))
    }
}

#[derive(Default)]
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

/// Dropped from a stack (see [`levels::drop_subtree`]).
impl Drop for Node {
    fn drop(&mut self) {
        levels::drop_subtree(&mut self.children, |n| &mut n.children);
    }
}

/// Shallow: the derived form would recurse through every level.
impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("children", &self.children.len())
            .field("plain", &self.plain.len())
            .field("shared", &self.shared.len())
            .finish()
    }
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
#[derive(Default)]
pub struct SubscriptionTrie {
    root: Node,
    exact: HashMap<Box<str>, Node>,
    count: usize,
}

impl std::fmt::Debug for SubscriptionTrie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionTrie")
            .field("count", &self.count)
            .field("exact", &self.exact.len())
            .finish_non_exhaustive()
    }
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
            remove_wildcard(&mut self.root, filter, group, client_id)
        } else {
            let Some(node) = self.exact.get_mut(filter) else {
                return false;
            };
            let removed = remove_here(node, group, client_id);
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
        let exact = self.exact.get(topic);
        if self.root.children.is_empty() {
            // No wildcard filter anywhere (the root holds no subscription itself): the
            // exact ones are all there is, without splitting the topic into levels.
            if let Some(exact) = exact {
                push_leaf(exact, &mut out);
            }
            return out;
        }
        let walk = Walk {
            exact,
            dollar: topic.starts_with('$'),
        };
        collect(&self.root, topic, &walk, &mut out);
        out
    }
}

/// Removes `client_id`'s subscription from `node`'s own lists; true if it was there.
fn remove_here(node: &mut Node, group: Option<&str>, client_id: &str) -> bool {
    match group {
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
    }
}

/// Removes a subscription below the root, then the nodes left empty on its path. Two
/// walks down instead of a recursion per level: a filter may have tens of thousands.
fn remove_wildcard(root: &mut Node, filter: &str, group: Option<&str>, client_id: &str) -> bool {
    let mut node = &mut *root;
    for level in filter.split('/') {
        let Some(child) = node.children.get_mut(level) else {
            return false;
        };
        node = child;
    }
    if !remove_here(node, group, client_id) {
        return false;
    }
    if !node.is_empty() {
        return true;
    }
    // The shallowest node of the path from which everything below is this one empty
    // chain: cutting it there drops the rest.
    let mut cut = None;
    let mut node = &*root;
    for (depth, level) in filter.split('/').enumerate() {
        let Some(child) = node.children.get(level) else {
            return true;
        };
        let chain = child.plain.is_empty() && child.shared.is_empty() && child.children.len() <= 1;
        match (chain, cut) {
            (true, None) => cut = Some(depth),
            (false, _) => cut = None,
            (true, Some(_)) => {}
        }
        node = child;
    }
    let Some(cut) = cut else { return true };
    let mut node = &mut *root;
    for (depth, level) in filter.split('/').enumerate() {
        if depth == cut {
            node.children.remove(level);
            node.removed_child(level);
            break;
        }
        let Some(child) = node.children.get_mut(level) else {
            break;
        };
        node = child;
    }
    true
}

/// What stays the same during one topic's walk.
struct Walk<'a> {
    /// The subscriptions whose filter is exactly the topic.
    exact: Option<&'a Node>,
    /// The topic starts with `$` (wildcards at its first level do not match it).
    dollar: bool,
}

/// One pending branch of a topic's walk: `node`, the levels of the topic still to
/// match below it (`None` once every level is consumed; split off as the walk goes, no
/// vector of them), whether `node` is the root (the topic's first level is matched
/// below it) and whether the path to it took no wildcard.
#[derive(Clone, Copy)]
struct Branch<'a, 't> {
    node: &'a Node,
    rest: Option<&'t str>,
    first: bool,
    literal: bool,
}

/// Collects every subscription matching the topic, depth first with an explicit stack
/// (a topic may have tens of thousands of levels; a recursion per level overflowed the
/// worker's stack). The order: at each node the `#` filters, then the literal child's
/// whole subtree, then the `+` child's. The exact subscriptions come where the literal
/// path ends (after the `#` filters along it, before any `+` branch).
fn collect<'a>(root: &'a Node, topic: &str, walk: &Walk<'a>, out: &mut Matches<'a>) {
    let mut stack: SmallVec<[Branch<'a, '_>; 8]> = SmallVec::new();
    stack.push(Branch {
        node: root,
        rest: Some(topic),
        first: true,
        literal: true,
    });
    while let Some(b) = stack.pop() {
        let node = b.node;
        let wildcard_ok = !(walk.dollar && b.first);
        if wildcard_ok && node.has_hash {
            if let Some(hash) = node.children.get("#") {
                push_leaf(hash, out);
            }
        }
        let Some(rest) = b.rest else {
            push_leaf(node, out);
            if b.literal {
                walk.exact
                    .into_iter()
                    .for_each(|exact| push_leaf(exact, out));
            }
            continue;
        };
        let (level, next) = match rest.split_once('/') {
            Some((level, next)) => (level, Some(next)),
            None => (rest, None),
        };
        // Pushed first, so taken after the literal child's subtree.
        if wildcard_ok && node.has_plus {
            if let Some(plus) = node.children.get("+") {
                stack.push(Branch {
                    node: plus,
                    rest: next,
                    first: false,
                    literal: false,
                });
            }
        }
        match node.children.get(level) {
            Some(child) => stack.push(Branch {
                node: child,
                rest: next,
                first: false,
                literal: b.literal,
            }),
            None if b.literal => walk
                .exact
                .into_iter()
                .for_each(|exact| push_leaf(exact, out)),
            None => {}
        }
    }
}

fn push_leaf<'a>(node: &'a Node, out: &mut Matches<'a>) {
    out.plain.extend(node.plain.iter().map(|(k, v)| (&**k, v)));
    out.shared.extend(node.shared.values());
}

#[cfg(test)]
mod tests;
