//! Retained messages in Redis: the broker's [`RetainStore`] hook writes each change into
//! the retained hash through the writer, in order with the stream, and the PUBLISH is
//! acknowledged once Redis has it. The other nodes learn of the change from the stream
//! (the message carries its RETAIN flag) and a node that starts loads the hash.

use std::sync::Arc;
use std::time::Instant;

use statehub_broker::{BoxFuture, FabricError, Message, RetainStore, RetainStoreError};
use tokio::sync::oneshot;

use crate::writer::Command;
use crate::{wire, Shared};

/// The retained-message store of a node in a cluster.
#[derive(Debug, Clone)]
pub struct RedisRetain {
    shared: Arc<Shared>,
}

impl RedisRetain {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

fn failed(e: impl std::error::Error + Send + Sync + 'static) -> RetainStoreError {
    RetainStoreError(Arc::new(e))
}

impl RetainStore for RedisRetain {
    fn record(
        &self,
        msg: &Message,
        now: Instant,
    ) -> BoxFuture<'static, Result<(), RetainStoreError>> {
        let value = if msg.payload.is_empty() {
            None
        } else {
            match wire::encode(msg, wire::Now::at(now)) {
                Ok(encoded) => Some(encoded),
                Err(e) => return Box::pin(async move { Err(failed(e)) }),
            }
        };
        let (reply, done) = oneshot::channel();
        let command = Command::Retain {
            topic: msg.topic.to_string(),
            value,
            reply,
        };
        if !self.shared.send(command) {
            return Box::pin(async { Err(failed(FabricError::Full)) });
        }
        Box::pin(async move {
            match done.await {
                Ok(result) => result.map_err(failed),
                Err(_) => Err(failed(FabricError::Unavailable("stopped".into()))),
            }
        })
    }
}
