//! Retained messages beyond the process.
//!
//! The broker keeps retained messages in memory; a [`RetainStore`] (`statehub-broker-durable`'s,
//! on the data directory) is told of every change so it can make it durable, and the
//! broker acknowledges the PUBLISH (PUBACK, PUBREC) only once it is. Without one,
//! nothing changes: the in-memory default pays nothing.

use std::sync::Arc;
use std::time::Instant;

use crate::message::Message;
use crate::service::BoxFuture;

/// Why a retained message could not be made durable.
#[derive(Debug, Clone, thiserror::Error)]
#[error("retained message not stored: {0}")]
pub struct RetainStoreError(pub Arc<dyn std::error::Error + Send + Sync>);

/// Where retained messages are kept.
///
/// Contract:
/// * [`record`](Self::record) is called with the broker's retained-message lock held,
///   once per change, in the order the changes happen; it must not block (queue the
///   write and return). A message with an empty payload means the topic has no
///   retained message any more.
/// * The future it returns resolves once that change, and every change recorded
///   before it, is durable under the store's sync policy, or fails if it never will
///   be (the broker then answers the publisher with an error reason code).
/// * A message's Message Expiry is honoured across restarts: what was stored with
///   `now` as its receipt time and expired by the time it is loaded is not loaded.
pub trait RetainStore: Send + Sync + std::fmt::Debug {
    /// Records `msg` as its topic's retained message (or its removal).
    fn record(
        &self,
        msg: &Message,
        now: Instant,
    ) -> BoxFuture<'static, Result<(), RetainStoreError>>;
}
