//! Linearizability of the state store: a checker ([`wgl`]), the store's sequential
//! model ([`model`]), clients that record histories against the binary ([`client`]),
//! and the unit tests that show the checker refuses histories that are not
//! linearizable.

pub mod client;
pub mod model;
pub mod wgl;

#[cfg(test)]
mod tests;

use std::time::Duration;

use model::{check_versions, KeyModel, Op, Ret};
use wgl::{check, Operation, Verdict};

/// Checks a history of operations on several keys: each key against the model (time
/// bounded by `budget` each), then the shared clock across keys. Open operations
/// return at `open_until`.
pub fn check_history(
    ops: &[Operation<(usize, Op), Ret>],
    open_until: u64,
    budget: Duration,
) -> Result<(), String> {
    let keys = ops.iter().map(|o| o.op.0).max().map_or(0, |k| k + 1);
    for key in 0..keys {
        let sub: Vec<Operation<Op, Ret>> = ops
            .iter()
            .filter(|o| o.op.0 == key)
            .map(|o| Operation {
                client: o.client,
                call: o.call,
                ret: o.ret,
                op: o.op.1,
            })
            .collect();
        match check(&KeyModel, &sub, open_until, budget) {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable => {
                return Err(format!(
                    "key {key}: not linearizable ({} operations)",
                    sub.len()
                ))
            }
            Verdict::Unknown => return Err(format!("key {key}: the checker ran out of time")),
        }
    }
    check_versions(ops)
}
