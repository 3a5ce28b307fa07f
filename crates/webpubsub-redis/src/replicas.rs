//! The writer's `WAIT` (`Options::wait`): a pipeline, or a claim, ended with it, and
//! how many replicas acknowledged what it wrote.

use redis::Connection;
use statehub_redis_common::Wait;

use crate::WpsRedisError;

/// Runs `pipe`, ended with `WAIT` if `wait` is given: the replies of its commands
/// not ignored, in order, and how many replicas acknowledged it.
pub(crate) fn query_waiting(
    con: &mut Connection,
    pipe: &mut redis::Pipeline,
    wait: Option<Wait>,
) -> Result<(Vec<redis::Value>, Option<u32>), WpsRedisError> {
    let Some(wait) = wait else {
        return Ok((pipe.query(con)?, None));
    };
    wait.add_to(pipe);
    let mut replies: Vec<redis::Value> = pipe.query(con)?;
    let acked = match replies.pop() {
        Some(redis::Value::Int(n)) => u32::try_from(n).ok(),
        _ => None,
    };
    let acked = acked.ok_or(WpsRedisError::Corrupt("WAIT reply"))?;
    Ok((replies, Some(acked)))
}

/// Runs the claim's `pipe` (its script alone), ended with `WAIT` if `wait` is given.
pub(crate) fn query_claim(
    con: &mut Connection,
    pipe: &mut redis::Pipeline,
    wait: Option<Wait>,
) -> Result<(redis::Value, Option<u32>), WpsRedisError> {
    let Some(wait) = wait else {
        let (reply,): (redis::Value,) = pipe.query(con)?;
        return Ok((reply, None));
    };
    wait.add_to(pipe);
    let (reply, acked): (redis::Value, u32) = pipe.query(con)?;
    Ok((reply, Some(acked)))
}
