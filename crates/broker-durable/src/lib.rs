//! The broker's persistence on `statehub-storage`: retained messages ([`RetainedTable`],
//! the broker's `RetainStore` hook) and persistent sessions ([`SessionTable`], its
//! `SessionStore` hook), in the same store, and so the same group commit, as the state
//! store. The broker keeps everything in memory and tells these tables of each change;
//! they stage the change into a batch (no I/O) and the broker awaits the store's
//! durability before it acknowledges what depends on it. See the hooks' contracts in
//! `statehub_broker::{RetainStore, SessionStore}`.
//!
//! [`install`] opens both tables, loads what they hold into the broker and keeps them
//! there from then on: all a binary has to do, besides running
//! [`SessionTable::run_flusher`] and calling [`SessionTable::flush_all`] before it
//! closes the store.

mod retained;
mod sessions;
mod stored;

use std::sync::Arc;

use statehub_broker::Broker;
use statehub_storage::{StorageError, Store};

pub use retained::{RetainedTable, RETAINED_TABLE};
pub use sessions::{SessionTable, SESSIONS_TABLE, STALE};
pub use stored::RecordError;

/// Why a table could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The store refused or failed.
    #[error("{table}: {source}")]
    Storage {
        table: &'static str,
        source: StorageError,
    },
    /// A stored record does not parse.
    #[error("{table} record {key} is damaged ({source}); the data directory was written by another version or damaged")]
    Record {
        table: &'static str,
        /// The key, printable (`\xNN` escapes).
        key: String,
        source: RecordError,
    },
}

impl LoadError {
    fn storage(table: &'static str) -> impl Fn(StorageError) -> LoadError {
        move |source| LoadError::Storage { table, source }
    }

    fn record(table: &'static str, key: &[u8]) -> impl FnOnce(RecordError) -> LoadError {
        let key = key.escape_ascii().to_string();
        move |source| LoadError::Record { table, key, source }
    }
}

/// What [`install`] loaded.
#[derive(Debug)]
pub struct Installed {
    /// The session table, for its write-behind (see [`SessionTable::run_flusher`]).
    pub sessions: Arc<SessionTable>,
    pub retained_messages: usize,
    pub persistent_sessions: usize,
}

/// Loads the retained messages and the persistent sessions kept in `store` into
/// `broker`, and keeps them there from now on. Call from within the runtime, before
/// the broker accepts connections.
pub fn install(broker: &Broker, store: &Store) -> Result<Installed, LoadError> {
    let (retained, messages) = RetainedTable::open(store)?;
    let retained_messages = messages.len();
    broker.set_retain_store(Arc::new(retained), messages);
    let (sessions, loaded) = SessionTable::open(store)?;
    let persistent_sessions = loaded.len();
    let sessions = Arc::new(sessions);
    broker.set_session_store(sessions.clone(), loaded);
    Ok(Installed {
        sessions,
        retained_messages,
        persistent_sessions,
    })
}
