//! Taking back the copies of a message whose publisher was refused, before they
//! reach the client (see [`Broker::withdraw_refused`](crate::Broker)).

use std::sync::Arc;

use super::Session;
use crate::session_store::{Gate, SessionChange};

impl Session {
    /// The message of a copy behind `gate` waiting in the queue that may be taken
    /// back, if any: one that came through a shared group stays (only its group's
    /// pick could give it again).
    pub(crate) fn message_behind(&self, gate: &Arc<Gate>) -> Option<Arc<crate::Message>> {
        let st = self.state.lock();
        let d = st.queue.iter().find(|d| withdrawable(d, gate))?;
        Some(d.msg.clone())
    }

    /// Whether a copy behind `gate` (of any kind) still waits in the queue.
    pub(crate) fn holds_behind(&self, gate: &Arc<Gate>) -> bool {
        let st = self.state.lock();
        st.queue.iter().any(|d| behind(d, gate))
    }

    /// Takes the copies behind `gate` out of the queue, with their stored records if
    /// the session is persistent (which leave no trace that it had them); how many
    /// went.
    pub(crate) fn withdraw(&self, gate: &Arc<Gate>) -> usize {
        let mut st = self.state.lock();
        let before = st.queue.len();
        let mut taken = Vec::new();
        st.queue.retain(|d| {
            let take = withdrawable(d, gate);
            if take {
                taken.push((d.seq, d.msg.clone()));
            }
            !take
        });
        debug_assert_eq!(before, st.queue.len() + taken.len());
        for (seq, msg) in &taken {
            st.queued_bytes = st.queued_bytes.saturating_sub(msg.weight());
            self.usage.give(1, msg.weight());
            if *seq != 0 {
                st.record(|incarnation| SessionChange::MessageWithdrawn {
                    incarnation,
                    seq: *seq,
                    msg,
                });
            }
        }
        self.relieve(&mut st);
        taken.len()
    }
}

fn withdrawable(d: &crate::message::Delivery, gate: &Arc<Gate>) -> bool {
    d.shared.is_none() && behind(d, gate)
}

fn behind(d: &crate::message::Delivery, gate: &Arc<Gate>) -> bool {
    d.gate.as_ref().is_some_and(|g| Arc::ptr_eq(g, gate))
}
