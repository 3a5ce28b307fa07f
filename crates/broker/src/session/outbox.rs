//! The connection's side of the queue: taking deliveries to write (flow control,
//! packet ids, gates, expiry), and handing shared-subscription messages back when the
//! connection ends.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::MutexGuard;
use statehub_mqtt_codec::QoS;

use super::{Inflight, Session, SessionState, Stage, Usage};
use crate::message::{Delivery, Message};
use crate::session_store::packet_id_for;

/// The session's queue, locked for one connection to drain a batch of deliveries.
#[derive(Debug)]
pub(crate) struct Outbox<'a> {
    st: MutexGuard<'a, SessionState>,
    /// Deliveries dropped by [`Outbox::next`] because their message had expired.
    expired: usize,
    session: &'a Session,
    usage: &'a Usage,
}

/// What a drain dropped (expired, discarded) shrank the backlog: a pressed session may
/// be relieved.
impl Drop for Outbox<'_> {
    fn drop(&mut self) {
        self.session.relieve(&mut self.st);
    }
}

impl Session {
    /// The queue for connection `generation` to drain; `None` if the session was taken
    /// over (the queue belongs to the new connection now).
    pub fn outbox(&self, generation: u64) -> Option<Outbox<'_>> {
        let st = self.state.lock();
        let owner = st
            .attached
            .as_ref()
            .is_some_and(|a| a.generation == generation);
        owner.then_some(Outbox {
            st,
            expired: 0,
            session: self,
            usage: &self.usage,
        })
    }

    /// Takes the messages that came through shared subscriptions and were not
    /// acknowledged (QoS 2 ones past their PUBLISH excepted), for another member of
    /// their group. Each stays recorded until [`Session::forget`] says it went.
    pub fn take_shared(&self) -> Vec<Delivery> {
        let mut st = self.state.lock();
        let mut taken = Vec::new();
        let mut ids = std::mem::take(&mut st.inflight_ids);
        st.inflight.retain(|i| {
            let shared = i.delivery.shared.is_some() && i.delivery.qos != QoS::ExactlyOnce;
            if shared {
                taken.push(i.delivery.clone());
                ids.remove(&i.packet_id);
            }
            !shared
        });
        st.inflight_ids = ids;
        let queue = std::mem::take(&mut st.queue);
        for d in queue {
            if d.shared.is_some() {
                taken.push(d);
            } else {
                st.queue.push_back(d);
            }
        }
        st.queued_bytes = st.queue.iter().map(|d| d.msg.weight()).sum();
        // They leave this session; whoever takes them counts them again.
        let bytes = taken.iter().map(|d| d.msg.weight()).sum();
        self.usage.give(taken.len(), bytes);
        self.relieve(&mut st);
        taken
    }

    /// The stored message `seq` went elsewhere: its record goes.
    pub fn forget(&self, seq: u64, msg: &Arc<Message>) {
        self.state.lock().forget(seq, msg);
    }
}

impl Outbox<'_> {
    /// How many deliveries [`Outbox::next`] dropped for an expired message so far.
    pub fn expired(&self) -> usize {
        self.expired
    }

    /// The next delivery to write and its packet id, within the client's Receive
    /// Maximum; expired messages are dropped on the way. `None` when nothing may go
    /// now: the queue is empty, the window is full, the front waits for its gate, or
    /// its stored packet id is still held by an older message (its acknowledgement
    /// wakes the connection again).
    pub fn next(&mut self, receive_maximum: u16, now: Instant) -> Option<(Delivery, Option<u16>)> {
        let st = &mut *self.st;
        loop {
            let front = st.queue.front()?;
            if front.gate.as_ref().is_some_and(|g| !g.is_open()) {
                // Not durable yet: the gate's opener wakes this connection.
                return None;
            }
            if front.qos != QoS::AtMostOnce && st.inflight.len() >= usize::from(receive_maximum) {
                return None;
            }
            let d = st.pop_queue()?;
            if d.msg.is_expired(now) {
                st.forget(d.seq, &d.msg);
                self.usage.give(1, d.msg.weight());
                self.expired += 1;
                continue;
            }
            let packet_id = match (d.qos, d.seq) {
                (QoS::AtMostOnce, _) => None,
                (_, 0) => Some(st.next_packet_id()),
                (_, seq) => {
                    // A stored message keeps the id its sequence number gives it; if an
                    // older message still holds that id, wait for its acknowledgement.
                    let id = packet_id_for(seq);
                    if st.inflight_ids.contains(&id) {
                        st.unpop_queue(d);
                        return None;
                    }
                    Some(id)
                }
            };
            return Some((d, packet_id));
        }
    }

    /// `d` was written under `packet_id`: a QoS 1/2 message waits in flight for its
    /// acknowledgement; a QoS 0 one is done with.
    pub fn sent(&mut self, d: Delivery, packet_id: Option<u16>) {
        let Some(packet_id) = packet_id else {
            self.usage.give(1, d.msg.weight());
            return;
        };
        let stage = if d.qos == QoS::ExactlyOnce {
            Stage::Qos2Sent
        } else {
            Stage::Qos1Sent
        };
        self.st.push_inflight(Inflight {
            packet_id,
            stage,
            delivery: d,
        });
    }

    /// `d` could not be written and never will be (over the client's Maximum Packet
    /// Size, or not encodable): it is done with.
    pub fn discard(&mut self, d: &Delivery) {
        self.st.forget(d.seq, &d.msg);
        self.usage.give(1, d.msg.weight());
    }
}

impl SessionState {
    /// A packet id not used by any in-flight message [MQTT-2.2.1-3]: ids go round in
    /// order, so the next one is free unless the window wrapped onto a message still
    /// unacknowledged (one lookup each).
    fn next_packet_id(&mut self) -> u16 {
        loop {
            self.next_packet_id = self.next_packet_id.wrapping_add(1);
            if self.next_packet_id == 0 {
                continue;
            }
            let id = self.next_packet_id;
            if !self.inflight_ids.contains(&id) {
                return id;
            }
        }
    }

    fn pop_queue(&mut self) -> Option<Delivery> {
        let d = self.queue.pop_front()?;
        self.queued_bytes = self.queued_bytes.saturating_sub(d.msg.weight());
        Some(d)
    }

    /// Puts back a delivery just popped (it could not be sent yet).
    fn unpop_queue(&mut self, d: Delivery) {
        self.queued_bytes += d.msg.weight();
        self.queue.push_front(d);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::Bytes;
    use statehub_mqtt_codec::QoS;

    use super::super::{QueueLimits, Session, Stage};
    use crate::config::QueueFull;
    use crate::message::{Delivery, Message};
    use crate::signal::Signal;

    /// A burst to a client with a Receive Maximum of 65,535: every message in flight at
    /// once, then acknowledged in order. Taking an id and completing one are a lookup
    /// each, not a scan of the window (`BURST` sets the size, for callgrind).
    #[test]
    fn a_wide_window_takes_and_frees_ids_without_scanning_it() {
        let n: usize = std::env::var("BURST").map_or(20_000, |v| v.parse().unwrap());
        let session = Arc::new(Session::new("s".into(), 0));
        session.attach(1, Arc::new(Signal::default()), 0, None);
        let limits = QueueLimits {
            max_messages: 1 << 40,
            max_bytes: 1 << 40,
            high_messages: 1 << 40,
            high_bytes: 1 << 40,
            queue_qos0_offline: false,
            policy: QueueFull::DropOldest,
        };
        let now = Instant::now();
        let msg = Arc::new(Message {
            topic: "t".into(),
            payload: Bytes::from_static(b"x"),
            qos: QoS::AtLeastOnce,
            retain: false,
            properties: Default::default(),
            expires_at: None,
            publisher: None,
            recipient: None,
        });
        for _ in 0..n {
            let d = Delivery::new(msg.clone(), QoS::AtLeastOnce, false, Vec::new());
            session.enqueue(d, &limits, now);
        }
        let mut ids = Vec::with_capacity(n);
        {
            let mut outbox = session.outbox(1).unwrap();
            while let Some((d, id)) = outbox.next(u16::MAX, now) {
                ids.push(id.unwrap());
                outbox.sent(d, id);
            }
        }
        assert_eq!(ids.len(), n);
        for id in ids {
            session.complete(id, Stage::Qos1Sent);
        }
        assert!(session.inflight().is_empty());
    }
}
