//! The interval policy's syncs, off the committer's path.
//!
//! Under [`crate::SyncPolicy::Interval`] a batch is acknowledged once it is written to the
//! operating system, and an `fdatasync` must follow within the interval. When the
//! committer made that sync itself, every commit waited behind it for as long as the
//! dirty data took to reach the disk (up to about 2.5 ms for a segment, measured with
//! strace), and those stalls set the benchmark's p99. The syncer thread makes them
//! instead: when the committer asks (the interval has passed) and whenever about a MiB
//! has been written since the last one, so that the sync the committer still makes
//! itself when it closes a segment (a closed segment must be whole on disk before the
//! next one gets anything) finds little left to write.
//!
//! It tells the committer how far its syncs got ([`Syncer::synced`]), so that the
//! committer can flag a write made after every earlier byte of the segment was synced
//! (`format::SYNCED_BEFORE`). A failed sync fails the store (see `committer.rs` for why
//! a sync is never retried).

use std::fs::File;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::io_stats::IoStats;
use crate::shared::Shared;

/// Bytes written since the last sync past which the committer asks for one.
pub(crate) const SYNC_EVERY_BYTES: u64 = 1 << 20;

#[derive(Debug, Default)]
struct State {
    /// The segment being written (a second handle on it).
    file: Option<Arc<File>>,
    /// Changes with the file, so a sync of the previous one reports nothing.
    generation: u64,
    /// Sync everything written to the file up to this offset (`None`: nothing asked).
    requested: Option<u64>,
    /// Through which offset the file is known synced.
    synced: u64,
    stop: bool,
}

/// The syncer thread's handle; see the module docs.
#[derive(Debug)]
pub(crate) struct Syncer {
    state: Mutex<State>,
    wake: Condvar,
}

impl Syncer {
    /// Starts the thread.
    pub(crate) fn start(
        shared: Arc<Shared>,
        io: Arc<IoStats>,
    ) -> std::io::Result<(Arc<Syncer>, JoinHandle<()>)> {
        let syncer = Arc::new(Syncer {
            state: Mutex::default(),
            wake: Condvar::new(),
        });
        let handle = std::thread::Builder::new()
            .name("storage-syncer".to_owned())
            .spawn({
                let syncer = syncer.clone();
                move || syncer.run(&shared, &io)
            })?;
        Ok((syncer, handle))
    }

    /// From now on, syncs go to `file` (the segment the committer started), whose first
    /// `synced` bytes are synced already.
    pub(crate) fn set_file(&self, file: File, synced: u64) {
        let mut state = self.state.lock();
        state.file = Some(Arc::new(file));
        state.generation += 1;
        state.requested = None;
        state.synced = synced;
    }

    /// Asks for a sync of the current segment's bytes up to `upto`, all of them written
    /// already (coalesced with one already asked for).
    pub(crate) fn request(&self, upto: u64) {
        let mut state = self.state.lock();
        if state.requested.is_none() {
            self.wake.notify_one();
        }
        state.requested = Some(state.requested.map_or(upto, |r| r.max(upto)));
    }

    /// Through which offset the current segment is known synced.
    pub(crate) fn synced(&self) -> u64 {
        self.state.lock().synced
    }

    /// Ends the thread once a requested sync is done.
    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.wake.notify_one();
    }

    fn run(&self, shared: &Shared, io: &IoStats) {
        loop {
            let (file, generation, upto) = {
                let mut state = self.state.lock();
                while state.requested.is_none() && !state.stop {
                    self.wake.wait(&mut state);
                }
                let Some(upto) = state.requested.take() else {
                    return;
                };
                (state.file.clone(), state.generation, upto)
            };
            if let Some(file) = file {
                if let Err(e) = io.timed(|| file.sync_data()) {
                    shared.fail(Box::new(crate::files::WriteError::Sync(e)));
                    return;
                }
                let mut state = self.state.lock();
                if state.generation == generation {
                    state.synced = state.synced.max(upto);
                }
            }
        }
    }
}
