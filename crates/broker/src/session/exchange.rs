//! The session's side of the QoS 1/2 exchanges (incoming QoS 2 receipts, outgoing
//! acknowledgements) and of SUBSCRIBE/UNSUBSCRIBE: each method changes the state and
//! records the change together, and says whether the client's answer must wait for
//! the session store's barrier.

use std::time::Instant;

use statehub_mqtt_codec::ByteString;

use super::{Inflight, Session, Stage, Subscription};
use crate::session_store::SessionChange;

/// Where a QoS 2 PUBLISH from the client stands before it is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncomingQos2 {
    /// Its packet id awaits PUBREL already: a resent duplicate, answered with PUBREC.
    Duplicate,
    /// Receiving it would exceed the Receive Maximum.
    OverMaximum,
    /// A new message.
    New,
}

/// What a PUBREC did to the outgoing message it acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PubRec {
    /// No QoS 2 message awaits a PUBREC under that id: answer 0x92.
    Unknown,
    /// The client refused the message (an error reason code): it is done with.
    Refused,
    /// The message is released (PUBREL to send); `stored`: the release was recorded
    /// and the PUBREL waits for the barrier.
    Released { stored: bool },
}

impl Session {
    /// Whether the QoS 2 PUBLISH with `packet_id` is a duplicate or over `maximum`.
    pub fn incoming_qos2(&self, packet_id: u16, maximum: u16) -> IncomingQos2 {
        let st = self.state.lock();
        if st.incoming_qos2.contains(&packet_id) {
            IncomingQos2::Duplicate
        } else if st.incoming_qos2.len() >= usize::from(maximum) {
            IncomingQos2::OverMaximum
        } else {
            IncomingQos2::New
        }
    }

    /// Remembers a QoS 2 packet id until its PUBREL; true if that was recorded in the
    /// session store (the PUBREC waits for it).
    pub fn receive_qos2(&self, packet_id: u16) -> bool {
        let mut st = self.state.lock();
        st.incoming_qos2.insert(packet_id);
        st.record(|incarnation| SessionChange::IncomingQos2 {
            incarnation,
            packet_id,
            pending: true,
        });
        st.is_persistent()
    }

    /// Forgets a QoS 2 packet id on PUBREL: `None` if it was unknown, else whether the
    /// change was recorded (the PUBCOMP waits for it: a restart must not take the
    /// client's next message with that id for a duplicate).
    pub fn release_qos2(&self, packet_id: u16) -> Option<bool> {
        let mut st = self.state.lock();
        if !st.incoming_qos2.remove(&packet_id) {
            return None;
        }
        st.record(|incarnation| SessionChange::IncomingQos2 {
            incarnation,
            packet_id,
            pending: false,
        });
        Some(st.is_persistent())
    }

    /// Applies a PUBREC received at `now` for an outgoing QoS 2 message (see [`PubRec`]).
    pub fn pubrec(&self, packet_id: u16, accepted: bool, now: Instant) -> PubRec {
        let mut st = self.state.lock();
        let Some(i) = st.inflight_position(packet_id) else {
            return PubRec::Unknown;
        };
        if st.inflight[i].stage != Stage::Qos2Sent {
            return PubRec::Unknown;
        }
        if !accepted {
            if let Some(done) = st.remove_inflight(i) {
                st.forget(done.delivery.seq, &done.delivery.msg);
                self.usage.give(1, done.delivery.msg.weight());
            }
            self.relieve(&mut st);
            return PubRec::Refused;
        }
        st.inflight[i].stage = Stage::Released;
        let seq = st.inflight[i].delivery.seq;
        let stored = seq != 0 && st.is_persistent();
        if stored {
            // After a restart, a message whose PUBREL went out must not be sent again
            // as a PUBLISH: the receiver has forgotten its id and would deliver it twice.
            let delivery = &st.inflight[i].delivery;
            st.record(|incarnation| SessionChange::Message {
                incarnation,
                seq,
                message: delivery.queued(),
                released: true,
                now,
            });
        }
        PubRec::Released { stored }
    }

    /// Finishes an outgoing QoS 1/2 exchange at `stage` (PUBACK, PUBCOMP); unknown ids
    /// are ignored.
    pub fn complete(&self, packet_id: u16, stage: Stage) {
        let mut st = self.state.lock();
        if let Some(i) = st.inflight_position(packet_id) {
            if st.inflight[i].stage == stage {
                if let Some(done) = st.remove_inflight(i) {
                    st.forget(done.delivery.seq, &done.delivery.msg);
                    self.usage.give(1, done.delivery.msg.weight());
                }
                self.relieve(&mut st);
            }
        }
    }

    /// The messages in flight, in send order (to resend on attach).
    pub fn inflight(&self) -> Vec<Inflight> {
        self.state.lock().inflight.iter().cloned().collect()
    }

    /// Adds or replaces subscriptions, holding at most `max`, and records the
    /// session's set once. Returns, for each, whether it replaced one (`None`: not
    /// added, the session holds `max` already), and whether the set was recorded (the
    /// SUBACK waits for it).
    pub fn subscribe(
        &self,
        subscriptions: &[(ByteString, Subscription)],
        max: usize,
    ) -> (Vec<Option<bool>>, bool) {
        let mut st = self.state.lock();
        let existed = subscriptions
            .iter()
            .map(|(filter, sub)| {
                let held = st.subscriptions.contains_key(filter);
                if !held && st.subscriptions.len() >= max {
                    return None;
                }
                Some(st.subscriptions.insert(filter.clone(), *sub).is_some())
            })
            .collect();
        (existed, st.save(&self.client_id, false))
    }

    /// Removes subscriptions and records the session's set once. Returns, for each
    /// filter, whether it was subscribed, and whether the set was recorded (the
    /// UNSUBACK waits for it).
    pub fn unsubscribe(&self, filters: &[ByteString]) -> (Vec<bool>, bool) {
        let mut st = self.state.lock();
        let existed = filters
            .iter()
            .map(|filter| st.subscriptions.remove(filter).is_some())
            .collect();
        (existed, st.save(&self.client_id, false))
    }

    /// The session's subscriptions as they are now.
    pub fn subscriptions(&self) -> Vec<(ByteString, Subscription)> {
        let st = self.state.lock();
        st.subscriptions
            .iter()
            .map(|(f, s)| (f.clone(), *s))
            .collect()
    }
}
