//! One request's engine call, as a value: what lets an engine that makes round trips
//! send several requests' calls before any answer has come back ([`Engine::queue`],
//! [`crate::Machine::begin`]).
//!
//! SET, GET, DEL and VDEL each make exactly one engine call, and what the machine
//! computes before it (parsing, the generic checks, authorization) depends on no
//! earlier request's answer: only on the request, the configuration and the time. So
//! the machine can build the call, queue it, and turn its outcome into the reply later,
//! in order. KEYNOTIFY (its quota and registration depend on the observations earlier
//! requests made) and SCAN (several reads, each after the previous one's answer) are
//! not calls of this kind.

use bytes::Bytes;

use super::{DelOutcome, Engine, Entry, Limits, SetOutcome, SetRequest};
use crate::command::SetCondition;
use crate::error::EngineError;
use crate::hlc::{Hlc, HlcClock};

/// A request's one engine call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// [`Engine::set_checked`].
    Set {
        /// The key (a slice of the request).
        key: Bytes,
        /// The value (a slice of the request).
        value: Bytes,
        /// `NX`, `NEX` or none.
        condition: SetCondition,
        /// `PX`, in milliseconds.
        px_ms: Option<u64>,
        /// The request's `__ft`.
        fencing_token: Option<Hlc>,
        /// The time of the request.
        now_ms: u64,
        /// The quotas it is checked against.
        limits: Limits,
    },
    /// [`Engine::peek`].
    Get {
        /// The key.
        key: Bytes,
    },
    /// [`Engine::delete_checked`] (VDEL when `expected` is given).
    Delete {
        /// The key.
        key: Bytes,
        /// VDEL's value.
        expected: Option<Bytes>,
        /// The request's `__ft`.
        fencing_token: Option<Hlc>,
        /// The time of the request.
        now_ms: u64,
    },
}

/// What an [`Op`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutcome {
    /// Of [`Op::Set`].
    Set(SetOutcome),
    /// Of [`Op::Get`]: the entry, if any (expired entries included until removed).
    Get(Option<Entry>),
    /// Of [`Op::Delete`].
    Delete(DelOutcome),
}

impl Op {
    /// The SET request of an [`Op::Set`].
    pub fn set_request(&self) -> Option<(SetRequest<'_>, &Limits)> {
        match self {
            Op::Set {
                key,
                value,
                condition,
                px_ms,
                fencing_token,
                now_ms,
                limits,
            } => Some((
                SetRequest {
                    key,
                    value,
                    condition: *condition,
                    px_ms: *px_ms,
                    fencing_token: fencing_token.as_ref(),
                    now_ms: *now_ms,
                },
                limits,
            )),
            _ => None,
        }
    }

    /// Runs the call on `engine` now, as the machine does for an engine that does not
    /// queue calls.
    pub fn run<E: Engine + ?Sized>(
        &self,
        engine: &mut E,
        clock: &mut HlcClock,
    ) -> Result<OpOutcome, EngineError> {
        if let Some((request, limits)) = self.set_request() {
            return engine
                .set_checked(clock, &request, limits)
                .map(OpOutcome::Set);
        }
        match self {
            Op::Set { .. } => Err(EngineError::Backend("a SET without its request".into())),
            Op::Get { key } => Ok(OpOutcome::Get(engine.get(key)?)),
            Op::Delete {
                key,
                expected,
                fencing_token,
                now_ms,
            } => engine
                .delete_checked(
                    clock,
                    key,
                    expected.as_deref(),
                    fencing_token.as_ref(),
                    *now_ms,
                )
                .map(OpOutcome::Delete),
        }
    }
}
