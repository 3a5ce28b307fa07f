//! Several requests' calls in one pipeline ([`statehub_state_store::Engine::queue`]):
//! a machine that queues its clients' SETs, GETs, DELs and VDELs has them sent to
//! Redis together and answered in one round trip.
//!
//! Redis runs the commands of one connection in the order they arrive, so the scripts
//! of one pipeline take effect in the order queued, each seeing the ones before it (a
//! GET after a SET of its key reads it). What a script carries (the request's stamp,
//! the sweep before it: `carry.rs`) is taken when it is queued, as if every script
//! queued before it had run: a write merges every stamp, a read runs the sweep and
//! leaves the stamps to the next write (which merges them again, changing nothing).
//! A write whose script fails gives its stamps back for the next script.
//!
//! Scripts go by their hash, so the first pipeline on each connection begins by
//! loading them. A script Redis lacks answers `NOSCRIPT` and does nothing: when every
//! script from the first such answered so (a `SCRIPT FLUSH`, a failover to a server
//! without them), they are loaded and that tail is sent again, in order, once. A
//! `NOSCRIPT` followed by a script that ran (another connection loaded them meanwhile)
//! fails only its own request (503): resending it would run it after those behind it.
//!
//! Not with `WAIT` ([`crate::Options::wait`]): each write then waits for its replicas
//! on its own, one round trip per call.

use redis::{ErrorKind, RedisError, ScriptInvocation, Value};
use statehub_state_store::{Op, OpOutcome};

use super::*;

impl RedisEngine {
    /// See [`statehub_state_store::Engine::queue`].
    pub(crate) fn queue_op(&mut self, op: &Op) -> bool {
        if self.wait.is_some() {
            return false;
        }
        let write = !matches!(op, Op::Get { .. });
        let carried = self.carry.get_mut().take(write);
        self.queued.push((op.clone(), carried));
        true
    }

    /// See [`statehub_state_store::Engine::run_queued`]: one pipeline, one round trip
    /// (two when Redis lost the scripts).
    pub(crate) fn run_pipeline(&mut self) -> Vec<Result<OpOutcome, EngineError>> {
        let queued = std::mem::take(&mut self.queued);
        if queued.is_empty() {
            return Vec::new();
        }
        let load = !self.link.get_mut().has_scripts();
        let (mut replies, mut failure) = match self.send(&queued, load) {
            Ok(sent) => sent,
            Err(error) => return self.failed(&queued, error),
        };
        // A script answered NOSCRIPT did nothing: when every script from the first such
        // answered so (a `SCRIPT FLUSH`, a failover to a server without them), they are
        // loaded and that tail is sent again, in order, once.
        if let (None, Some(first)) = (&failure, unloaded_tail(&replies)) {
            replies.truncate(first);
            match self.send(&queued[first..], true) {
                Ok((tail, error)) => {
                    replies.extend(tail);
                    failure = error;
                }
                Err(error) => failure = Some(error),
            }
        }
        let mut outcomes: Vec<_> = queued
            .iter()
            .zip(replies)
            .map(|((op, carried), value)| self.outcome(op, carried, value))
            .collect();
        // The calls whose replies never came: Redis may or may not have run them, as
        // for a single call in flight when its connection fails (503).
        let answered = outcomes.len();
        if let Some(error) = failure {
            outcomes.extend(self.failed(&queued[answered..], error));
        }
        outcomes
    }

    /// Sends `queued`'s scripts in one pipeline, after loading them if `load` (in the
    /// pipeline itself, before them: in order, one round trip): their replies, in
    /// order, until one failed to arrive, and that failure. `Err`: none was sent.
    fn send(
        &mut self,
        queued: &[(Op, Carried)],
        load: bool,
    ) -> Result<(Vec<Value>, Option<RedisEngineError>), RedisEngineError> {
        let mut pipe = redis::pipe();
        if load {
            for code in &self.scripts.pipelined {
                pipe.cmd("SCRIPT").arg("LOAD").arg(code);
            }
        }
        let skip = pipe.len();
        for (op, carried) in queued {
            pipe.invoke_script(&self.invocation(op, carried));
        }
        let packed = pipe.get_packed_pipeline();
        let (mut values, failure) = self.link.get_mut().exchange(&packed, pipe.len());
        if values.len() < skip {
            return Err(failure.unwrap_or(RedisEngineError::Corrupt("pipeline replies")));
        }
        let loaded = values
            .drain(..skip)
            .all(|v| !matches!(v, Value::ServerError(_)));
        if load && loaded {
            self.link.get_mut().scripts_loaded();
        }
        Ok((values, failure))
    }

    /// Every call of `queued` failed with `error` (the first gets it, the others its
    /// text).
    fn failed(
        &mut self,
        queued: &[(Op, Carried)],
        error: RedisEngineError,
    ) -> Vec<Result<OpOutcome, EngineError>> {
        for (op, carried) in queued.iter().rev() {
            self.give_back(op, carried);
        }
        let text = error.to_string();
        let mut first = Some(error);
        queued
            .iter()
            .map(|_| {
                Err(match first.take() {
                    Some(error) => error.into(),
                    None => EngineError::Unavailable(text.clone().into()),
                })
            })
            .collect()
    }

    /// A write's stamps wait for the next script again once its own failed.
    fn give_back(&mut self, op: &Op, carried: &Carried) {
        if !matches!(op, Op::Get { .. }) {
            self.carry.get_mut().restore(carried);
        }
    }

    /// The script of a queued call, with what it carries.
    fn invocation<'s>(&'s self, op: &Op, carried: &Carried) -> ScriptInvocation<'s> {
        let mut invocation = match op {
            Op::Set { .. } => match op.set_request() {
                Some((request, limits)) => self.set_invocation(&request, limits),
                None => self.get_invocation(&[]),
            },
            Op::Get { key } => self.get_invocation(key),
            Op::Delete {
                key,
                expected,
                fencing_token,
                now_ms,
            } => self.delete_invocation(key, expected.as_deref(), fencing_token.as_ref(), *now_ms),
        };
        carried.append_args(&mut invocation);
        invocation
    }

    /// The GET script's invocation (the sweep, then the entry), before the sweep's
    /// arguments and the stamps.
    pub(crate) fn get_invocation(&self, key: &[u8]) -> ScriptInvocation<'_> {
        let names = &self.names;
        let mut invocation = self.scripts.get.prepare_invoke();
        names
            .entry_keys(&mut invocation, key)
            .key(&names.events)
            .arg(key)
            .arg(self.feed_len);
        invocation
    }

    /// A queued call's outcome from its reply in the pipeline.
    fn outcome(
        &mut self,
        op: &Op,
        carried: &Carried,
        value: Value,
    ) -> Result<OpOutcome, EngineError> {
        if let Value::ServerError(error) = value {
            let error = RedisError::from(error);
            if error.kind() == ErrorKind::NoScriptError {
                self.link.get_mut().scripts_missing();
            }
            let counters = self.link.get_mut().counters();
            counters
                .errors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.give_back(op, carried);
            return Err(RedisEngineError::Redis(error).into());
        }
        let reply = |what| move |_| corrupt(what);
        match op {
            Op::Get { .. } => {
                let mut fields: Vec<Option<Vec<u8>>> =
                    redis::from_owned_redis_value(value).map_err(reply("GET script reply"))?;
                match fields.get(..2) {
                    Some([Some(fed), Some(removed)]) => {
                        self.swept(fed, removed)?;
                    }
                    _ => return Err(corrupt("sweep reply")),
                }
                fields.drain(..2);
                Ok(OpOutcome::Get(self.entry(fields)?))
            }
            Op::Set { .. } => {
                let fields: Vec<Vec<u8>> =
                    redis::from_owned_redis_value(value).map_err(reply("SET script reply"))?;
                let fields = self.after_sweep(fields)?;
                Ok(OpOutcome::Set(self.set_outcome(&fields)?))
            }
            Op::Delete { .. } => {
                let fields: Vec<Vec<u8>> =
                    redis::from_owned_redis_value(value).map_err(reply("DEL script reply"))?;
                let fields = self.after_sweep(fields)?;
                Ok(OpOutcome::Delete(self.delete_outcome(&fields)?))
            }
        }
    }
}

/// Where the replies end in a run of `NOSCRIPT`s, if they do: the first of that run.
fn unloaded_tail(replies: &[Value]) -> Option<usize> {
    let unloaded = |v: &Value| matches!(v, Value::ServerError(e) if e.code() == "NOSCRIPT");
    let first = replies.iter().position(unloaded)?;
    replies[first..].iter().all(unloaded).then_some(first)
}
