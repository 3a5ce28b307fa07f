//! statehub's one durable layer: everything statehub persists goes through a [`Store`].
//!
//! The users of this crate (the state store engine, the broker's retained messages and
//! sessions) keep their live state in memory and use the store as the durable *log* of
//! that state: they stage each change into a [`Batch`] while they change memory (no I/O),
//! [`Store::submit`] the batch (a hand-over, no I/O either), and await its [`Ticket`]
//! before they tell a client "done". At start-up they read their tables back once and
//! rebuild memory from them. Reads are not a cache and are not meant for the request path.
//!
//! # Example
//!
//! ```
//! use statehub_storage::{Batch, Options, Store};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path(), Options::default())?;
//! let retained = store.table("retained")?;
//!
//! // Under the lock that orders the in-memory change: stage it and submit (no I/O).
//! let mut batch = Batch::new();
//! batch.put(&retained, b"sensors/1/temp", b"21.5")?;
//! batch.delete(&retained, b"sensors/2/temp")?;
//! let ticket = store.submit(batch)?;
//!
//! // Outside every lock: wait, then acknowledge (async code: `ticket.durable().await?`).
//! ticket.wait()?;
//!
//! // At the next start-up: rebuild memory from the table.
//! for record in retained.iter() {
//!     let record = record?;
//!     assert_eq!((record.key(), record.value()), (&b"sensors/1/temp"[..], &b"21.5"[..]));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The contract
//!
//! * **Named tables.** [`Store::table`] opens (or creates) a named keyspace. Keys are
//!   ordered bytes of at most [`MAX_KEY_LEN`] bytes, values any bytes up to
//!   [`MAX_VALUE_LEN`]. Tables are independent key spaces; one batch may touch several.
//! * **Atomic batches.** A batch is applied entirely or not at all, including after a
//!   crash: recovery never shows half a batch.
//! * **Order.** Batches are applied in the order of their `submit` calls (the sequence
//!   numbers of their tickets: 1, 2, 3... in a new store, continuing from the last
//!   batch recovered after a reopen); within a batch, in the order of its
//!   operations, so a later put or delete of the same key wins. Callers that need their
//!   on-disk order to match their in-memory order submit while holding the lock that
//!   orders their memory changes: `submit` never blocks and never does I/O, so that is
//!   cheap.
//! * **Durability.** A ticket completes with `Ok` once its batch *and every batch
//!   submitted before it* survive what the [`SyncPolicy`] promises:
//!   [`SyncPolicy::Always`] (the default): `fdatasync` has returned, so the batch survives
//!   a crash of the process, the kernel or the machine; [`SyncPolicy::Interval`]: the batch
//!   has been written to the operating system, so it survives a crash (even `kill -9`) of
//!   statehub, and an `fdatasync` follows within the interval, so a power failure or
//!   kernel crash loses at most the last interval of completed tickets.
//!   [`Store::durable_seq`] is the highest sequence number so completed.
//! * **Group commit.** One committer thread per store takes every batch submitted
//!   while it was busy and commits them as one write and one sync. Concurrent writers
//!   therefore share a sync; nobody waits for a timer.
//! * **A full disk stalls, then recovers.** A write that finds no room (`ENOSPC`,
//!   `EDQUOT`) is retried with a backoff (10 ms doubling to 1 s) until it succeeds; no
//!   restart is needed. Meanwhile [`Store::stall_error`] says so
//!   ([`StorageError::NoSpace`]), `submit` still queues batches (written, in order, once
//!   there is room), their tickets wait, [`Store::admit`] returns at once (callers are
//!   to refuse new writes, not queue them), and [`Store::pending_keys`] tells readers
//!   which keys wait, so they can answer reads of everything else. Entering and leaving
//!   the stall are logged once each. Closing during a stall fails the store.
//! * **Any other failure is fatal.** If a sync fails (whatever its error), or a write
//!   fails for another reason than space, the store is *failed*: every incomplete ticket
//!   and every later `submit` returns [`StorageError::Failed`] with the cause, it is
//!   logged once, and nothing more is written. What was already completed stays
//!   durable; a restart recovers from what is on disk. A failed sync is never retried:
//!   after one, the kernel may have marked the dirty pages clean (or dropped them), so
//!   "try again" could succeed and acknowledge lost data (`committer.rs` has the
//!   reasoning).
//! * **Bounded.** The bytes submitted but not yet committed are bounded by
//!   [`Options::max_pending_bytes`]: callers `await` [`Store::admit`] before work that will
//!   submit, which waits while the bound is exceeded. `submit` itself never blocks (it
//!   runs under callers' locks), so the bound can be overshot by at most one batch per
//!   concurrent caller. The journal the compactor has not folded yet is bounded by
//!   [`Options::max_journal_bytes`] (or twice the compaction threshold): past it,
//!   commits wait for the compactor, so a write flood slows down instead of growing the
//!   journal without end however little CPU the compactor gets.
//! * **Reads** ([`Table::get`], [`Table::iter`], [`Table::prefix`]) see every completed
//!   ticket's batch and nothing of a batch whose ticket has not completed; they read
//!   files and are for start-up and inspection.
//! * **One process per directory.** [`Store::open`] (and [`repair`]) take an exclusive
//!   lock on `DIR/LOCK`; a second open of the same directory (from any process) fails
//!   with [`OpenError::Locked`] instead of corrupting it.
//! * **Closing.** [`Store::close`] (or dropping the last handle) commits what was
//!   submitted, syncs, stops the committer and the compactor and releases the lock.
//!
//! # Recovery and damaged files
//!
//! On open, the newest snapshot is checked and the journal after it replayed. A torn last
//! write (a crash in the middle of it) is taken out of the journal, which loses nothing
//! acknowledged; its bytes are first copied to a file of their own under `DIR/damaged/`,
//! so nothing is ever overwritten that could be someone's only copy, and
//! [`Store::recovery`] reports it with a warning in the log. Damage is told from a torn
//! write by what the writer recorded: a checksum mismatch followed by a whole batch that
//! was written after the damaged one had been synced is damage (under `--sync always`,
//! any whole batch after it; `recovery.rs` has the rules for both policies). That, and
//! any other damage (a gap in the journal's batches, a closed segment that is not whole,
//! a damaged or missing snapshot, a snapshot block that fails its checksum when read)
//! makes [`Store::open`] or the read of the damaged data fail with
//! [`OpenError::Corrupt`] / [`StorageError::Corrupt`], naming the file and where in it,
//! with the directory left as it was; statehub then refuses to start.
//!
//! [`repair`] is the explicit way out: it keeps every batch and snapshot block that
//! passes its checksum, writes them as one new snapshot, moves the files it replaces to
//! `DIR/damaged/repair-*/` (nothing is deleted), and reports every batch and byte range
//! it could not keep ([`RepairReport`]).
//!
//! # Layout and why
//!
//! `DIR/LOCK` (the lock, holding the owner's pid); `DIR/journal/*.log`, the segments of
//! the journal, one record per batch with its checksum (`format.rs`, `journal.rs`);
//! `DIR/snapshots/*.snap`, the snapshot: every live record of every table as of one
//! batch, sorted, in checksummed blocks (`snapshot.rs`); and `DIR/MANIFEST`, which names
//! the snapshot and the newest segment, so a missing file is noticed (`manifest.rs`). A
//! compactor thread folds closed journal segments into a new snapshot (`compactor.rs`),
//! so start-up replays a bounded journal and the disk holds about the live data plus
//! [`Options::compact_after_bytes`] to about twice that of journal (and a spare segment
//! of zeros). `files.rs` lists every file; `recovery.rs` has the rules of opening.
//!
//! Every user of this crate keeps its live state in memory and reads its tables only at
//! start-up, so the store needs no index of its own: a commit is one append and one
//! sync. An LSM store (fjall, which statehub used first) keeps a memtable, a skiplist
//! that duplicates those in-memory indexes, and inserting into it cost more than the
//! rest of a durable write (measured: docs/decisions/0001-own-journal-and-snapshots.md).

mod batch;
mod committer;
mod compactor;
mod error;
mod files;
mod format;
mod io_stats;
mod journal;
mod lock;
mod manifest;
mod merge;
mod open;
mod options;
mod recovery;
mod relay;
mod repair;
mod scan;
mod shared;
mod snapshot;
mod store;
mod syncer;
mod table;

pub use batch::{Batch, MAX_BATCH_BYTES, MAX_KEY_LEN, MAX_VALUE_LEN};
pub use error::{OpenError, StorageError};
pub use io_stats::StorageStats;
pub use options::{Options, SyncPolicy, SyncPolicyParseError};
pub use recovery::{Recovery, TruncatedJournal};
pub use repair::{repair, Loss, RepairReport};
pub use store::{Store, Ticket};
pub use table::{Record, Table};
