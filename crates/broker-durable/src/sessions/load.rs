//! Loading the session table at start-up: every record is read once, what expired
//! while statehub was down (sessions, messages) and what belongs to no live session is
//! deleted, and the rest becomes the broker's [`StoredSession`]s.

use std::collections::HashMap;
use std::time::Instant;

use statehub_broker::codec::ByteString;
use statehub_broker::{StoredMessage, StoredSession};
use statehub_storage::{Batch, StorageError, Store, Table};

use super::records::{decode_message, decode_session, session_key, MESSAGE, QOS2, SESSION};
use super::{SessionTable, SESSIONS_TABLE};
use crate::stored::{wall_ms, RecordError};
use crate::LoadError;

impl SessionTable {
    /// Opens the table and reads back every session that has not expired.
    pub fn open(store: &Store) -> Result<(SessionTable, Vec<StoredSession>), LoadError> {
        let failed = LoadError::storage(SESSIONS_TABLE);
        let table = store.table(SESSIONS_TABLE).map_err(&failed)?;
        let mut load = Load {
            table: &table,
            now_ms: wall_ms(),
            now: Instant::now(),
            garbage: Batch::new(),
            sessions: HashMap::new(),
        };
        let mut messages = Vec::new();
        let mut receipts = Vec::new();
        for record in table.iter() {
            let record = record.map_err(&failed)?;
            let (key, value) = (record.key(), record.value());
            match (key.first(), key.len()) {
                (Some(&SESSION), 9) => load
                    .session(key, value)
                    .map_err(|e| e.into_load_error(key))?,
                (Some(&MESSAGE), 17) => messages.push((key.to_vec(), value.to_vec())),
                (Some(&QOS2), 11) => receipts.push(key.to_vec()),
                _ => {
                    return Err(LoadError::record(SESSIONS_TABLE, key)(
                        RecordError::UnknownKey,
                    ))
                }
            }
        }
        load.drop_superseded().map_err(&failed)?;
        for (key, value) in messages {
            load.message(&key, &value)
                .map_err(|e| e.into_load_error(&key))?;
        }
        for key in receipts {
            load.receipt(&key).map_err(&failed)?;
        }
        if !load.garbage.is_empty() {
            let garbage = std::mem::take(&mut load.garbage);
            store
                .submit(garbage)
                .and_then(|t| t.wait())
                .map_err(&failed)?;
        }
        let loaded = load.sessions.into_values().map(|(_, s)| s).collect();
        Ok((SessionTable::new(store, table), loaded))
    }
}

/// The load in progress: live sessions by incarnation (with the time their record was
/// written), and the deletions of what is not to be loaded.
struct Load<'a> {
    table: &'a Table,
    now_ms: u64,
    now: Instant,
    garbage: Batch,
    sessions: HashMap<u64, (u64, StoredSession)>,
}

/// Why one record stopped the load.
#[derive(Debug, thiserror::Error)]
enum Bad {
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Bad {
    fn into_load_error(self, key: &[u8]) -> LoadError {
        match self {
            Bad::Record(e) => LoadError::record(SESSIONS_TABLE, key)(e),
            Bad::Storage(e) => LoadError::storage(SESSIONS_TABLE)(e),
        }
    }
}

/// The big-endian u64 at `at` in a key whose length was checked.
fn u64_at(key: &[u8], at: usize) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&key[at..at + 8]);
    u64::from_be_bytes(b)
}

impl Load<'_> {
    fn session(&mut self, key: &[u8], value: &[u8]) -> Result<(), Bad> {
        let incarnation = u64_at(key, 1);
        match decode_session(value, incarnation, self.now_ms)? {
            Some(s) => drop(self.sessions.insert(incarnation, s)),
            None => self.garbage.delete(self.table, key)?,
        }
        Ok(())
    }

    fn message(&mut self, key: &[u8], value: &[u8]) -> Result<(), Bad> {
        let (incarnation, seq) = (u64_at(key, 1), u64_at(key, 9));
        let Some((_, session)) = self.sessions.get_mut(&incarnation) else {
            return Ok(self.garbage.delete(self.table, key)?);
        };
        match decode_message(value, self.now_ms, self.now)? {
            Some((q, released)) => session.messages.push(StoredMessage {
                seq,
                msg: q.msg,
                qos: q.qos,
                retain: q.retain,
                subscription_ids: q.subscription_ids,
                shared: q.shared,
                released,
            }),
            None => self.garbage.delete(self.table, key)?,
        }
        Ok(())
    }

    fn receipt(&mut self, key: &[u8]) -> Result<(), StorageError> {
        match self.sessions.get_mut(&u64_at(key, 1)) {
            Some((_, session)) => {
                session
                    .incoming_qos2
                    .push(u16::from_be_bytes([key[9], key[10]]));
                Ok(())
            }
            None => self.garbage.delete(self.table, key),
        }
    }

    /// Two records of one client id can only both be present if the older one's
    /// deletion was cut by a crash: the newer (by write time) wins, the older goes.
    fn drop_superseded(&mut self) -> Result<(), StorageError> {
        let mut newest: HashMap<ByteString, (u64, u64)> = HashMap::new();
        let mut losers = Vec::new();
        for (&incarnation, (written, s)) in self.sessions.iter() {
            let best = newest
                .entry(s.client_id.clone())
                .or_insert((*written, incarnation));
            if best.1 == incarnation {
                continue;
            }
            if best.0 >= *written {
                losers.push(incarnation);
            } else {
                losers.push(best.1);
                *best = (*written, incarnation);
            }
        }
        for incarnation in losers {
            self.sessions.remove(&incarnation);
            self.garbage.delete(self.table, &session_key(incarnation))?;
        }
        Ok(())
    }
}
