//! The checked writes of a local engine: each check and its write made back to back by
//! the one thread that owns the engine, versions issued by the machine's own clock. These
//! are the [`Engine`] trait's default [`Engine::set_checked`], [`Engine::delete_checked`]
//! and [`Engine::remove_expired`]; an engine shared by several nodes overrides all three
//! with one atomic operation each, its own clock included.

use bytes::Bytes;

use super::{DelOutcome, Engine, Entry, Limits, SetOutcome, SetRequest};
use crate::command::SetCondition;
use crate::error::{EngineError, Refusal};
use crate::hlc::{Hlc, HlcClock};
use crate::value::Value;

/// The fencing rule: the token the key carries after an accepted write, which is the
/// request's (none if it carries none and the key has none).
pub fn fence(existing: Option<&Entry>, request: Option<&Hlc>) -> Result<Option<Hlc>, Refusal> {
    match (existing.and_then(|e| e.fencing_token.as_deref()), request) {
        (None, request) => Ok(request.cloned()),
        (Some(_), None) => Err(Refusal::FencingTokenRequired),
        (Some(current), Some(request)) if request < current => {
            Err(Refusal::FencingTokenLowerVersion)
        }
        (Some(_), Some(request)) => Ok(Some(request.clone())),
    }
}

/// The size limits and the store's quotas, for a SET of `key` to `value` over `existing`
/// in a store of `stats`.
pub fn check_quota(
    limits: &Limits,
    stats: super::Stats,
    key: &[u8],
    value: &[u8],
    existing: Option<&Entry>,
) -> Result<(), Refusal> {
    if key.len() > limits.max_key_len || value.len() > limits.max_value_bytes {
        return Err(Refusal::QuotaExceeded);
    }
    let new_size = (key.len() + value.len()) as u64;
    let old_size = existing.map_or(0, |e| (key.len() + e.value.len()) as u64);
    let too_many_keys = existing.is_none() && stats.keys.saturating_add(1) > limits.max_keys;
    let too_many_bytes =
        new_size > old_size && (stats.bytes - old_size).saturating_add(new_size) > limits.max_bytes;
    if too_many_keys || too_many_bytes {
        return Err(Refusal::QuotaExceeded);
    }
    Ok(())
}

/// [`Engine::set_checked`] on the engine's own reads and writes.
pub fn set<E: Engine + ?Sized>(
    engine: &mut E,
    clock: &mut HlcClock,
    request: &SetRequest<'_>,
    limits: &Limits,
) -> Result<SetOutcome, EngineError> {
    let existing = engine.peek(request.key)?;
    let existing = existing.as_deref();
    let fencing_token = match fence(existing, request.fencing_token) {
        Ok(token) => token,
        Err(refusal) => return Ok(SetOutcome::Refused(refusal)),
    };
    if let Some(current) = existing {
        let blocked = match request.condition {
            SetCondition::Always => false,
            SetCondition::IfAbsent => true,
            SetCondition::IfAbsentOrEqual => current.value.as_bytes() != request.value,
        };
        if blocked {
            return Ok(SetOutcome::Kept(current.version.clone()));
        }
    }
    if let Err(refusal) = check_quota(limits, engine.stats(), request.key, request.value, existing)
    {
        return Ok(SetOutcome::Refused(refusal));
    }
    let version = clock.tick(request.now_ms);
    let entry = Entry {
        value: Value::new(request.value),
        version: version.clone(),
        fencing_token: fencing_token.map(Box::new),
        expires_at_ms: request.expires_at_ms(),
    };
    engine.put(request.key, entry)?;
    Ok(SetOutcome::Written(version))
}

/// [`Engine::delete_checked`] on the engine's own reads and writes.
pub fn delete<E: Engine + ?Sized>(
    engine: &mut E,
    clock: &mut HlcClock,
    key: &[u8],
    expected: Option<&[u8]>,
    fencing_token: Option<&Hlc>,
    now_ms: u64,
) -> Result<DelOutcome, EngineError> {
    let Some(current) = engine.get(key)? else {
        return Ok(DelOutcome::Absent);
    };
    if let Err(refusal) = fence(Some(&current), fencing_token) {
        return Ok(DelOutcome::Refused(refusal));
    }
    if expected.is_some_and(|expected| current.value.as_bytes() != expected) {
        return Ok(DelOutcome::Kept(current.version));
    }
    engine.remove(key)?;
    Ok(DelOutcome::Deleted(clock.tick(now_ms)))
}

/// [`Engine::remove_expired`] on the engine's own reads and writes.
pub fn remove_expired<E: Engine + ?Sized>(
    engine: &mut E,
    clock: &mut HlcClock,
    key: &Bytes,
    now_ms: u64,
) -> Result<Option<Hlc>, EngineError> {
    let due = engine
        .peek(key)?
        .and_then(|entry| entry.expires_at_ms)
        .is_some_and(|at| at <= now_ms);
    if !due {
        return Ok(None);
    }
    engine.remove(key)?;
    Ok(Some(clock.tick(now_ms)))
}
