//! One client's requests without waiting for each one's answer: [`Machine::begin`]
//! queues a request's one engine call, [`Machine::finish`] runs every queued call (for an
//! engine that makes round trips, together: one round trip for them all) and turns each
//! outcome into its request's [`Outcome`], in the order begun.
//!
//! Why the result is the one [`Machine::handle`] gives, one request after another:
//! what the machine computes before a SET, GET, DEL or VDEL's call (parsing, the
//! generic checks, authorization, the request's stamp and sweep handed to the engine)
//! depends only on the request, the configuration and the time, never on an earlier
//! request's answer; the engine runs the queued calls in order, each as if made alone
//! ([`Engine::queue`]); and each outcome becomes its reply in order, with what the
//! machine holds (counts, observations) as it was after the requests before it.
//! KEYNOTIFY and SCAN depend on earlier answers (the observations, a SCAN's pages), so
//! [`Machine::begin`] leaves them to [`Machine::handle`], after what is queued.

use super::{counts, Effect, Failure, Machine, Outcome, Request};
use crate::authz::Authorizer;
use crate::command::Command;
use crate::engine::{Engine, Op, OpOutcome};
use crate::error::{EngineError, FatalError};

/// A request [`Machine::begin`] took: its call queued, or its refusal known.
#[derive(Debug)]
pub struct Pending {
    /// Which command it was counted as.
    command: usize,
    /// Its effects so far (expiries due before it, with an engine that does not carry
    /// its sweep).
    effects: Vec<Effect>,
    step: Step,
}

#[derive(Debug)]
enum Step {
    /// The engine queued the call: its outcome comes from [`Engine::run_queued`].
    Queued(Op),
    /// Run already (an engine that does not queue), or refused before any call.
    Done(Result<OpOutcome, EngineError>, Op),
    Refused(Failure),
}

impl std::fmt::Debug for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused(refusal) => write!(f, "Refused({refusal:?})"),
            Failure::Fatal(error) => write!(f, "Fatal({error})"),
        }
    }
}

impl<E: Engine, A: Authorizer> Machine<E, A> {
    /// Whether [`Machine::begin`] takes this payload (a SET, GET, DEL or VDEL, or a
    /// payload refused before any engine call); the other requests go to
    /// [`Machine::handle`] once what was begun is finished.
    pub fn can_begin(payload: &bytes::Bytes) -> bool {
        !matches!(
            Command::parse(payload),
            Ok(Command::KeyNotify { .. } | Command::Scan { .. })
        )
    }

    /// Begins one request at `now_ms`: its engine call is queued behind those begun
    /// before (see the module docs), or, for an engine that does not queue, made now.
    /// `None` for a request [`Machine::can_begin`] refuses (checked first): nothing was
    /// done; finish what is begun, then [`Machine::handle`] it.
    pub fn begin(
        &mut self,
        request: &Request<'_>,
        now_ms: u64,
    ) -> Result<Option<Pending>, FatalError> {
        if !Self::can_begin(&request.payload) {
            return Ok(None);
        }
        let mut effects = Vec::new();
        let backlog = self.remove_expired(now_ms, &mut effects)?;
        let mut command = counts::INVALID;
        let admitted = self.admit(request, now_ms, backlog, &mut effects, &mut command);
        let op = match admitted.map(|(c, token)| self.op_of(c, token, now_ms)) {
            Ok(Some(op)) => op,
            result => {
                // Refused (no `__ts`, skew, authorization...): its sweep stays for
                // the next seal, as alone, so the versions issued are the ones a
                // request at a time gets (`differential.rs`).
                // `Ok(None)`: a command without its one call, which `can_begin` keeps
                // out; failing loudly beats answering it from a half-begun state.
                let failure = result.err().unwrap_or_else(|| {
                    Failure::Fatal(
                        EngineError::Backend("begun without an engine call".into()).into(),
                    )
                });
                return Ok(Some(Pending {
                    command,
                    effects,
                    step: Step::Refused(failure),
                }));
            }
        };
        let step = if self.engine.queue(&op) {
            Step::Queued(op)
        } else {
            Step::Done(op.run(&mut self.engine, &mut self.clock), op)
        };
        Ok(Some(Pending {
            command,
            effects,
            step,
        }))
    }

    /// Runs the calls queued by [`Machine::begin`] and returns each request's outcome
    /// (`Err`: the engine failed, as from [`Machine::handle`]), in the order begun.
    /// `pending` must be every request begun since the last call, in order.
    pub fn finish(&mut self, pending: Vec<Pending>) -> Vec<Result<Outcome, FatalError>> {
        let mut outcomes = self.engine.run_queued().into_iter();
        pending
            .into_iter()
            .map(
                |Pending {
                     command,
                     mut effects,
                     step,
                 }| {
                    let reply = match step {
                        Step::Refused(failure) => Err(failure),
                        Step::Queued(op) => {
                            let outcome = outcomes.next().unwrap_or_else(|| {
                                Err(EngineError::Backend("a queued call without outcome".into()))
                            });
                            self.conclude(&op, outcome, &mut effects)
                        }
                        Step::Done(outcome, op) => self.conclude(&op, outcome, &mut effects),
                    };
                    self.complete(command, reply, effects)
                },
            )
            .collect()
    }

    fn conclude(
        &mut self,
        op: &Op,
        outcome: Result<OpOutcome, EngineError>,
        effects: &mut Vec<Effect>,
    ) -> Result<super::Reply, Failure> {
        self.reply_to(op, outcome?, effects)
    }
}
