//! Loading the session table at start-up: every record is read once, what expired
//! while statehub was down (sessions, messages) and what belongs to no live session is
//! deleted, and the rest becomes the broker's [`StoredSession`]s.

use std::collections::HashMap;

use statehub_broker::codec::ByteString;
use statehub_broker::{StoredMessage, StoredSession};
use statehub_storage::{Batch, StorageError, Store, Table};

use super::records::{decode_message, decode_session, hex, session_key, MESSAGE, QOS2, SESSION};
use super::{LoadError, SessionTable, TABLE};
use crate::stored::wall_ms;

impl SessionTable {
    /// Opens the table and reads back every session that has not expired.
    pub fn open(store: &Store) -> Result<(SessionTable, Vec<StoredSession>), LoadError> {
        let table = store.table(TABLE)?;
        let now_ms = wall_ms();
        let mut garbage = Batch::new();
        let mut sessions: HashMap<u64, (u64, StoredSession)> = HashMap::new();
        let mut messages = Vec::new();
        let mut receipts = Vec::new();
        for record in table.iter() {
            let record = record?;
            let (key, value) = (record.key(), record.value());
            let bad = |why: String| LoadError::Record { key: hex(key), why };
            match (key.first(), key.len()) {
                (Some(&SESSION), 9) => {
                    let incarnation =
                        u64::from_be_bytes(key[1..9].try_into().map_err(|_| bad("key".into()))?);
                    match decode_session(value, incarnation, now_ms).map_err(bad)? {
                        Some(s) => drop(sessions.insert(incarnation, s)),
                        None => garbage.delete(&table, key)?,
                    }
                }
                (Some(&MESSAGE), 17) => messages.push((key.to_vec(), value.to_vec())),
                (Some(&QOS2), 11) => receipts.push(key.to_vec()),
                _ => return Err(bad("unknown key".into())),
            }
        }
        drop_superseded(&mut sessions, &table, &mut garbage)?;
        for (key, value) in messages {
            let incarnation = u64::from_be_bytes(key[1..9].try_into().unwrap_or_default());
            let seq = u64::from_be_bytes(key[9..17].try_into().unwrap_or_default());
            let Some((_, session)) = sessions.get_mut(&incarnation) else {
                garbage.delete(&table, &key)?;
                continue;
            };
            match decode_message(&value, now_ms).map_err(|why| LoadError::Record {
                key: hex(&key),
                why,
            })? {
                Some((delivery, released)) => session.messages.push(StoredMessage {
                    seq,
                    delivery,
                    released,
                }),
                None => garbage.delete(&table, &key)?,
            }
        }
        for key in receipts {
            let incarnation = u64::from_be_bytes(key[1..9].try_into().unwrap_or_default());
            match sessions.get_mut(&incarnation) {
                Some((_, session)) => session
                    .incoming_qos2
                    .push(u16::from_be_bytes([key[9], key[10]])),
                None => garbage.delete(&table, &key)?,
            }
        }
        if !garbage.is_empty() {
            store.submit(garbage)?.wait()?;
        }
        let loaded = sessions.into_values().map(|(_, s)| s).collect();
        Ok((SessionTable::new(store, table), loaded))
    }
}

/// Two records of one client id can only both be present if the older one's deletion
/// was cut by a crash: the newer (by write time) wins, the older goes.
fn drop_superseded(
    sessions: &mut HashMap<u64, (u64, StoredSession)>,
    table: &Table,
    garbage: &mut Batch,
) -> Result<(), StorageError> {
    let mut newest: HashMap<ByteString, (u64, u64)> = HashMap::new();
    let mut losers = Vec::new();
    for (&incarnation, (written, s)) in sessions.iter() {
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
        sessions.remove(&incarnation);
        garbage.delete(table, &session_key(incarnation))?;
    }
    Ok(())
}
