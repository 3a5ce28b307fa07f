//! A read-only copy of a session for the admin view, taken under its lock.

use std::sync::Arc;

use super::{PeerInfo, Session};

/// What the admin view shows of one session. Subscriptions are cut at the caller's
/// bound; `subscription_count` tells how many there are in all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSnapshot {
    pub client_id: String,
    pub connected: bool,
    /// The last connection's address and protocol (`None` for a session restored from
    /// a data directory and not yet resumed).
    pub peer: Option<PeerInfo>,
    /// Session Expiry Interval in seconds (`u32::MAX`: never).
    pub expiry_interval: u32,
    pub persistent: bool,
    /// Up to the caller's bound: (filter, maximum QoS), sorted by filter.
    pub subscriptions: Vec<(String, u8)>,
    pub subscription_count: usize,
    /// Messages queued and in flight.
    pub queued: usize,
    pub inflight: usize,
}

impl Session {
    /// Records where the connection `generation` came from, if it still owns the
    /// session.
    pub(crate) fn set_peer(&self, generation: u64, peer: PeerInfo) {
        let mut st = self.state.lock();
        if st.last_generation == generation {
            st.peer = Some(peer);
        }
    }

    /// A copy for the admin view, with at most `max_subscriptions` of its filters.
    pub(crate) fn snapshot(self: &Arc<Self>, max_subscriptions: usize) -> SessionSnapshot {
        let st = self.state.lock();
        let mut subscriptions: Vec<(String, u8)> = st
            .subscriptions
            .iter()
            .map(|(f, s)| (f.to_string(), s.options.qos as u8))
            .collect();
        subscriptions.sort_unstable();
        subscriptions.truncate(max_subscriptions);
        SessionSnapshot {
            client_id: self.client_id.to_string(),
            connected: self.is_connected(),
            peer: st.peer,
            expiry_interval: st.expiry_interval,
            persistent: st.persist.is_some(),
            subscriptions,
            subscription_count: st.subscriptions.len(),
            queued: st.queue.len(),
            inflight: st.inflight.len(),
        }
    }
}
