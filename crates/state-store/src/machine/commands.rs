//! The commands themselves, once a request has passed the generic checks.
//!
//! Keys and values are copied out of the request payload before they are stored: the
//! payload may be a slice of a larger network buffer, and keeping a slice would pin that
//! whole buffer for as long as the key lives (and hide it from the byte quota).

use bytes::Bytes;

use super::{Effect, Failure, Machine, Reply, Request};
use crate::authz::{Authorizer, Operation};
use crate::command::Command;
use crate::engine::{DelOutcome, Engine, Entry, Limits, Op, OpOutcome, SetOutcome};
use crate::error::{EngineError, Refusal};
use crate::glob::Pattern;
use crate::hlc::Hlc;
use crate::notify;
use crate::resp::Response;

impl<E: Engine, A: Authorizer> Machine<E, A> {
    /// The one engine call of a SET, GET, DEL or VDEL; `None` for the other commands.
    pub(super) fn op_of(
        &self,
        command: Command,
        fencing_token: Option<Hlc>,
        now_ms: u64,
    ) -> Option<Op> {
        Some(match command {
            Command::Set {
                key,
                value,
                condition,
                px_ms,
            } => Op::Set {
                key,
                value,
                condition,
                px_ms,
                fencing_token,
                now_ms,
                limits: self.limits(),
            },
            Command::Get { key } => Op::Get { key },
            Command::Del { key } => Op::Delete {
                key,
                expected: None,
                fencing_token,
                now_ms,
            },
            Command::VDel { key, value } => Op::Delete {
                key,
                expected: Some(value),
                fencing_token,
                now_ms,
            },
            Command::KeyNotify { .. } | Command::Scan { .. } => return None,
        })
    }

    /// The reply to `op`'s request once the engine ran it.
    pub(super) fn reply_to(
        &mut self,
        op: &Op,
        outcome: OpOutcome,
        effects: &mut Vec<Effect>,
    ) -> Result<Reply, Failure> {
        match (op, outcome) {
            (Op::Set { key, value, .. }, OpOutcome::Set(outcome)) => {
                let expires = op.set_request().and_then(|(r, _)| r.expires_at_ms());
                Ok(self.set_reply(key, value, expires, outcome, effects)?)
            }
            (Op::Get { .. }, OpOutcome::Get(entry)) => Ok(get_reply(entry.as_ref())),
            (Op::Delete { key, .. }, OpOutcome::Delete(outcome)) => {
                Ok(self.del_reply(key, outcome, effects)?)
            }
            _ => Err(EngineError::Backend("an outcome of another call".into()).into()),
        }
    }

    fn set_reply(
        &mut self,
        key: &Bytes,
        value: &[u8],
        expires_at_ms: Option<u64>,
        outcome: SetOutcome,
        effects: &mut Vec<Effect>,
    ) -> Result<Reply, Refusal> {
        let version = match outcome {
            SetOutcome::Written(version) => version,
            SetOutcome::Kept(version) => {
                return Ok(Reply::versioned(&Response::Integer(-1), version))
            }
            SetOutcome::Refused(refusal) => return Err(refusal),
        };
        // `key` is a slice of the request: fine for effects, which do not outlive it long.
        if let Some(at_ms) = expires_at_ms {
            effects.push(Effect::ArmExpiry {
                key: key.clone(),
                at_ms,
            });
        }
        self.notify(key, || notify::set_payload(value), &version, effects);
        Ok(Reply::versioned(&Response::Ok, version))
    }

    fn del_reply(
        &mut self,
        key: &Bytes,
        outcome: DelOutcome,
        effects: &mut Vec<Effect>,
    ) -> Result<Reply, Refusal> {
        let version = match outcome {
            DelOutcome::Absent => return Ok(Reply::plain(&Response::Integer(0))),
            DelOutcome::Kept(version) => {
                return Ok(Reply::versioned(&Response::Integer(-1), version))
            }
            DelOutcome::Refused(refusal) => return Err(refusal),
            DelOutcome::Deleted(version) => version,
        };
        self.notify(key, notify::delete_payload, &version, effects);
        Ok(Reply::versioned(&Response::Integer(1), version))
    }

    /// The size limits and the store's quotas, for the engine's checked SET.
    fn limits(&self) -> Limits {
        Limits {
            max_keys: self.config.max_keys,
            max_bytes: self.config.max_bytes,
            max_key_len: self.max_key_len(),
            max_value_bytes: self.config.max_value_bytes,
        }
    }

    /// Whether `key` has expired by `now_ms` (when given) and awaits its removal.
    fn is_due(&self, key: &[u8], now_ms: Option<u64>) -> Result<bool, EngineError> {
        let Some(now_ms) = now_ms else {
            return Ok(false);
        };
        let expires = self.engine.peek(key)?.and_then(|entry| entry.expires_at_ms);
        Ok(expires.is_some_and(|at| at <= now_ms))
    }

    /// The longest key the store takes: the configured bound, or the engine's if lower.
    fn max_key_len(&self) -> usize {
        self.config.max_key_bytes.min(self.engine.max_key_len())
    }

    pub(super) fn key_notify(
        &mut self,
        client: &str,
        key: &[u8],
        stop: bool,
    ) -> Result<Reply, Failure> {
        if stop {
            if !self.observers.remove(client, key) {
                return Ok(Reply::plain(&Response::Integer(0)));
            }
            if !self.observers.is_observed(key) {
                self.engine.forget_key(key)?;
            }
            return Ok(Reply::plain(&Response::Ok));
        }
        if !self.observers.contains(client, key) {
            self.check_observation_quota(client, key)?;
            // The engine first: if it fails, nothing is observed.
            let since = self.engine.observe_key(key)?;
            self.observers
                .add(client, Bytes::copy_from_slice(key), since);
        }
        Ok(Reply::plain(&Response::Ok))
    }

    /// Whether `client` may start observing `key`: the key's size, the notification
    /// topic's, and the observation quotas.
    fn check_observation_quota(&self, client: &str, key: &[u8]) -> Result<(), Refusal> {
        let config = &self.config;
        let observers = &self.observers;
        let refused = key.len() > self.max_key_len()
            || notify::notify_topic_len(client.len(), key.len()) > notify::MAX_TOPIC_LEN
            || observers.count(client) >= config.max_observations_per_client
            || observers.total() >= config.max_observations
            || observers.total_key_bytes().saturating_add(key.len() as u64)
                > config.max_observed_key_bytes;
        if refused {
            return Err(Refusal::QuotaExceeded);
        }
        Ok(())
    }

    /// One page of a SCAN: the keys after `token` that match `pattern`, visited one at a
    /// time until the page has visited `scan_count` keys, spent the `scan_work` budget or
    /// holds `scan_page_bytes`, whichever comes first; the token to go on with is the
    /// engine's cursor after the last key visited. So the work done under the store's
    /// lock is bounded by the configuration whatever the keys and the pattern, and a page
    /// may hold fewer keys than it could, or none, with a token (the SDKs page until no
    /// token comes back). With `skip_due`, keys expired by then are left out (they are
    /// waiting for their removal, see [`super::EXPIRY_BATCH`]).
    pub(super) fn scan(
        &self,
        request: &Request<'_>,
        pattern: &[u8],
        token: Option<&[u8]>,
        skip_due: Option<u64>,
    ) -> Result<Reply, Failure> {
        let config = &self.config;
        if pattern.len() > config.max_pattern_bytes {
            return Err(Refusal::QuotaExceeded.into());
        }
        let pattern = Pattern::compile(pattern);
        let words = pattern.words() as u64;
        let mut cursor: Option<Bytes> = None;
        let (mut visited, mut work, mut page_bytes) = (0, 0u64, 0);
        let mut keys = Vec::new();
        loop {
            let position = cursor.as_deref().or(token);
            let batch = self.engine.scan(position, 1)?;
            for key in batch.keys {
                visited += 1;
                work = work.saturating_add((key.len() as u64 + 1).saturating_mul(words));
                let visible = pattern.is_match(&key)
                    && !self.is_due(&key, skip_due)?
                    && request.allowed(&self.authorizer, &key, Operation::Scan);
                if visible {
                    page_bytes += key.len();
                    keys.push(key);
                }
            }
            cursor = batch.cursor;
            let full = visited >= config.scan_count
                || work >= config.scan_work
                || page_bytes >= config.scan_page_bytes;
            if cursor.is_none() || full {
                break;
            }
        }
        Ok(Reply::plain(&Response::Scan {
            keys,
            token: cursor,
        }))
    }
}

/// A GET's reply: the stored frame is the reply (no copy of the value).
pub(super) fn get_reply(entry: Option<&Entry>) -> Reply {
    match entry {
        Some(entry) => Reply {
            payload: entry.value.bulk(),
            version: Some(entry.version.clone()),
        },
        None => Reply::plain(&Response::Null),
    }
}
