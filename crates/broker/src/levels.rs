//! What the trees keyed by topic level (the subscription trie, the retained index) share.

use std::collections::HashMap;

/// A tree's children by level, with the tree's hasher.
pub(crate) type Children<N, S> = HashMap<Box<str>, N, S>;

/// Drops a node's subtree level by level from a stack on the heap, not by the derived
/// recursion: a chain of tens of thousands of levels would overflow the stack of the
/// thread dropping it. A node's `Drop` calls this with its own children and `of`, the
/// way to its children; each node popped is then dropped with no children left.
pub(crate) fn drop_subtree<N, S>(
    children: &mut Children<N, S>,
    of: fn(&mut N) -> &mut Children<N, S>,
) {
    if children.is_empty() {
        return;
    }
    let mut stack: Vec<N> = children.drain().map(|(_, n)| n).collect();
    while let Some(mut node) = stack.pop() {
        stack.extend(of(&mut node).drain().map(|(_, n)| n));
    }
}
