//! Whether this node still holds a mirrored session
//! ([`statehub_webpubsub::Cluster::still_held`]): asked through the writer, so after
//! every write queued before, as a read of the session's epoch in the writer's
//! pipeline, compared with the epoch this node holds it at. A claim elsewhere raised
//! it (the same fence every session write checks); the writer then hands the session
//! over here before it answers.

use std::sync::atomic::Ordering;
use std::sync::mpsc::TrySendError;

use redis::Value;
use statehub_webpubsub::Taken;
use tokio::sync::oneshot;

use crate::{Job, RedisCluster};

/// A question for the writer: does this node still hold session `id` of `hub`?
#[derive(Debug)]
pub(crate) struct HeldCheck {
    pub(crate) hub: String,
    pub(crate) id: String,
    /// The epoch this node holds it at, when the writer reads it (`None`: the writer
    /// mirrors no such session, and nothing is asked of Redis).
    pub(crate) epoch: Option<u64>,
    pub(crate) fate: Option<oneshot::Sender<bool>>,
}

impl HeldCheck {
    /// Adds the read of the session's epoch to `pipe`, if there is one to compare with
    /// (its reply is not ignored).
    pub(crate) fn add(&self, pipe: &mut redis::Pipeline, hash: &str) {
        if self.epoch.is_some() {
            pipe.cmd("HGET").arg(hash).arg("ep");
        }
    }

    /// Whether `reply` (the epoch read by [`HeldCheck::add`]) is still this node's.
    pub(crate) fn held(&self, reply: &Value) -> bool {
        let Some(epoch) = self.epoch else {
            return true;
        };
        match reply {
            Value::BulkString(b) => b.as_slice() == epoch.to_string().as_bytes(),
            // An integer reply where a string is expected: compared all the same.
            Value::Int(n) => u64::try_from(*n).is_ok_and(|n| n == epoch),
            // No copy any more: no session write of this node would be taken either.
            _ => false,
        }
    }

    /// Answers whoever waits.
    pub(crate) fn answer(&mut self, held: bool) {
        if let Some(fate) = self.fate.take() {
            let _ = fate.send(held);
        }
    }
}

impl RedisCluster {
    /// Queues the question for the writer. While Redis is out of reach (the writer's
    /// last attempt failed), or if the writer does not answer within 3 x `timeout_ms`,
    /// or its queue is full, the answer is "held": upstream events go on as they do
    /// without a cluster (a claim needs Redis too; only a node cut off from a Redis
    /// that others reach could post one twice). A writer gone (shutting down) answers
    /// "not held": the session's next node posts the event once the client sends it
    /// again.
    pub(crate) fn check_held(&self, hub: &str, id: &str) -> Taken {
        if !self.shared.up.load(Ordering::Relaxed) {
            return Box::pin(std::future::ready(true));
        }
        let (fate, answer) = oneshot::channel();
        let check = HeldCheck {
            hub: hub.to_owned(),
            id: id.to_owned(),
            epoch: None,
            fate: Some(fate),
        };
        match self.jobs.try_send(Job::Held(Box::new(check))) {
            Ok(()) => {
                let bound = self.timeout * 3;
                Box::pin(async move {
                    match tokio::time::timeout(bound, answer).await {
                        Ok(answer) => answer.unwrap_or(false),
                        Err(_) => true,
                    }
                })
            }
            Err(TrySendError::Full(_)) => Box::pin(std::future::ready(true)),
            Err(TrySendError::Disconnected(_)) => Box::pin(std::future::ready(false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::HeldCheck;

    fn check(epoch: Option<u64>) -> HeldCheck {
        HeldCheck {
            hub: "h".into(),
            id: "c".into(),
            epoch,
            fate: None,
        }
    }

    #[test]
    fn held_while_the_stored_epoch_is_this_nodes() {
        assert!(check(Some(3)).held(&Value::BulkString(b"3".to_vec())));
        assert!(
            !check(Some(3)).held(&Value::BulkString(b"4".to_vec())),
            "claimed"
        );
        assert!(!check(Some(3)).held(&Value::Nil), "the copy is gone");
        assert!(check(None).held(&Value::Nil), "not mirrored by this writer");
    }
}
