//! A node's liveness key and its place in the node list `{ns}:wps:nodes`, which the
//! checks read (`ask.rs`: the listed nodes whose key exists are alive).

use std::time::Duration;

use crate::{Names, HEARTBEAT};

/// How often a node removes from `{ns}:wps:nodes` the nodes whose liveness key is gone.
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// Removes from the node list (KEYS[1]) every node whose liveness key (ARGV[1] ..
/// node) does not exist. Atomic, as is a node's `SADD` with its liveness key (one
/// `MULTI`): a node alive is always listed, so a check that asks the listed nodes
/// whose key exists asks the same nodes as before the pruning.
const PRUNE: &str = r"
local gone = 0
for _, n in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('EXISTS', ARGV[1] .. n) == 0 then
    redis.call('SREM', KEYS[1], n)
    gone = gone + 1
  end
end
return gone
";

/// Adds to `pipe` this node's liveness key, refreshed with its listing in one `MULTI`
/// (or, once it is `leaving`, deleted, so no node waits for its answers any more),
/// and, with `prune`, the removal of the listed nodes whose key is gone.
pub(crate) fn add_liveness(
    pipe: &mut redis::Pipeline,
    names: &Names,
    node: &str,
    leaving: bool,
    prune: bool,
) {
    let alive = names.alive(node);
    if leaving {
        pipe.cmd("DEL").arg(alive).ignore();
        return;
    }
    let keep = u64::try_from((HEARTBEAT * 3).as_millis()).unwrap_or(u64::MAX);
    pipe.cmd("MULTI").ignore();
    pipe.cmd("SADD").arg(names.nodes()).arg(node).ignore();
    pipe.cmd("SET")
        .arg(alive)
        .arg(1)
        .arg("PX")
        .arg(keep)
        .ignore();
    pipe.cmd("EXEC").ignore();
    if prune {
        pipe.cmd("EVAL")
            .arg(PRUNE)
            .arg(1)
            .arg(names.nodes())
            .arg(names.alive(""))
            .ignore();
    }
}
