//! Which nodes have members of which shared-subscription groups.
//!
//! Each node keeps its own groups (told by the broker as a group's first member here
//! arrives and its last leaves) and writes them to its field of the groups hash; every
//! node reads the whole hash again when the stream says a node's groups changed. The
//! publisher's node picks, for each group matching a message's topic, one node (round
//! robin over the nodes with members), and only that node delivers it to a member.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use statehub_broker::topic;
use statehub_broker::{SharedPick, SharedPicks};

use crate::wire;

/// (filter, group).
type Key = (Arc<str>, Arc<str>);

#[derive(Debug)]
struct Group {
    nodes: Vec<Arc<str>>,
    next: AtomicUsize,
}

#[derive(Debug)]
pub(crate) struct Groups {
    here: Arc<str>,
    local: Mutex<BTreeSet<Key>>,
    /// Every node's groups (this node's as `local` says); the other nodes' as last read.
    cluster: RwLock<BTreeMap<Key, Group>>,
    others: Mutex<BTreeMap<Arc<str>, Vec<Key>>>,
    /// Other nodes whose liveness key expired: never picked.
    dead: Mutex<BTreeSet<Arc<str>>>,
}

impl Groups {
    pub(crate) fn new(here: Arc<str>) -> Self {
        Self {
            here,
            local: Mutex::default(),
            cluster: RwLock::default(),
            others: Mutex::default(),
            dead: Mutex::default(),
        }
    }

    /// One node per group that matches `topic`.
    pub(crate) fn picks(&self, topic_name: &str) -> SharedPicks {
        let cluster = self.cluster.read();
        if cluster.is_empty() {
            return SharedPicks::default();
        }
        let picks = cluster
            .iter()
            .filter(|((filter, _), g)| !g.nodes.is_empty() && topic::matches(filter, topic_name))
            .map(|((filter, group), g)| {
                let node = g.nodes[g.next.fetch_add(1, Ordering::Relaxed) % g.nodes.len()].clone();
                SharedPick {
                    filter: filter.clone(),
                    group: group.clone(),
                    here: node == self.here,
                    node,
                }
            })
            .collect();
        SharedPicks::new(picks)
    }

    /// This node's first member of a group arrived (`present`) or its last left.
    pub(crate) fn local_changed(&self, filter: &str, group: &str, present: bool) {
        let key: Key = (Arc::from(filter), Arc::from(group));
        let mut local = self.local.lock();
        if present {
            local.insert(key);
        } else {
            local.remove(&key);
        }
        self.rebuild(&local, &self.others.lock());
    }

    /// This node's groups as its field of the hash holds them.
    pub(crate) fn local_encoded(&self) -> Vec<u8> {
        let local = self.local.lock();
        wire::encode_groups(local.iter().map(|(f, g)| (&**f, &**g)))
    }

    /// The hash as read: every node's field.
    pub(crate) fn load(&self, fields: Vec<(String, Vec<u8>)>) {
        let mut others = BTreeMap::new();
        for (node, encoded) in fields {
            if *node == *self.here {
                continue;
            }
            let keys = wire::decode_groups(&encoded)
                .into_iter()
                .map(|(f, g)| (Arc::from(f), Arc::from(g)))
                .collect();
            others.insert(Arc::from(node), keys);
        }
        let local = self.local.lock();
        let mut held = self.others.lock();
        *held = others;
        self.rebuild(&local, &held);
    }

    /// The other nodes with groups (to check which are alive).
    pub(crate) fn other_nodes(&self) -> Vec<Arc<str>> {
        self.others.lock().keys().cloned().collect()
    }

    /// These other nodes are dead (their liveness key expired): they are not picked.
    pub(crate) fn set_dead(&self, dead: BTreeSet<Arc<str>>) {
        let local = self.local.lock();
        let others = self.others.lock();
        let mut held = self.dead.lock();
        if *held == dead {
            return;
        }
        if !dead.is_empty() {
            tracing::warn!(
                ?dead,
                "mqtt cluster: nodes without a heartbeat are no longer picked for shared groups"
            );
        }
        *held = dead;
        drop(held);
        self.rebuild(&local, &others);
    }

    fn rebuild(&self, local: &BTreeSet<Key>, others: &BTreeMap<Arc<str>, Vec<Key>>) {
        let dead = self.dead.lock().clone();
        let mut cluster = self.cluster.write();
        let mut fresh: BTreeMap<Key, Vec<Arc<str>>> = BTreeMap::new();
        for key in local {
            fresh
                .entry(key.clone())
                .or_default()
                .push(self.here.clone());
        }
        for (node, keys) in others.iter().filter(|(n, _)| !dead.contains(*n)) {
            for key in keys {
                fresh.entry(key.clone()).or_default().push(node.clone());
            }
        }
        // Each group keeps its round-robin position across rebuilds.
        let rebuilt = fresh
            .into_iter()
            .map(|(key, nodes)| {
                let next = cluster
                    .get(&key)
                    .map_or(0, |g| g.next.load(Ordering::Relaxed));
                (
                    key,
                    Group {
                        nodes,
                        next: AtomicUsize::new(next),
                    },
                )
            })
            .collect();
        *cluster = rebuilt;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_goes_to_one_node_round_robin_over_the_nodes_with_members() {
        let groups = Groups::new("a".into());
        groups.local_changed("t/+", "g", true);
        groups.load(vec![
            ("b".into(), wire::encode_groups([("t/+", "g")].into_iter())),
            (
                "c".into(),
                wire::encode_groups([("other", "g")].into_iter()),
            ),
        ]);
        let nodes: Vec<_> = (0..4)
            .map(|_| {
                let picks = groups.picks("t/1");
                assert_eq!(picks.picks().len(), 1);
                picks.picks()[0].node.to_string()
            })
            .collect();
        assert_eq!(nodes, ["a", "b", "a", "b"]);
        assert!(groups.picks("x").picks().is_empty());
        groups.local_changed("t/+", "g", false);
        assert_eq!(&*groups.picks("t/1").picks()[0].node, "b");
    }
}
