//! One shard's state ([`State`]): running a request in its machine and building the
//! response, and what it takes besides the payload ([`Call`]).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use statehub_broker::codec::PublishProperties;
use statehub_broker::{LogLimit, Message};
use statehub_state_store::{unix_ms, Effect, FatalError, Request};
use statehub_state_store_durable::is_no_space;

use crate::cache::{self, CacheKey, CachedReply};
use crate::{durable, rpc, Authorizer, Engine, State};

/// Logs that the engine's storage is out of reach (at most once every ten seconds).
pub(crate) fn log_unavailable(error: &FatalError) {
    static LOG: LogLimit = LogLimit::per_secs(10);
    if let Some(left_out) = LOG.allow() {
        let source = std::error::Error::source(error).and_then(std::error::Error::source);
        tracing::warn!(
            error = %error,
            cause = source.map(ToString::to_string),
            left_out,
            "state store storage unavailable; requests are answered 503 until it is back"
        );
    }
}

/// A request as [`State::execute`] needs it besides its payload.
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    pub(crate) client_id: &'a str,
    pub(crate) props: &'a PublishProperties,
    /// The user properties the store reads.
    pub(crate) request: rpc::RequestProps<'a>,
    /// The Response Topic.
    pub(crate) topic: &'a str,
    pub(crate) deadline: Instant,
    /// Whether writes wait for disk space.
    pub(crate) stalled: bool,
    /// The requester's grants ([`ClientInfo::access`]).
    pub(crate) access: Option<&'a dyn Authorizer>,
}

/// A request's response, as [`State::execute`] builds it.
pub(crate) enum Answer {
    /// `__stat=200`, with the store's reply: the cache keeps it.
    Ok(CachedReply),
    /// The store is unavailable. Boxed: a request's answer is moved a few times, and
    /// this rare one would make every answer as large as a message.
    Fault(Box<Message>),
}

impl<E, A> State<E, A> {
    /// The engine failed: the store's state is unknown, so it answers 503 from now on and
    /// forgets every cached answer (they may answer writes that are now lost). Logged once.
    pub(crate) fn fail(&mut self, error: &dyn std::error::Error) {
        if !self.failed {
            tracing::error!(error = %error, "state store engine failed; the store now answers 503");
            self.failed = true;
            self.cache.clear();
        }
    }
}

impl<E: Engine, A: Authorizer> State<E, A> {
    /// The reply message of `answer` to the request whose cache lookup missed at `at`;
    /// a `__stat=200` answer is cached.
    pub(crate) fn record(
        &mut self,
        answer: Answer,
        at: cache::Vacancy,
        key: CacheKey,
        received: Instant,
    ) -> Arc<Message> {
        match answer {
            Answer::Ok(ok) => {
                let reply = ok.message_for(key.client_id.clone());
                self.cache.insert(at, key.client_id, ok, &reply, received);
                reply
            }
            // A failed store answers so for good, a full disk until there is room: a
            // resent request is answered anew, without the cache.
            Answer::Fault(fault) => Arc::new(fault.for_client(key.client_id)),
        }
    }

    /// A cached reply re-sent reveals the current state: with a persistent engine it
    /// waits for whatever is in flight.
    pub(crate) fn resend_effects(&mut self, durable: bool) -> Vec<Effect> {
        if !durable || self.failed {
            return Vec::new();
        }
        match self.machine.pending_durability() {
            Ok(seq) => seq.map(Effect::AwaitDurable).into_iter().collect(),
            Err(e) => {
                self.fail(&e);
                Vec::new()
            }
        }
    }

    /// Runs one request in the machine and builds its response.
    pub(crate) fn execute(&mut self, call: &Call<'_>, payload: Bytes) -> (Answer, Vec<Effect>) {
        let Call {
            client_id,
            props,
            request: user,
            topic,
            deadline,
            stalled,
            access,
        } = *call;
        let correlation = props.correlation_data.as_deref();
        let fault = |fault: rpc::Fault| {
            Answer::Fault(Box::new(rpc::fault_response(
                topic.into(),
                correlation.map(Bytes::copy_from_slice),
                &fault,
                deadline,
            )))
        };
        if self.failed {
            return (fault(rpc::Fault::unavailable()), Vec::new());
        }
        let now = unix_ms(SystemTime::now());
        // While writes wait for disk space, expired keys are removed first, on their own:
        // a write refused below would otherwise take their notifications with it.
        let expiry = match stalled.then(|| self.machine.expire(now)) {
            None => Vec::new(),
            // Only its notifications reveal anything: without, it need not wait.
            Some(Ok(effects)) if !effects.iter().any(|e| matches!(e, Effect::Notify(_))) => effects
                .into_iter()
                .filter(|e| !matches!(e, Effect::AwaitDurable(_)))
                .collect(),
            Some(Ok(effects)) => effects,
            Some(Err(e)) => {
                self.fail(&e);
                return (fault(rpc::Fault::unavailable()), Vec::new());
            }
        };
        let request = Request {
            client_id,
            payload,
            timestamp: user.timestamp,
            fencing_token: user.fencing_token,
            access,
        };
        let outcome = self.machine.handle(request, now);
        self.conclude(call, outcome, expiry)
    }

    /// The response to a request the machine handled (`outcome`), after the effects of
    /// an expiry run before it.
    pub(crate) fn conclude(
        &mut self,
        call: &Call<'_>,
        outcome: Result<statehub_state_store::Outcome, FatalError>,
        expiry: Vec<Effect>,
    ) -> (Answer, Vec<Effect>) {
        let correlation = call.props.correlation_data.as_deref();
        let fault = |fault: rpc::Fault| {
            Answer::Fault(Box::new(rpc::fault_response(
                call.topic.into(),
                correlation.map(Bytes::copy_from_slice),
                &fault,
                call.deadline,
            )))
        };
        // Failed since this request's call went out (an earlier request of its run,
        // `batch.rs`): it answers as it would have had it come after that one alone.
        if self.failed {
            return (fault(rpc::Fault::unavailable()), Vec::new());
        }
        match outcome {
            Ok(outcome) => {
                let version = outcome.reply.version.as_ref();
                let parts = rpc::OkParts::new(call.topic, correlation, version);
                let reply = CachedReply {
                    parts,
                    payload: outcome.reply.payload,
                    deadline: call.deadline,
                };
                (Answer::Ok(reply), durable::merge(expiry, outcome.effects))
            }
            // The engine refused a write for want of disk space before changing anything:
            // this request fails, the store goes on (`statehub_state_store_durable`).
            Err(e) if is_no_space(&e) => (fault(rpc::Fault::no_space()), expiry),
            // A networked engine's server is out of reach: this request fails, the next
            // may succeed (the node keeps no state that the failure could have torn).
            Err(e) if e.is_unavailable() => {
                log_unavailable(&e);
                (fault(rpc::Fault::unavailable()), expiry)
            }
            Err(e) => {
                self.fail(&e);
                (fault(rpc::Fault::unavailable()), Vec::new())
            }
        }
    }
}
