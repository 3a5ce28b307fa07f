//! The bookkeeping of a reliable session, pure and synchronous: the sequenced,
//! unacknowledged messages and the processed `ackId`s. The hub holds one of each per
//! session under the session's lock; nothing here does I/O, so the limits are tested
//! directly.

use std::collections::{HashSet, VecDeque};

use axum::extract::ws::Message;
use tokio::time::Instant;

use crate::outbox::frame_len;

/// The unacknowledged buffer went past a limit: the session must be deleted and the
/// client told with close code 1008.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {max_messages} unacknowledged messages or {max_bytes} bytes")]
pub(crate) struct Overflow {
    /// The message limit.
    pub max_messages: usize,
    /// The byte limit.
    pub max_bytes: usize,
}

/// Sequence ids (from 1) and the frames the client has not acknowledged yet, in order.
/// A frame with a deadline (`messageTtlSeconds`) is not replayed after it; expired
/// frames are pruned when the buffer would otherwise overflow.
#[derive(Debug)]
pub(crate) struct Sequencer {
    next: u64,
    unacked: VecDeque<(u64, Message, Option<Instant>)>,
    bytes: usize,
    max_messages: usize,
    max_bytes: usize,
}

impl Sequencer {
    /// An empty sequencer with its limits.
    pub(crate) fn new(max_messages: usize, max_bytes: usize) -> Self {
        Self {
            next: 1,
            unacked: VecDeque::new(),
            bytes: 0,
            max_messages,
            max_bytes,
        }
    }

    #[cfg(test)]
    /// Gives the next message its sequence id, encodes it with `encode` and keeps the
    /// frame until acknowledged. Past a limit nothing is kept and `Overflow` returned.
    pub(crate) fn push(
        &mut self,
        encode: impl FnOnce(u64) -> Message,
    ) -> Result<Message, Overflow> {
        self.push_until(encode, None)
    }

    /// Same, for a frame not to be replayed after `deadline`.
    pub(crate) fn push_until(
        &mut self,
        encode: impl FnOnce(u64) -> Message,
        deadline: Option<Instant>,
    ) -> Result<Message, Overflow> {
        let id = self.next;
        let frame = encode(id);
        let len = frame_len(&frame);
        if self.full(len) {
            self.prune_expired();
        }
        if self.full(len) {
            return Err(Overflow {
                max_messages: self.max_messages,
                max_bytes: self.max_bytes,
            });
        }
        self.next += 1;
        self.bytes += len;
        self.unacked.push_back((id, frame.clone(), deadline));
        Ok(frame)
    }

    fn full(&self, len: usize) -> bool {
        self.unacked.len() >= self.max_messages || self.bytes + len > self.max_bytes
    }

    fn prune_expired(&mut self) {
        let now = Instant::now();
        let bytes = &mut self.bytes;
        self.unacked.retain(|(_, frame, deadline)| {
            let keep = deadline.is_none_or(|d| now < d);
            if !keep {
                *bytes -= frame_len(frame);
            }
            keep
        });
    }

    /// The client has every message up to `sequence_id`: forget them.
    pub(crate) fn ack(&mut self, sequence_id: u64) {
        while let Some((id, frame, _)) = self.unacked.front() {
            if *id > sequence_id {
                break;
            }
            self.bytes -= frame_len(frame);
            self.unacked.pop_front();
        }
    }

    /// The unacknowledged frames still within their deadline, oldest first, for replay
    /// after a recovery.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &Message> {
        let now = Instant::now();
        self.unacked
            .iter()
            .filter(move |(_, _, d)| d.is_none_or(|d| now < d))
            .map(|(_, f, _)| f)
    }

    #[cfg(test)]
    /// How many messages wait for an ack.
    pub(crate) fn len(&self) -> usize {
        self.unacked.len()
    }

    #[cfg(test)]
    /// Whether nothing waits for an ack.
    pub(crate) fn is_empty(&self) -> bool {
        self.unacked.is_empty()
    }
}

/// The last `capacity` processed `ackId`s, so a resent message is answered `Duplicate`.
#[derive(Debug)]
pub(crate) struct ProcessedAcks {
    order: VecDeque<u64>,
    set: HashSet<u64>,
    capacity: usize,
}

impl ProcessedAcks {
    /// Remembers at most `capacity` ids.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            order: VecDeque::new(),
            set: HashSet::new(),
            capacity,
        }
    }

    /// Was `ack_id` processed already?
    pub(crate) fn contains(&self, ack_id: u64) -> bool {
        self.set.contains(&ack_id)
    }

    /// Records `ack_id`, forgetting the oldest past the capacity.
    pub(crate) fn insert(&mut self, ack_id: u64) {
        if self.capacity == 0 || !self.set.insert(ack_id) {
            return;
        }
        self.order.push_back(ack_id);
        if self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(s: &Sequencer) -> Vec<String> {
        s.pending()
            .map(|f| f.to_text().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn ids_start_at_one_and_acks_trim() {
        let mut s = Sequencer::new(10, 1000);
        for _ in 0..4 {
            s.push(|id| Message::from(format!("m{id}"))).unwrap();
        }
        assert_eq!(frames(&s), ["m1", "m2", "m3", "m4"]);
        s.ack(2);
        assert_eq!(frames(&s), ["m3", "m4"]);
        s.ack(1);
        assert_eq!(s.len(), 2);
        s.ack(u64::MAX);
        assert!(s.is_empty());
        assert_eq!(s.bytes, 0);
        assert_eq!(
            s.push(|id| Message::from(format!("m{id}")))
                .unwrap()
                .to_text()
                .unwrap(),
            "m5"
        );
    }

    #[test]
    fn count_limit() {
        let mut s = Sequencer::new(2, 1000);
        s.push(|_| Message::from("a")).unwrap();
        s.push(|_| Message::from("b")).unwrap();
        assert_eq!(
            s.push(|_| Message::from("c")),
            Err(Overflow {
                max_messages: 2,
                max_bytes: 1000
            })
        );
        s.ack(1);
        assert_eq!(
            s.push(|id| Message::from(format!("{id}")))
                .unwrap()
                .to_text()
                .unwrap(),
            "3"
        );
    }

    #[test]
    fn byte_limit() {
        let mut s = Sequencer::new(100, 10);
        s.push(|_| Message::from("12345")).unwrap();
        s.push(|_| Message::from("12345")).unwrap();
        assert!(s.push(|_| Message::from("1")).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_frames_are_not_replayed_and_free_room() {
        let mut s = Sequencer::new(2, 1000);
        let soon = Some(Instant::now() + std::time::Duration::from_secs(5));
        s.push_until(|_| Message::from("ttl"), soon).unwrap();
        s.push(|_| Message::from("keep")).unwrap();
        assert_eq!(frames(&s), ["ttl", "keep"]);
        tokio::time::advance(std::time::Duration::from_secs(6)).await;
        assert_eq!(frames(&s), ["keep"]);
        s.push(|_| Message::from("new")).unwrap();
        assert_eq!(frames(&s), ["keep", "new"], "the expired frame made room");
        assert!(s.push(|_| Message::from("x")).is_err());
    }

    #[test]
    fn processed_acks_forget_the_oldest() {
        let mut a = ProcessedAcks::new(3);
        for id in [1, 2, 3, 2] {
            a.insert(id);
        }
        assert!(a.contains(1) && a.contains(2) && a.contains(3));
        a.insert(4);
        assert!(!a.contains(1));
        assert!(a.contains(2) && a.contains(4));
    }
}
