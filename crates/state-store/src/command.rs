//! A request payload turned into a typed [`Command`].
//!
//! Checks happen in this order, so each malformed input gets one predictable error:
//! framing (`syntax error`), verb (`unknown command`), argument count
//! (`wrong number of arguments`), empty key (`the key length is zero`), then options
//! (`syntax error`).
//!
//! Verbs and options are matched case-insensitively (ASCII). The protocol page tells
//! clients to send upper case, and the SDKs do, but the page's own examples are lower
//! case (`set`, `get`), so accepting both costs nothing and surprises no one.
//!
//! `NEX` takes no argument: the SDKs send `SET k v NEX`, comparing against `v` itself (the
//! page's `NEX <value>` is not what clients send). `PX` takes a positive decimal number of
//! milliseconds; `PX 0`, a sign or an overflow are `syntax error`, as in Redis.

use bytes::Bytes;

use crate::error::Refusal;
use crate::resp::parse_request;

/// When a SET applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetCondition {
    /// Always.
    #[default]
    Always,
    /// `NX`: only if the key is absent.
    IfAbsent,
    /// `NEX`: if the key is absent or already holds this value.
    IfAbsentOrEqual,
}

/// One state store command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `SET k v [NX|NEX] [PX ms]`
    Set {
        /// The key.
        key: Bytes,
        /// The value.
        value: Bytes,
        /// `NX`/`NEX`.
        condition: SetCondition,
        /// `PX`: time to live in milliseconds.
        px_ms: Option<u64>,
    },
    /// `GET k`
    Get {
        /// The key.
        key: Bytes,
    },
    /// `DEL k`
    Del {
        /// The key.
        key: Bytes,
    },
    /// `VDEL k v`: delete only if the key holds `v`.
    VDel {
        /// The key.
        key: Bytes,
        /// The value the key must hold.
        value: Bytes,
    },
    /// `KEYNOTIFY k [STOP]`
    KeyNotify {
        /// The key.
        key: Bytes,
        /// Stop observing instead of start.
        stop: bool,
    },
    /// `SCAN pattern [token]`
    Scan {
        /// A glob, see [`crate::glob`].
        pattern: Bytes,
        /// The token of the previous page, absent on the first request.
        token: Option<Bytes>,
    },
}

impl Command {
    /// Parses a request payload.
    pub fn parse(payload: &Bytes) -> Result<Self, Refusal> {
        let args = parse_request(payload)?;
        let (verb, rest) = args.split_first().ok_or(Refusal::Syntax)?;
        // Keys and values are kept as slices of the payload (no copy here).
        let nonempty = |key: &[u8]| nonempty(payload, key);
        let part = |arg: &[u8]| payload.slice_ref(arg);
        let is = |name: &[u8]| verb.eq_ignore_ascii_case(name);
        if is(b"SET") {
            let [key, value, options @ ..] = rest else {
                return Err(Refusal::WrongNumberOfArguments);
            };
            let key = nonempty(key)?;
            let (condition, px_ms) = set_options(options)?;
            Ok(Self::Set {
                key,
                value: part(value),
                condition,
                px_ms,
            })
        } else if is(b"GET") {
            let [key] = rest else {
                return Err(Refusal::WrongNumberOfArguments);
            };
            Ok(Self::Get {
                key: nonempty(key)?,
            })
        } else if is(b"DEL") {
            let [key] = rest else {
                return Err(Refusal::WrongNumberOfArguments);
            };
            Ok(Self::Del {
                key: nonempty(key)?,
            })
        } else if is(b"VDEL") {
            let [key, value] = rest else {
                return Err(Refusal::WrongNumberOfArguments);
            };
            Ok(Self::VDel {
                key: nonempty(key)?,
                value: part(value),
            })
        } else if is(b"KEYNOTIFY") {
            match rest {
                [key] => Ok(Self::KeyNotify {
                    key: nonempty(key)?,
                    stop: false,
                }),
                [key, option] => {
                    let key = nonempty(key)?;
                    if !option.eq_ignore_ascii_case(b"STOP") {
                        return Err(Refusal::Syntax);
                    }
                    Ok(Self::KeyNotify { key, stop: true })
                }
                _ => Err(Refusal::WrongNumberOfArguments),
            }
        } else if is(b"SCAN") {
            match rest {
                [pattern] => Ok(Self::Scan {
                    pattern: part(pattern),
                    token: None,
                }),
                [pattern, token] => Ok(Self::Scan {
                    pattern: part(pattern),
                    token: (!token.is_empty()).then(|| part(token)),
                }),
                _ => Err(Refusal::WrongNumberOfArguments),
            }
        } else {
            Err(Refusal::UnknownCommand)
        }
    }

    /// The key the command addresses (none for SCAN).
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Self::Set { key, .. }
            | Self::Get { key }
            | Self::Del { key }
            | Self::VDel { key, .. }
            | Self::KeyNotify { key, .. } => Some(key),
            Self::Scan { .. } => None,
        }
    }
}

/// `key` (a slice of `payload`) as shared bytes, unless it is empty.
fn nonempty(payload: &Bytes, key: &[u8]) -> Result<Bytes, Refusal> {
    if key.is_empty() {
        return Err(Refusal::KeyLengthZero);
    }
    Ok(payload.slice_ref(key))
}

/// `[NX|NEX] [PX ms]` in any order, each at most once, NX and NEX exclusive.
fn set_options(mut options: &[&[u8]]) -> Result<(SetCondition, Option<u64>), Refusal> {
    let mut condition = None;
    let mut px_ms = None;
    while let [option, rest @ ..] = options {
        options = rest;
        let new_condition = if option.eq_ignore_ascii_case(b"NX") {
            SetCondition::IfAbsent
        } else if option.eq_ignore_ascii_case(b"NEX") {
            SetCondition::IfAbsentOrEqual
        } else if option.eq_ignore_ascii_case(b"PX") {
            let [ms, rest @ ..] = options else {
                return Err(Refusal::Syntax);
            };
            options = rest;
            if px_ms.replace(positive_ms(ms)?).is_some() {
                return Err(Refusal::Syntax);
            }
            continue;
        } else {
            return Err(Refusal::Syntax);
        };
        if condition.replace(new_condition).is_some() {
            return Err(Refusal::Syntax);
        }
    }
    Ok((condition.unwrap_or_default(), px_ms))
}

fn positive_ms(arg: &[u8]) -> Result<u64, Refusal> {
    if arg.is_empty() || !arg.iter().all(u8::is_ascii_digit) {
        return Err(Refusal::Syntax);
    }
    let ms = arg.iter().try_fold(0u64, |acc, &b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    });
    match ms {
        Some(ms) if ms > 0 => Ok(ms),
        _ => Err(Refusal::Syntax),
    }
}
