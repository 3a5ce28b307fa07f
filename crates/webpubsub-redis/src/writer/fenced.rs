//! What the writer writes for this node's mirrored reliable sessions: each change
//! (a run of frames, a trim, groups, permissions, ackIds, the upstream's state), a
//! client stream's fragment or a `sendToGroup` with its `ackId` handed over with its
//! operation as one script call, every one fenced by the epoch this node holds the
//! session at (`Writer::epochs`, raised by a claim elsewhere); the answers to the fenced
//! calls and to the checks that a session is still this node's (`held.rs`; a session
//! claimed by another node is handed over at once), the reader's
//! recorded position, the sessions marked lost and their expiry's refresh. The
//! scripts themselves are in `session.rs` and `streams.rs`; the pipeline, its
//! replicas and its progress in `writer.rs`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use statehub_webpubsub::SessionWrite;

use super::{Pending, Writer};
use crate::lock;
use crate::session::{add_frames, add_lost, add_write};
use crate::streams::{add_fragment, Attached, OpEntry};

impl Writer {
    /// Counts the mirrored session changes of a batch Redis took.
    pub(super) fn count_mirrored(&self, batch: &[Pending]) {
        let (mut frames, mut changes) = (0, 0);
        for job in batch {
            match job {
                Pending::Session(_, _, SessionWrite::Frame { .. }, _) => frames += 1,
                Pending::Session(..) | Pending::Op(_, _, Some(_)) => changes += 1,
                _ => {}
            }
        }
        let counters = &self.shared.counters;
        counters
            .mirrored_frames
            .fetch_add(frames, Ordering::Relaxed);
        counters
            .mirrored_changes
            .fetch_add(changes, Ordering::Relaxed);
    }

    /// A client stream's fragment and its publisher's stream state (or a client's send
    /// and its `ackId`), in one call, both fenced like [`Writer::session`].
    pub(super) fn fragment(
        &self,
        pipe: &mut redis::Pipeline,
        (seq, op): (u64, &[u8]),
        a: &Attached,
    ) {
        let key = (a.hub.clone(), a.id.clone());
        let epoch = self.epochs.get(&key).copied().unwrap_or(0);
        let keys = self.names.session(&a.hub, &a.id);
        let entry = OpEntry {
            ops: &self.names.ops,
            stream_len: self.stream_len,
            node: &self.node,
            incarnation: self.shared.incarnation,
            seq,
            op,
        };
        let ttl = self.ttl_ms();
        add_fragment(pipe, &self.scripts, &keys, (epoch, ttl), &a.write, &entry);
    }

    /// The epoch each check of `batch` compares with: the one this node holds the
    /// session at as the batch is written.
    pub(super) fn epochs_to_check(&self, batch: &mut [Pending]) {
        for job in batch.iter_mut() {
            if let Pending::Held(check) = job {
                let key = (check.hub.clone(), check.id.clone());
                check.epoch = self.epochs.get(&key).copied();
            }
        }
    }

    /// Tells whoever waits whether each fragment's script call was taken, and whether
    /// each checked session is still this node's (`replies`, in order). A fragment
    /// fenced out (its session claimed elsewhere) is forgotten among the operations
    /// kept for claims; a session claimed elsewhere is handed over here before this
    /// batch's tickets are reported, so its socket's close overtakes what it held.
    pub(super) fn settle_fenced(&self, batch: &mut [Pending], replies: &[redis::Value]) {
        let mut replies = replies.iter();
        for job in batch.iter_mut() {
            match job {
                Pending::Op(seq, _, Some(a)) => {
                    let Some(reply) = replies.next() else { return };
                    let taken = !matches!(reply, redis::Value::Int(0));
                    if !taken {
                        // Not for a session claimed here meanwhile either (`sent_after`).
                        lock(&self.shared.assigned).kept.retain(|(s, _)| s != seq);
                        self.claimed_elsewhere(&a.hub, &a.id, "a send");
                    }
                    if let Some(fate) = a.fate.take() {
                        let _ = fate.send(taken);
                    }
                }
                Pending::Held(check) => {
                    let held = match check.epoch {
                        Some(_) => {
                            let Some(reply) = replies.next() else { return };
                            check.held(reply)
                        }
                        None => true,
                    };
                    if !held {
                        self.claimed_elsewhere(&check.hub, &check.id, "an upstream event");
                    }
                    check.answer(held);
                }
                _ => {}
            }
        }
    }

    /// Hands session `id` of `hub` over here: another node claimed it, and `what` of it
    /// is not published.
    fn claimed_elsewhere(&self, hub: &str, id: &str, what: &str) {
        tracing::debug!(
            hub,
            id,
            what,
            "web pubsub cluster: not published, the session was claimed by another node"
        );
        if let Some(service) = &self.service {
            service.claimed_elsewhere(hub, id);
        }
    }

    /// A run of one mirrored session's frames, fenced like [`Writer::session`].
    pub(super) fn frames(
        &self,
        pipe: &mut redis::Pipeline,
        hub: &str,
        id: &str,
        run: &[&SessionWrite],
    ) {
        let Some(epoch) = self.epochs.get(&(hub.to_owned(), id.to_owned())) else {
            return;
        };
        let keys = self.names.session(hub, id);
        add_frames(pipe, &self.scripts, &keys, (*epoch, self.ttl_ms()), run);
    }

    /// One mirrored session's change, fenced by the epoch this node holds it at.
    pub(super) fn session(
        &mut self,
        pipe: &mut redis::Pipeline,
        hub: &str,
        id: &str,
        write: &SessionWrite,
    ) {
        let key = (hub.to_owned(), id.to_owned());
        let epoch = match write {
            SessionWrite::Open { .. } => {
                self.epochs.insert(key, 1);
                1
            }
            SessionWrite::Delete => {
                lock(&self.shared.broken).remove(&key);
                self.marked.remove(&key);
                match self.epochs.remove(&key) {
                    Some(epoch) => epoch,
                    None => return,
                }
            }
            _ => match self.epochs.get(&key) {
                Some(epoch) => *epoch,
                None => return,
            },
        };
        let keys = self.names.session(hub, id);
        let owner = self.owner();
        let ttl = self.ttl_ms();
        add_write(
            pipe,
            &self.scripts,
            &keys,
            (epoch, ttl),
            write,
            (&owner, &self.position),
        );
    }

    /// The reader's position (when it moved), sessions whose writes were dropped, and
    /// the owned sessions' expiry, refreshed a few times per retention window.
    pub(super) fn sessions_upkeep(&mut self, pipe: &mut redis::Pipeline) {
        let ttl = self.ttl_ms();
        let pos = format!("{}{}", self.names.positions(), self.owner());
        if !self.position_written {
            pipe.cmd("SET")
                .arg(&pos)
                .arg(&self.position)
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        let broken: Vec<_> = (lock(&self.shared.broken).iter())
            .filter(|k| !self.marked.contains(*k))
            .cloned()
            .collect();
        for key in broken {
            if let Some(epoch) = self.epochs.get(&key) {
                add_lost(
                    pipe,
                    &self.scripts,
                    &self.names.session(&key.0, &key.1),
                    *epoch,
                );
            }
            self.marked.insert(key);
        }
        if self.refreshed.elapsed() < self.shared.session_ttl / 4 {
            return;
        }
        self.refreshed = Instant::now();
        pipe.cmd("PEXPIRE").arg(&pos).arg(ttl).ignore();
        for (hub, id) in self.epochs.keys() {
            for key in self.names.session(hub, id).all() {
                pipe.cmd("PEXPIRE").arg(key).arg(ttl).ignore();
            }
        }
    }
}
