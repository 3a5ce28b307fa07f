//! What an operator's view needs from the broker: pages of sessions (read-only
//! copies) and taps, bounded copies of the messages routed on a topic filter.
//!
//! A tap is not a session: it takes no part in QoS, queues or retained messages, and
//! a tap that cannot keep up is cut off (its receiver is told once), never waited on.
//! While no tap exists, routing pays one relaxed atomic load for them.

use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use statehub_mqtt_codec::validate;
use tokio::sync::mpsc;

use crate::message::Message;
use crate::ratelimit::LogLimit;
use crate::session::SessionSnapshot;
use crate::topic;
use crate::Broker;

/// One page of sessions, sorted by client id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPage {
    pub sessions: Vec<SessionSnapshot>,
    /// Whether sessions sort after the last one of this page.
    pub more: bool,
}

/// The taps of a broker (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Taps {
    count: AtomicUsize,
    list: RwLock<Vec<TapEntry>>,
    /// Taps cut off because their receiver fell behind.
    dropped: AtomicU64,
}

/// A tap as the broker holds it: its sender lives only here, so removing the entry
/// ends the receiver's stream.
#[derive(Debug)]
struct TapEntry {
    shared: Arc<TapShared>,
    tx: mpsc::Sender<Arc<Message>>,
}

#[derive(Debug)]
struct TapShared {
    filter: String,
    /// Set when a message found the channel full: the tap is cut off.
    overflowed: AtomicBool,
}

/// Why a tap cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TapError {
    #[error("invalid topic filter")]
    InvalidFilter,
}

/// What a tap's receiver gets.
#[derive(Debug, Clone)]
pub enum Tapped {
    Message(Arc<Message>),
    /// More than the tap's capacity arrived before the receiver read them; the tap
    /// is closed and nothing more comes.
    Overflowed,
}

/// Copies of the messages routed on a filter, until dropped.
#[derive(Debug)]
pub struct Tap {
    broker: Broker,
    shared: Arc<TapShared>,
    rx: mpsc::Receiver<Arc<Message>>,
    done: bool,
}

impl Tap {
    /// The next message, in routing order; `Overflowed` once (then `None`) if the
    /// receiver fell `capacity` messages behind.
    pub async fn recv(&mut self) -> Option<Tapped> {
        if self.done {
            return None;
        }
        self.rx
            .recv()
            .await
            .map(Tapped::Message)
            .or_else(|| self.overflow())
    }

    fn overflow(&mut self) -> Option<Tapped> {
        self.done = true;
        self.shared
            .overflowed
            .load(Ordering::Acquire)
            .then_some(Tapped::Overflowed)
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.broker.inner_taps().remove(&self.shared);
    }
}

impl Taps {
    /// How many taps are open.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.list.read().len()
    }

    fn remove(&self, tap: &Arc<TapShared>) {
        let mut list = self.list.write();
        list.retain(|t| !Arc::ptr_eq(&t.shared, tap));
        self.count.store(list.len(), Ordering::Relaxed);
    }

    /// Offers `msg` to every tap whose filter matches its topic.
    pub(crate) fn feed(&self, msg: &Arc<Message>) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut cut = Vec::new();
        for tap in self.list.read().iter() {
            if !topic::matches(&tap.shared.filter, &msg.topic) {
                continue;
            }
            if tap.tx.try_send(msg.clone()).is_err() {
                tap.shared.overflowed.store(true, Ordering::Release);
                cut.push(tap.shared.clone());
            }
        }
        for tap in cut {
            // Dropping its sender (by removing it) ends the receiver's stream once it
            // has read what was queued.
            self.remove(&tap);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            static LOG: LogLimit = LogLimit::per_secs(10);
            if let Some(left_out) = LOG.allow() {
                tracing::info!(
                    filter = tap.filter,
                    left_out,
                    "tap dropped: its reader fell behind (an admin topic tail or watch)"
                );
            }
        }
    }
}

impl Broker {
    /// Copies of every message routed from now on whose topic matches `filter` (a
    /// valid MQTT topic filter; `$share/` is not special here), at most `capacity`
    /// waiting to be read. Messages the state store answers or notifies through
    /// [`Broker::deliver_to`] are not routed and not seen.
    pub fn tap(&self, filter: &str, capacity: usize) -> Result<Tap, TapError> {
        validate::topic_filter(filter).map_err(|_| TapError::InvalidFilter)?;
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let shared = Arc::new(TapShared {
            filter: filter.to_owned(),
            overflowed: AtomicBool::new(false),
        });
        let taps = self.inner_taps();
        let mut list = taps.list.write();
        list.push(TapEntry {
            shared: shared.clone(),
            tx,
        });
        taps.count.store(list.len(), Ordering::Relaxed);
        drop(list);
        Ok(Tap {
            broker: self.clone(),
            shared,
            rx,
            done: false,
        })
    }

    /// Up to `limit` sessions whose client ids sort after `after` (all if `None`),
    /// sorted, each with at most `max_subscriptions` of its filters. Memory is bounded
    /// by `limit`, whatever the number of sessions.
    pub fn sessions_page(
        &self,
        after: Option<&str>,
        limit: usize,
        max_subscriptions: usize,
    ) -> SessionPage {
        // The `limit + 1` smallest ids after `after`, in a max-heap.
        let mut smallest: BinaryHeap<String> = BinaryHeap::with_capacity(limit + 1);
        self.sessions().for_each(|s| {
            let id = s.client_id();
            if after.is_some_and(|a| id <= a) {
                return;
            }
            if smallest.len() <= limit {
                smallest.push(id.to_owned());
            } else if smallest.peek().is_some_and(|top| id < top.as_str()) {
                smallest.pop();
                smallest.push(id.to_owned());
            }
        });
        let mut ids = smallest.into_sorted_vec();
        let more = ids.len() > limit;
        ids.truncate(limit);
        let sessions = ids
            .iter()
            .filter_map(|id| self.sessions().get(id))
            .map(|s| s.snapshot(max_subscriptions))
            .collect();
        SessionPage { sessions, more }
    }

    /// Taps cut off so far because their reader fell behind.
    pub fn taps_dropped(&self) -> u64 {
        self.inner_taps().dropped.load(Ordering::Relaxed)
    }

    /// The built-in service that takes PUBLISHes on `topic`, if any (the admin view
    /// calls the state store through it).
    pub fn service_for_topic(&self, topic: &str) -> Option<Arc<dyn crate::Service>> {
        self.service_for(topic)
    }

    /// The copy of one session, if it exists.
    pub fn session_snapshot(
        &self,
        client_id: &str,
        max_subscriptions: usize,
    ) -> Option<SessionSnapshot> {
        self.sessions()
            .get(client_id)
            .map(|s| s.snapshot(max_subscriptions))
    }
}

#[cfg(test)]
#[path = "admin_test.rs"]
mod tests;
