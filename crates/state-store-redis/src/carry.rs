//! What the engine carries into its next script instead of a round trip of its own: the
//! requests' stamps not yet merged into the shared clock, and the machine's sweep of due
//! keys before a request ([`statehub_state_store::Engine::carry_sweep`]).
//!
//! The machine sweeps before every request. Run as its own command, that sweep was one
//! of the two round trips of every request (a `ZRANGEBYSCORE` that almost always finds
//! nothing); carried, it is a few lines at the start of the script that the request's
//! first command is, so a SET or a DEL is one round trip. A GET reads whether any key is
//! due in the same round trip as the entry, and runs a script that sweeps and reads
//! again only if one is (rare: the expiry task removes keys as they fall due).

use redis::ScriptInvocation;
use statehub_state_store::{Stamp, WriteSeq};

/// Most request stamps kept for the next script (see [`Carry::queue`]).
const MAX_PENDING: usize = 32;

/// A request's stamp, to merge into the shared clock.
#[derive(Debug, Clone, Copy)]
struct Observation {
    stamp: Stamp,
    /// The request's time when the stamp is of that very millisecond: then the clock
    /// may step ([`statehub_state_store::HlcClock::observe_request`]); `None` for a plain
    /// merge.
    now_ms: Option<u64>,
}

/// A sweep the machine handed over, not run yet.
#[derive(Debug, Clone, Copy)]
struct Sweep {
    now_ms: u64,
    limit: usize,
    /// How many of the pending stamps came before it: its first removal merges those,
    /// and only those, as the machine's clock would have.
    stamps: usize,
}

/// What one queued script carries (see [`Carry::take`]).
#[derive(Debug, Clone)]
pub(crate) struct Carried {
    sweep: Option<Sweep>,
    pending: Vec<Observation>,
}

impl Carried {
    /// Appends the sweep's three arguments and the stamps, as [`Carry::append_args`].
    pub(crate) fn append_args(&self, invocation: &mut ScriptInvocation<'_>) {
        append(self.sweep, &self.pending, invocation);
    }
}

/// The sweep's three arguments (`''` for none), then each stamp's three.
fn append(sweep: Option<Sweep>, pending: &[Observation], invocation: &mut ScriptInvocation<'_>) {
    match sweep {
        Some(sweep) => invocation
            .arg(sweep.now_ms)
            .arg(sweep.limit)
            .arg(sweep.stamps),
        None => invocation.arg("").arg(0).arg(0),
    };
    for observation in pending {
        let stamp = observation.stamp;
        invocation.arg(stamp.wall_ms).arg(stamp.counter).arg(
            observation
                .now_ms
                .map_or_else(String::new, |now| now.to_string()),
        );
    }
}

/// The stamps and the sweep for the next script, and what the scripts fed.
#[derive(Debug, Default)]
pub(crate) struct Carry {
    /// Request stamps not yet merged into the shared clock, in order: the next script
    /// that writes (or refuses to) merges them first, exactly as the machine's clock
    /// would have one by one (see [`Observation`]).
    pending: Vec<Observation>,
    sweep: Option<Sweep>,
    /// The feed number of the last change this call fed, until
    /// [`statehub_state_store::Engine::seal`] hands it on.
    fed: Option<WriteSeq>,
}

impl Carry {
    /// Queues a request's stamp for the next script.
    pub(crate) fn queue(&mut self, stamp: Stamp, now_ms: u64) {
        // A stamp of another millisecond than the request's can only be merged: merges
        // in a row are one merge of the greatest (not across a sweep's place, though).
        let observation = Observation {
            stamp,
            now_ms: (stamp.wall_ms == now_ms).then_some(now_ms),
        };
        let after_sweep = self.pending.len() > self.sweep.map_or(0, |s| s.stamps);
        match self.pending.last_mut() {
            Some(last) if after_sweep && last.now_ms.is_none() && observation.now_ms.is_none() => {
                last.stamp = last.stamp.max(stamp);
            }
            _ => self.pending.push(observation),
        }
        self.bound();
    }

    /// Many reads in a row without a write: keep them as one merge of the greatest,
    /// merged after any sweep. Versions still exceed every stamp; only a step's choice
    /// between a new millisecond and a new counter may differ from the single node's.
    fn bound(&mut self) {
        if self.pending.len() > MAX_PENDING {
            let greatest = self.pending.iter().map(|o| o.stamp).max();
            self.pending.clear();
            if let Some(sweep) = &mut self.sweep {
                sweep.stamps = 0;
            }
            if let Some(stamp) = greatest {
                self.pending.push(Observation {
                    stamp,
                    now_ms: None,
                });
            }
        }
    }

    /// Takes over the machine's sweep at `now_ms` (replacing one a failed call left).
    pub(crate) fn sweep_at(&mut self, now_ms: u64, limit: usize) {
        self.sweep = Some(Sweep {
            now_ms,
            limit,
            stamps: self.pending.len(),
        });
    }

    /// Whether a sweep waits for the next script.
    pub(crate) fn sweep_pending(&self) -> bool {
        self.sweep.is_some()
    }

    /// The time of the sweep waiting for the next script, if one does.
    pub(crate) fn sweep_now(&self) -> Option<u64> {
        self.sweep.map(|s| s.now_ms)
    }

    /// Appends the sweep's three arguments (`''` for none) and the pending stamps.
    pub(crate) fn append_args(&self, invocation: &mut ScriptInvocation<'_>) {
        append(self.sweep, &self.pending, invocation);
    }

    /// What the next script carries, taken for a script queued now (to run after the
    /// scripts queued before it): as if it ran and wrote (`write`: every stamp merged)
    /// or only read (the sweep ran; the stamps wait for the next write, which merges
    /// them again if the sweep already did: a merge of a stamp the clock has passed
    /// changes nothing).
    pub(crate) fn take(&mut self, write: bool) -> Carried {
        Carried {
            sweep: self.sweep.take(),
            pending: match write {
                true => std::mem::take(&mut self.pending),
                false => self.pending.clone(),
            },
        }
    }

    /// A queued write that carried `carried` failed: its stamps wait for the next script
    /// again, before those queued since (plain merges: each is below what follows).
    pub(crate) fn restore(&mut self, carried: &Carried) {
        let stamps = carried.pending.iter().map(|o| Observation {
            stamp: o.stamp,
            now_ms: None,
        });
        let n = carried.pending.len();
        self.pending.splice(0..0, stamps);
        if let Some(sweep) = &mut self.sweep {
            sweep.stamps += n;
        }
        self.bound();
    }

    /// A script that writes (or refused to) ran with [`Carry::append_args`]: it ran the
    /// sweep and merged every stamp.
    pub(crate) fn merged_all(&mut self) {
        self.sweep = None;
        self.pending.clear();
    }

    /// A script that only reads ran with [`Carry::append_args`]: it ran the sweep, which
    /// merged the stamps before it if it removed a key (`swept`); the rest wait.
    pub(crate) fn swept(&mut self, swept: bool) {
        if let Some(sweep) = self.sweep.take() {
            if swept {
                self.pending.drain(..sweep.stamps.min(self.pending.len()));
            }
        }
    }

    /// Remembers the number of a change a script fed (`0`: none).
    pub(crate) fn note_fed(&mut self, fed: u64) {
        if fed > 0 {
            self.fed = Some(self.fed.map_or(fed, |last| last.max(fed)));
        }
    }

    /// The number of the last change fed since the last call, for the reply to wait on.
    pub(crate) fn take_fed(&mut self) -> Option<WriteSeq> {
        self.fed.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(wall_ms: u64) -> Stamp {
        Stamp {
            wall_ms,
            counter: 0,
        }
    }

    #[test]
    fn stamps_before_a_sweep_are_not_merged_with_those_after() {
        let mut carry = Carry::default();
        // Plain merges (another millisecond than the request's) in a row become one.
        carry.queue(stamp(10), 100);
        carry.queue(stamp(20), 100);
        assert_eq!(carry.pending.len(), 1);
        carry.sweep_at(100, 1_000);
        carry.queue(stamp(30), 100);
        assert_eq!(
            carry.pending.len(),
            2,
            "the request's stamp stays after the sweep"
        );
        assert_eq!(carry.sweep.map(|s| s.stamps), Some(1));
        carry.queue(stamp(40), 100);
        assert_eq!(
            carry.pending.len(),
            2,
            "after it, merges in a row become one again"
        );
        // A read that swept nothing leaves every stamp for the next write.
        carry.swept(false);
        assert_eq!((carry.pending.len(), carry.sweep_pending()), (2, false));
        carry.sweep_at(200, 1_000);
        carry.swept(true);
        assert!(
            carry.pending.is_empty(),
            "a sweep that removed a key merged them"
        );
    }
}
