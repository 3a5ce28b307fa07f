//! The drop-oldest policy: an offline session whose queue is full drops its oldest
//! queued messages to make room for a new one.

use statehub_mqtt_codec::QoS;

use super::{QueueLimits, Session, SessionState};
use crate::message::Delivery;

impl Session {
    /// Makes room for `d` in the offline session whose state is `st` by dropping its
    /// oldest queued messages (their stored records go too): `Some(n)` dropped, with
    /// room for `d` taken in the broker-wide usage, or `None`, with nothing dropped,
    /// if the messages it may drop cannot make enough room. Messages in flight are
    /// never dropped (the client is owed their resending).
    pub(super) fn make_room(
        &self,
        st: &mut SessionState,
        d: &Delivery,
        limits: &QueueLimits,
    ) -> Option<usize> {
        let weight = d.msg.weight();
        let (messages, bytes) = st.counted();
        let mut need = (
            (messages + 1).saturating_sub(limits.max_messages),
            (bytes + weight).saturating_sub(limits.max_bytes),
        );
        // When every session together is full, the dropped messages hand their room
        // over to the new one (at least one message and its weight), so the total
        // never passes its bound.
        let hand_over = !self.usage.try_take(weight);
        if hand_over {
            need = (need.0.max(1), need.1.max(weight));
        }
        let Some(oldest) = st.oldest_to_drop(need) else {
            if !hand_over {
                self.usage.give(1, weight);
            }
            return None;
        };
        if hand_over {
            self.usage.take(weight);
        }
        let freed = st.drop_queued(&oldest);
        self.usage.give(oldest.len(), freed);
        Some(oldest.len())
    }
}

impl SessionState {
    /// Positions in the queue (ascending) of the oldest messages that together free
    /// at least `need` (messages, bytes); `None` if all those that may go would not.
    /// A QoS 2 message resent after a restart (`dup`) may not go: the client may have
    /// received it and hold its packet id until a PUBREL, and would take the next
    /// message under that id for a duplicate.
    fn oldest_to_drop(&self, need: (usize, usize)) -> Option<Vec<usize>> {
        let mut picked = Vec::new();
        let mut freed = 0;
        for (i, d) in self.queue.iter().enumerate() {
            if picked.len() >= need.0 && freed >= need.1 {
                break;
            }
            if d.dup && d.qos == QoS::ExactlyOnce {
                continue;
            }
            picked.push(i);
            freed += d.msg.weight();
        }
        (picked.len() >= need.0 && freed >= need.1).then_some(picked)
    }

    /// Drops the queued messages at `positions` (ascending) and their stored records;
    /// returns the bytes they weighed.
    fn drop_queued(&mut self, positions: &[usize]) -> usize {
        let mut freed = 0;
        // From the back, so the positions still to go stay where they were; near the
        // front, each removal moves only the messages before it.
        for &i in positions.iter().rev() {
            if let Some(d) = self.queue.remove(i) {
                freed += d.msg.weight();
                self.forget(d.seq, &d.msg);
            }
        }
        self.queued_bytes -= freed;
        freed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::Bytes;
    use statehub_mqtt_codec::QoS;

    use super::super::{Enqueued, QueueLimits, Session, SessionState, Usage};
    use crate::config::QueueFull;
    use crate::message::{Delivery, Message};

    /// A delivery weighing `weight` bytes (topic "t" and the payload).
    fn delivery(qos: QoS, weight: usize) -> Delivery {
        let msg = Message {
            topic: "t".into(),
            payload: Bytes::from(vec![b'x'; weight - 1]),
            qos,
            retain: false,
            properties: Default::default(),
            expires_at: None,
            publisher: None,
            recipient: None,
        };
        Delivery::new(Arc::new(msg), qos, false, Vec::new())
    }

    #[test]
    fn the_oldest_go_first_but_never_a_qos2_message_that_may_have_been_sent() {
        let mut st = SessionState::default();
        let mut resent = delivery(QoS::ExactlyOnce, 10);
        resent.dup = true;
        st.push_queue(resent);
        for _ in 0..3 {
            st.push_queue(delivery(QoS::AtLeastOnce, 10));
        }
        assert_eq!(st.oldest_to_drop((1, 0)), Some(vec![1]));
        assert_eq!(st.oldest_to_drop((1, 25)), Some(vec![1, 2, 3]), "bytes too");
        assert_eq!(st.oldest_to_drop((4, 0)), None);
        assert_eq!(st.drop_queued(&[1, 3]), 20);
        assert_eq!(st.queue.len(), 2);
        assert_eq!(st.queued_bytes, 20);
        assert!(st.queue[0].dup);
    }

    #[test]
    fn at_the_broker_wide_bound_the_dropped_hand_their_room_to_the_new_message() {
        let usage = Arc::new(Usage::new(3, 1000));
        let session = Arc::new(Session::with_usage("s".into(), 600, usage.clone()));
        let limits = QueueLimits {
            max_messages: 10,
            max_bytes: 1000,
            high_messages: 10,
            high_bytes: 1000,
            queue_qos0_offline: false,
            policy: QueueFull::DropOldest,
        };
        let now = Instant::now();
        for _ in 0..3 {
            let d = delivery(QoS::AtLeastOnce, 10);
            assert!(matches!(
                session.enqueue(d, &limits, now),
                Enqueued::Queued { .. }
            ));
        }
        let outcome = session.enqueue(delivery(QoS::AtLeastOnce, 10), &limits, now);
        assert!(
            matches!(outcome, Enqueued::EvictedOldest { evicted: 1, .. }),
            "{outcome:?}"
        );
        assert_eq!(usage.get(), (3, 30));
        // A heavier one takes as many as its weight needs, so the total never grows.
        let outcome = session.enqueue(delivery(QoS::AtLeastOnce, 25), &limits, now);
        assert!(
            matches!(outcome, Enqueued::EvictedOldest { evicted: 3, .. }),
            "{outcome:?}"
        );
        assert_eq!(usage.get(), (1, 25));
    }
}
