//! Loading the session table at start-up: every record is read once, what expired
//! while statehub was down (sessions, messages) and what belongs to no live session is
//! deleted, as is every body no live message record refers to, and the rest becomes
//! the broker's [`StoredSession`]s, the copies of one body sharing one message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use statehub_broker::codec::ByteString;
use statehub_broker::{Message, StoredSession};
use statehub_storage::{Batch, StorageError, Store, Table};

use super::bodies::Bodies;
use super::records::{
    body_key, decode_body, decode_message, decode_session, session_key, Body, BODY, MESSAGE, QOS2,
    SESSION,
};
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
            bodies: HashMap::new(),
            max_body: 0,
        };
        let mut messages = Vec::new();
        let mut receipts = Vec::new();
        for record in table.iter() {
            let record = record.map_err(&failed)?;
            let (key, value) = (record.key(), record.value());
            let loaded = match (key.first(), key.len()) {
                (Some(&SESSION), 9) => load.session(key, value),
                (Some(&BODY), 9) => load.body(key, value),
                (Some(&MESSAGE), 17) => {
                    messages.push((key.to_vec(), value.to_vec()));
                    Ok(())
                }
                (Some(&QOS2), 11) => {
                    receipts.push(key.to_vec());
                    Ok(())
                }
                _ => Err(RecordError::UnknownKey.into()),
            };
            loaded.map_err(|e| e.into_load_error(key))?;
        }
        load.drop_superseded().map_err(&failed)?;
        for (key, value) in messages {
            load.message(&key, &value)
                .map_err(|e| e.into_load_error(&key))?;
        }
        for key in receipts {
            load.receipt(&key).map_err(&failed)?;
        }
        let bodies = load.unreferred_bodies_go().map_err(&failed)?;
        if !load.garbage.is_empty() {
            let garbage = std::mem::take(&mut load.garbage);
            store
                .submit(garbage)
                .and_then(|t| t.wait())
                .map_err(&failed)?;
        }
        let loaded = load.sessions.into_values().map(|(_, s)| s).collect();
        Ok((SessionTable::new(store, table, bodies), loaded))
    }
}

/// The load in progress: live sessions by incarnation (with the time their record was
/// written), bodies by id (`None`: expired) with the records referring to them, and
/// the deletions of what is not to be loaded.
struct Load<'a> {
    table: &'a Table,
    now_ms: u64,
    now: Instant,
    garbage: Batch,
    sessions: HashMap<u64, (u64, StoredSession)>,
    bodies: HashMap<u64, (Option<Arc<Message>>, u64)>,
    max_body: u64,
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

    fn body(&mut self, key: &[u8], value: &[u8]) -> Result<(), Bad> {
        let id = u64_at(key, 1);
        let msg = decode_body(value, self.now_ms, self.now)?.map(Arc::new);
        self.bodies.insert(id, (msg, 0));
        self.max_body = self.max_body.max(id);
        Ok(())
    }

    fn message(&mut self, key: &[u8], value: &[u8]) -> Result<(), Bad> {
        let (incarnation, seq) = (u64_at(key, 1), u64_at(key, 9));
        let Some((_, session)) = self.sessions.get_mut(&incarnation) else {
            return Ok(self.garbage.delete(self.table, key)?);
        };
        let record = decode_message(value, self.now_ms, self.now)?;
        let msg = match record.body {
            Body::Inline(msg) => msg,
            Body::Ref(id) => {
                let (msg, refs) = self
                    .bodies
                    .get_mut(&id)
                    .ok_or(RecordError::MissingBody(id))?;
                if msg.is_some() {
                    *refs += 1;
                }
                msg.clone()
            }
        };
        let Some(msg) = msg else {
            // Expired while statehub was down.
            return Ok(self.garbage.delete(self.table, key)?);
        };
        session.messages.push(record.fields.into_stored(seq, msg));
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

    /// Deletes the bodies no live record refers to (expired ones, and those a crash
    /// left behind their last record's deletion); the rest are the table's.
    fn unreferred_bodies_go(&mut self) -> Result<Bodies, StorageError> {
        let mut live = Vec::new();
        for (id, (msg, refs)) in self.bodies.drain() {
            match msg {
                Some(msg) if refs > 0 => live.push((id, msg, refs)),
                _ => self.garbage.delete(self.table, &body_key(id))?,
            }
        }
        Ok(Bodies::loaded(live, self.max_body, self.now))
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
