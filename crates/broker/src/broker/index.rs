//! The subscription index's writes: (un)subscribes and session ends, and telling a
//! cluster's fabric when a shared group's first member on this node arrives or its last
//! leaves.

use std::sync::Arc;

use statehub_mqtt_codec::{ByteString, SubscriptionOptions};

use super::{split_shared, Broker};
use crate::session::Session;
use crate::trie::{SubEntry, SubscriptionTrie};

impl Broker {
    /// Records a subscription in the trie.
    pub(crate) fn index_subscription(
        &self,
        session: &Arc<Session>,
        filter: &str,
        options: SubscriptionOptions,
        identifier: Option<u32>,
    ) -> bool {
        let (group, f) = split_shared(filter);
        let entry = SubEntry {
            session: session.clone(),
            options,
            identifier,
        };
        let mut trie = self.inner.trie.write();
        let existed = trie.insert(f, group, entry);
        if let (Some(g), Some(fabric)) = (group, self.fabric()) {
            let first = trie
                .shared_group(f, g)
                .is_some_and(|m| m.members.len() == 1);
            if first && !existed {
                fabric.shared_group_changed(f, g, true);
            }
        }
        existed
    }

    pub(crate) fn unindex_subscription(&self, client_id: &str, filter: &str) -> bool {
        let mut trie = self.inner.trie.write();
        self.unindex(&mut trie, client_id, filter)
    }

    /// Removes a client's subscriptions to `filters` from the trie (its session ended).
    pub(crate) fn unindex_all(&self, client_id: &str, filters: &[ByteString]) {
        let mut trie = self.inner.trie.write();
        for f in filters {
            self.unindex(&mut trie, client_id, f);
        }
    }

    /// Removes one subscription; the fabric hears when a shared group's last member
    /// here left.
    fn unindex(&self, trie: &mut SubscriptionTrie, client_id: &str, filter: &str) -> bool {
        let (group, f) = split_shared(filter);
        let removed = trie.remove(f, group, client_id);
        if let (true, Some(g), Some(fabric)) = (removed, group, self.fabric()) {
            if trie.shared_group(f, g).is_none() {
                fabric.shared_group_changed(f, g, false);
            }
        }
        removed
    }
}
