//! Read-only pages of a hub for an operator's view: its groups with their sizes and
//! its connections with their groups. Each page is bounded by the caller's limit and
//! sorted by name, whatever the hub holds.

use std::collections::BinaryHeap;

use super::{lock, Hub};

/// A group and how many connections are in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    pub name: String,
    pub members: usize,
}

/// A connection of a hub (live, or a reliable session kept for recovery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSummary {
    pub connection_id: String,
    pub user_id: Option<String>,
    pub subprotocol: Option<String>,
    /// Up to the caller's bound, sorted.
    pub groups: Vec<String>,
}

/// One page of each of a hub's groups and connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubView {
    pub name: String,
    pub connection_count: usize,
    pub group_count: usize,
    pub groups: Vec<GroupSummary>,
    pub connections: Vec<ConnectionSummary>,
}

/// Where the pages of [`Hub::view`] start: after these names (`None`: the first).
#[derive(Debug, Clone, Copy, Default)]
pub struct ViewFrom<'a> {
    pub groups_after: Option<&'a str>,
    pub connections_after: Option<&'a str>,
}

/// The `limit` smallest of `items` that sort after `after`, sorted, keeping at most
/// `limit` at a time.
pub(crate) fn smallest<'a>(
    items: impl Iterator<Item = &'a String>,
    after: Option<&str>,
    limit: usize,
) -> Vec<String> {
    let mut heap: BinaryHeap<&'a String> = BinaryHeap::with_capacity(limit + 1);
    for item in items.filter(|i| after.is_none_or(|a| i.as_str() > a)) {
        if heap.len() < limit {
            heap.push(item);
        } else if heap.peek().is_some_and(|top| item < *top) {
            heap.pop();
            heap.push(item);
        }
    }
    heap.into_sorted_vec().into_iter().cloned().collect()
}

impl Hub {
    /// At most `limit` groups and `limit` connections (each with at most `limit` of
    /// its groups), the first by name after `from`.
    pub(crate) fn view(&self, from: ViewFrom<'_>, limit: usize) -> HubView {
        let (groups, ids, connection_count, group_count) = {
            let hub = lock(&self.state);
            let names = smallest(hub.groups.keys(), from.groups_after, limit);
            let groups: Vec<GroupSummary> = names
                .into_iter()
                .map(|name| GroupSummary {
                    members: hub.groups.get(&name).map_or(0, |m| m.len()),
                    name,
                })
                .collect();
            let ids = smallest(hub.sessions.keys(), from.connections_after, limit);
            let sessions: Vec<_> = ids
                .iter()
                .filter_map(|id| hub.sessions.get(id).cloned())
                .collect();
            (groups, sessions, hub.sessions.len(), hub.groups.len())
        };
        // Session locks only once the hub lock is released (the lock order).
        let connections = ids
            .into_iter()
            .map(|s| {
                let mut groups = s.groups();
                groups.sort_unstable();
                groups.truncate(limit);
                ConnectionSummary {
                    connection_id: s.id().to_owned(),
                    user_id: s.user_id().map(str::to_owned),
                    subprotocol: s.subprotocol().map(str::to_owned),
                    groups,
                }
            })
            .collect();
        HubView {
            name: self.name().to_owned(),
            connection_count,
            group_count,
            groups,
            connections,
        }
    }
}
