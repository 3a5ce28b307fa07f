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
//!   numbers of their tickets, 1, 2, 3...); within a batch, in the order of its
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
//! * **Failure is fatal.** If a commit or a sync fails, the store is *failed*: every
//!   incomplete ticket and every later `submit` returns [`StorageError::Failed`] with
//!   the cause, it is logged once, and nothing more is written. What was already
//!   completed stays durable. A user must then stop acknowledging writes (the state store
//!   answers 503). There is no retry: after a failed `fdatasync` the kernel may have
//!   dropped the dirty pages, so "try again" could acknowledge lost data.
//! * **Bounded.** The bytes submitted but not yet committed are bounded by
//!   [`Options::max_pending_bytes`]: callers `await` [`Store::admit`] before work that will
//!   submit, which waits while the bound is exceeded. `submit` itself never blocks (it
//!   runs under callers' locks), so the bound can be overshot by at most one batch per
//!   concurrent caller.
//! * **Reads** ([`Table::get`], [`Table::iter`], [`Table::prefix`]) see every batch the
//!   committer has written, durable or not, and nothing of a batch it has not; they are for
//!   start-up and inspection.
//! * **One process per directory.** [`Store::open`] takes an exclusive lock on
//!   `DIR/LOCK`; a second open of the same directory (from any process) fails with
//!   [`OpenError::Locked`] instead of corrupting it.
//! * **Closing.** [`Store::close`] (or dropping the last handle) commits what was
//!   submitted, syncs, stops the committer and releases the lock.
//!
//! # Recovery and damaged files
//!
//! On open, the journal is replayed: a torn last batch (a crash in the middle of a write)
//! is discarded, which loses nothing that was acknowledged. Any other damage (a checksum
//! mismatch in the journal or in a table file, a missing or truncated table file) makes
//! [`Store::open`] or the first read of the damaged data fail with
//! [`OpenError::Corrupt`] / [`StorageError::Corrupt`], naming the files; statehub then
//! refuses to start. Damage that makes a journal entry unreadable (rather than failing
//! its checksum) ends the replay there, like a torn write: the store recovers to the last
//! whole batch before it and drops nothing older. Whenever recovery discards written
//! bytes at the end of a journal, [`Store::recovery`] reports it and a warning is
//! logged: a batch cut by a crash was never acknowledged, but damage loses the writes
//! after the damaged point.
//!
//! # Layout
//!
//! `DIR/LOCK` (the lock, holding the owner's pid) and `DIR/db/` (the fjall database:
//! journals `*.jnl`, one LSM tree per table under `keyspaces/`). Background compaction
//! (one worker thread) keeps the footprint close to the live data.

mod batch;
mod committer;
mod error;
mod lock;
mod options;
mod relay;
mod store;

pub use batch::{Batch, MAX_KEY_LEN, MAX_VALUE_LEN};
pub use error::{OpenError, StorageError};
pub use options::{Options, SyncPolicy, SyncPolicyParseError};
pub use store::{Record, Recovery, Store, Table, Ticket, TruncatedJournal};
