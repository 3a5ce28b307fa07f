//! The commands themselves, once a request has passed the generic checks.
//!
//! Keys and values are copied out of the request payload before they are stored: the
//! payload may be a slice of a larger network buffer, and keeping a slice would pin that
//! whole buffer for as long as the key lives (and hide it from the byte quota).

use bytes::Bytes;

use super::{Effect, Failure, Machine, Reply, Request};
use crate::authz::{Authorizer, Operation};
use crate::command::SetCondition;
use crate::engine::{Engine, Entry};
use crate::error::{EngineError, Refusal};
use crate::glob::Pattern;
use crate::hlc::Hlc;
use crate::notify;
use crate::resp::Response;
use crate::value::Value;

/// The fencing rule: returns the token the key carries after an accepted write.
fn fence(existing: Option<&Entry>, request: Option<Hlc>) -> Result<Option<Hlc>, Refusal> {
    match (existing.and_then(|e| e.fencing_token.as_deref()), request) {
        (None, request) => Ok(request),
        (Some(_), None) => Err(Refusal::FencingTokenRequired),
        (Some(current), Some(request)) if request < *current => {
            Err(Refusal::FencingTokenLowerVersion)
        }
        (Some(_), Some(request)) => Ok(Some(request)),
    }
}

impl<E: Engine, A: Authorizer> Machine<E, A> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn set(
        &mut self,
        key: Bytes,
        value: &[u8],
        condition: SetCondition,
        px_ms: Option<u64>,
        fencing_token: Option<Hlc>,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Reply, Failure> {
        let existing = self.engine.peek(&key)?;
        let fencing_token = fence(existing, fencing_token)?;
        if let Some(current) = existing {
            let blocked = match condition {
                SetCondition::Always => false,
                SetCondition::IfAbsent => true,
                SetCondition::IfAbsentOrEqual => current.value.as_bytes() != value,
            };
            if blocked {
                return Ok(Reply::versioned(
                    &Response::Integer(-1),
                    current.version.clone(),
                ));
            }
        }
        self.check_quota(&key, value, existing)?;
        let version = self.clock.tick(now_ms);
        let expires_at_ms = px_ms.map(|px| now_ms.saturating_add(px));
        let entry = Entry {
            value: Value::new(value),
            version: version.clone(),
            fencing_token: fencing_token.map(Box::new),
            expires_at_ms,
        };
        self.engine.put(&key, entry)?;
        // `key` is a slice of the request: fine for effects, which do not outlive it long.
        if let Some(at_ms) = expires_at_ms {
            effects.push(Effect::ArmExpiry {
                key: key.clone(),
                at_ms,
            });
        }
        self.notify(&key, || notify::set_payload(value), &version, effects);
        Ok(Reply::versioned(&Response::Ok, version))
    }

    /// The size limits and the store's quotas, for a SET of `key` to `value` over
    /// `existing`.
    fn check_quota(
        &self,
        key: &[u8],
        value: &[u8],
        existing: Option<&Entry>,
    ) -> Result<(), Refusal> {
        let config = &self.config;
        if key.len() > self.max_key_len() || value.len() > config.max_value_bytes {
            return Err(Refusal::QuotaExceeded);
        }
        let stats = self.engine.stats();
        let new_size = (key.len() + value.len()) as u64;
        let old_size = existing.map_or(0, |e| (key.len() + e.value.len()) as u64);
        let too_many_keys = existing.is_none() && stats.keys.saturating_add(1) > config.max_keys;
        let too_many_bytes = new_size > old_size
            && (stats.bytes - old_size).saturating_add(new_size) > config.max_bytes;
        if too_many_keys || too_many_bytes {
            return Err(Refusal::QuotaExceeded);
        }
        Ok(())
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

    pub(super) fn get(&self, key: &[u8]) -> Result<Reply, Failure> {
        Ok(match self.engine.peek(key)? {
            // The stored frame is the reply: no copy of the value.
            Some(entry) => Reply {
                payload: entry.value.bulk(),
                version: Some(entry.version.clone()),
            },
            None => Reply::plain(&Response::Null),
        })
    }

    /// DEL, or VDEL when `expected` is given.
    pub(super) fn del(
        &mut self,
        key: &Bytes,
        expected: Option<&[u8]>,
        fencing_token: Option<Hlc>,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Reply, Failure> {
        let Some(current) = self.engine.get(key)? else {
            return Ok(Reply::plain(&Response::Integer(0)));
        };
        fence(Some(&current), fencing_token)?;
        if expected.is_some_and(|expected| current.value.as_bytes() != expected) {
            return Ok(Reply::versioned(&Response::Integer(-1), current.version));
        }
        self.engine.remove(key)?;
        let version = self.clock.tick(now_ms);
        self.notify(key, notify::delete_payload, &version, effects);
        Ok(Reply::versioned(&Response::Integer(1), version))
    }

    pub(super) fn key_notify(
        &mut self,
        client: &str,
        key: &[u8],
        stop: bool,
    ) -> Result<Reply, Failure> {
        if stop {
            let response = if self.observers.remove(client, key) {
                Response::Ok
            } else {
                Response::Integer(0)
            };
            return Ok(Reply::plain(&response));
        }
        if !self.observers.contains(client, key) {
            self.check_observation_quota(client, key)?;
            self.observers.add(client, Bytes::copy_from_slice(key));
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
