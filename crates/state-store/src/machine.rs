//! The state store as a pure state machine.
//!
//! [`Machine::handle`] takes one request and the current time and returns the [`Reply`]
//! plus the [`Effect`]s the shell must carry out; it never does I/O nor reads a clock, so
//! tests can assert exact bytes and effects and drive time by hand.
//!
//! A request goes through these checks, in order, the first failure becoming the reply
//! `-ERR <text>`: payload ([`Command::parse`]), `__ts` and `__ft` syntax and range
//! (`malformed timestamp`: see [`crate::hlc`] for why a counter of `u64::MAX` is one),
//! their skew, `missing timestamp` on SET, authorization, then the command itself
//! (fencing, conditions, quotas: see [`Config`]).
//!
//! Expiry is active: before every request, and whenever the shell calls
//! [`Machine::expire`] (at [`Machine::next_expiry`]), keys whose PX has elapsed are removed
//! and observers get `NOTIFY DELETE` carrying the deletion's version; at most
//! [`EXPIRY_BATCH`] keys a call, so a burst of expiries is spread over several calls.

mod commands;
mod config;
mod counts;
mod observers;
mod pipelined;

use bytes::Bytes;

use crate::authz::{AllowAll, Authorizer, Operation};
use crate::command::Command;
use crate::engine::{Change, Engine, MemoryEngine, Op, WriteSeq};
use crate::error::{EngineError, FatalError, Refusal};
use crate::hlc::{check_skew, Hlc, HlcClock, Stamp};
use crate::notify;
use crate::resp::Response;
pub use config::{defaults, Config};
pub use counts::{Counts, COMMANDS, RESULTS};
use observers::Observers;
pub use pipelined::Pending;

/// Most expired keys one call removes (a request or [`Machine::expire`]), so that a
/// burst of expiries (100,000 keys took 50 ms in one go) never holds the store for long.
pub const EXPIRY_BATCH: usize = 1_000;

/// One request, as read from the MQTT PUBLISH. The strings are borrowed from the PUBLISH:
/// the machine copies what it keeps (an observer's client id, a fencing token).
#[derive(Clone)]
pub struct Request<'a> {
    /// The requesting MQTT client id: observations belong to it and notifications go to it.
    pub client_id: &'a str,
    /// The PUBLISH payload.
    pub payload: Bytes,
    /// The `__ts` user property, if present.
    pub timestamp: Option<&'a str>,
    /// The `__ft` user property, if present.
    pub fencing_token: Option<&'a str>,
    /// What the requester itself may do (the authorization rules' grants for its
    /// principal), asked about the key after the machine's own [`Authorizer`]; `None`
    /// when the shell has no such rules.
    pub access: Option<&'a dyn Authorizer>,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("client_id", &self.client_id)
            .field("payload", &self.payload)
            .field("timestamp", &self.timestamp)
            .field("fencing_token", &self.fencing_token)
            .field("access", &self.access.map(|_| ".."))
            .finish()
    }
}

impl Request<'_> {
    /// Whether the machine's authorizer and the requester's own grants both allow `op`
    /// on `key`.
    pub(crate) fn allowed(&self, authorizer: &impl Authorizer, key: &[u8], op: Operation) -> bool {
        authorizer.authorize(self.client_id, key, op)
            && self
                .access
                .is_none_or(|a| a.authorize(self.client_id, key, op))
    }
}

/// What to send back on the request's Response Topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The response payload.
    pub payload: Bytes,
    /// The `__ts` user property to attach (`version.to_string()`), if any.
    pub version: Option<Hlc>,
}

impl Reply {
    fn plain(response: &Response) -> Self {
        Self {
            payload: response.encode(),
            version: None,
        }
    }

    fn versioned(response: &Response, version: Hlc) -> Self {
        Self {
            payload: response.encode(),
            version: Some(version),
        }
    }
}

/// A notification to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The observing client; the topic is [`notify::notify_topic`] of it and `key`.
    pub client_id: String,
    /// The key that changed.
    pub key: Bytes,
    /// The exact NOTIFY payload.
    pub payload: Bytes,
    /// The `__ts` user property to attach: the version of the write or deletion.
    pub version: Hlc,
}

impl Notification {
    /// The topic to publish on.
    pub fn topic(&self) -> String {
        notify::notify_topic(self.client_id.as_bytes(), &self.key)
    }
}

/// Something the shell must do, in order, after a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Only from persistent engines, and then always first: the reply and every effect
    /// after this one may reveal writes that are not durable yet, so the shell must send
    /// nothing and carry out nothing of this outcome until the engine's writes through
    /// this sequence number are durable (see [`Engine::seal`]).
    AwaitDurable(WriteSeq),
    /// Publish a notification (QoS 1, Content Type `application/octet-stream`, `__ts`),
    /// straight into the observing client's session.
    Notify(Notification),
    /// `key` now expires at `at_ms`: make sure [`Machine::expire`] runs by then
    /// (equivalently, re-arm the timer at [`Machine::next_expiry`]).
    ArmExpiry {
        /// The key.
        key: Bytes,
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
    },
}

/// The result of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The response.
    pub reply: Reply,
    /// What else to do (expiry notifications due before this request come first).
    pub effects: Vec<Effect>,
}

/// Why a request did not produce a normal reply.
enum Failure {
    Refused(Refusal),
    Fatal(FatalError),
}

impl From<Refusal> for Failure {
    fn from(refusal: Refusal) -> Self {
        Self::Refused(refusal)
    }
}

impl From<EngineError> for Failure {
    fn from(error: EngineError) -> Self {
        Self::Fatal(error.into())
    }
}

/// The state store.
#[derive(Debug)]
pub struct Machine<E, A = AllowAll> {
    engine: E,
    authorizer: A,
    clock: HlcClock,
    observers: Observers,
    config: Config,
    counts: Counts,
}

impl Machine<MemoryEngine, AllowAll> {
    /// An empty in-memory store that allows everything.
    pub fn in_memory(config: Config) -> Self {
        Self {
            engine: MemoryEngine::new(),
            authorizer: AllowAll,
            clock: HlcClock::new(config.node_id.clone()),
            observers: Observers::default(),
            config,
            counts: Counts::default(),
        }
    }
}

impl<E: Engine, A: Authorizer> Machine<E, A> {
    /// A store over `engine`; its clock resumes past the greatest stored version.
    pub fn new(engine: E, authorizer: A, config: Config) -> Result<Self, FatalError> {
        let mut clock = HlcClock::new(config.node_id.clone());
        if let Some(max) = engine.max_version()? {
            clock.observe(&max);
        }
        Ok(Self {
            engine,
            authorizer,
            clock,
            observers: Observers::default(),
            config,
            counts: Counts::default(),
        })
    }

    /// A store over an engine shared with other nodes, which issues versions from its own
    /// clock ([`Engine::set_checked`] and the other checked writes): nothing is read at
    /// start, so the node starts even while the engine's storage is out of reach.
    pub fn shared(engine: E, authorizer: A, config: Config) -> Self {
        Self {
            clock: HlcClock::new(config.node_id.clone()),
            engine,
            authorizer,
            observers: Observers::default(),
            config,
            counts: Counts::default(),
        }
    }

    /// The engine, for inspection.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Requests and notifications so far.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Observations (KEYNOTIFY pairs of client and key) now.
    pub fn observations(&self) -> usize {
        self.observers.total()
    }

    /// Processes one request at `now_ms` (milliseconds since the Unix epoch).
    ///
    /// Refusals are replies (`-ERR ...`); `Err` means the engine failed and the node must
    /// stop serving the store.
    pub fn handle(&mut self, request: Request<'_>, now_ms: u64) -> Result<Outcome, FatalError> {
        let mut effects = Vec::new();
        let backlog = self.remove_expired(now_ms, &mut effects)?;
        let mut command = counts::INVALID;
        let reply = self.execute(&request, now_ms, backlog, &mut effects, &mut command);
        self.complete(command, reply, effects)
    }

    /// Counts a request's result and seals its writes: its outcome, or `Err` if the
    /// engine failed.
    fn complete(
        &mut self,
        command: usize,
        result: Result<Reply, Failure>,
        mut effects: Vec<Effect>,
    ) -> Result<Outcome, FatalError> {
        let reply = match result {
            Ok(reply) => {
                self.counts.request(command, true);
                reply
            }
            Err(Failure::Refused(refusal)) => {
                self.counts.request(command, false);
                Reply::plain(&Response::Error(refusal))
            }
            Err(Failure::Fatal(error)) => return Err(error),
        };
        self.seal(&mut effects)?;
        self.count_notifications(&effects);
        Ok(Outcome { reply, effects })
    }

    /// Removes keys whose expiry is `<= now_ms`, at most [`EXPIRY_BATCH`] of them,
    /// returning the `NOTIFY DELETE`s (after an [`Effect::AwaitDurable`] when the engine
    /// says so). When more were due, [`Machine::next_expiry`] is still `<= now_ms`: call
    /// again (after letting other work in).
    pub fn expire(&mut self, now_ms: u64) -> Result<Vec<Effect>, FatalError> {
        let mut effects = Vec::new();
        // Not carried: with nothing due (the usual case for a task that polls a
        // shared engine every second) this is one read, where a carried sweep would
        // be a write script that a replica-less or write-paused Redis holds up.
        self.sweep_due(now_ms, &mut effects)?;
        self.seal(&mut effects)?;
        self.count_notifications(&effects);
        Ok(effects)
    }

    /// What a reply revealing the store's current state must wait for, when it is not
    /// produced by [`Machine::handle`] (a cached reply re-sent, for instance): `Some`
    /// while a write handed to storage is not durable yet.
    pub fn pending_durability(&mut self) -> Result<Option<WriteSeq>, FatalError> {
        Ok(self.engine.seal(&self.clock)?)
    }

    /// Removes up to [`EXPIRY_BATCH`] expired keys; `true` if that many were removed,
    /// so that more may be due. An engine that carries the sweep itself
    /// ([`Engine::carry_sweep`]) also removes a request's own key then.
    fn remove_expired(
        &mut self,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<bool, FatalError> {
        if self.engine.carry_sweep(now_ms, EXPIRY_BATCH) {
            return Ok(false);
        }
        self.sweep_due(now_ms, effects)
    }

    /// Removes up to [`EXPIRY_BATCH`] keys due by `now_ms`, one engine call per key.
    fn sweep_due(&mut self, now_ms: u64, effects: &mut Vec<Effect>) -> Result<bool, FatalError> {
        let due = self.engine.expired(now_ms, EXPIRY_BATCH)?;
        for key in &due {
            self.remove_expired_key(key, now_ms, effects)?;
        }
        Ok(due.len() == EXPIRY_BATCH)
    }

    fn remove_expired_key(
        &mut self,
        key: &Bytes,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        if let Some(version) = self.engine.remove_expired(&mut self.clock, key, now_ms)? {
            self.notify(key, notify::delete_payload, &version, effects);
        }
        Ok(())
    }

    /// While more keys are due than one batch removes, a request's own key is removed
    /// first if due, so no request sees an expired key (SCAN skips them).
    fn expire_key_if_due(
        &mut self,
        key: &Bytes,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<(), EngineError> {
        self.remove_expired_key(key, now_ms, effects)
    }

    /// Ends the call's writes; a durability wait goes first.
    fn seal(&mut self, effects: &mut Vec<Effect>) -> Result<(), FatalError> {
        if let Some(seq) = self.engine.seal(&self.clock)? {
            effects.insert(0, Effect::AwaitDurable(seq));
        }
        Ok(())
    }

    /// When [`Machine::expire`] must next run, in milliseconds since the Unix epoch.
    pub fn next_expiry(&self) -> Result<Option<u64>, FatalError> {
        Ok(self.engine.next_expiry()?)
    }

    /// Drops every observation of `client_id` (its MQTT connection ended). The
    /// observations are gone even on `Err` (the engine could not be told that a key
    /// lost its last observer on this node; it then feeds that key's changes for
    /// nothing).
    pub fn client_disconnected(&mut self, client_id: &str) -> Result<(), FatalError> {
        for key in self.observers.drop_client(client_id) {
            self.engine.forget_key(&key)?;
        }
        Ok(())
    }

    /// The notifications of a change the engine fed (see
    /// [`Engine::publishes_changes`]): one per observer on this node that began
    /// observing the key before the change, in client id order.
    pub fn apply_change(&self, change: &Change) -> Vec<Effect> {
        let payload = match &change.value {
            Some(value) => notify::set_payload(value),
            None => notify::delete_payload(),
        };
        self.observers
            .of(&change.key)
            .filter(|(_, since)| *since < change.seq)
            .map(|(client_id, _)| {
                Effect::Notify(Notification {
                    client_id: client_id.clone(),
                    key: change.key.clone(),
                    payload: payload.clone(),
                    version: change.version.clone(),
                })
            })
            .collect()
    }

    /// Runs one request; `backlog` says expired keys may remain (see [`EXPIRY_BATCH`]).
    fn execute(
        &mut self,
        request: &Request<'_>,
        now_ms: u64,
        backlog: bool,
        effects: &mut Vec<Effect>,
        counted_as: &mut usize,
    ) -> Result<Reply, Failure> {
        let (command, fencing_token) = self.admit(request, now_ms, backlog, effects, counted_as)?;
        let client = request.client_id;
        let skip_due = backlog.then_some(now_ms);
        match command {
            Command::KeyNotify { key, stop } => self.key_notify(client, &key, stop),
            Command::Scan { pattern, token } => {
                self.scan(request, &pattern, token.as_deref(), skip_due)
            }
            command => {
                let Some(op) = self.op_of(command, fencing_token, now_ms) else {
                    return Err(Refusal::UnknownCommand.into());
                };
                if let Op::Get { key } = &op {
                    // Borrowed from an in-memory engine: no copy of the entry.
                    return Ok(commands::get_reply(self.engine.peek(key)?.as_deref()));
                }
                let outcome = op.run(&mut self.engine, &mut self.clock)?;
                self.reply_to(&op, outcome, effects)
            }
        }
    }

    /// The generic checks of a request, in order (see the module docs), then its key's
    /// expiry if due and its `__ts` merged: the command and its fencing token.
    fn admit(
        &mut self,
        request: &Request<'_>,
        now_ms: u64,
        backlog: bool,
        effects: &mut Vec<Effect>,
        counted_as: &mut usize,
    ) -> Result<(Command, Option<Hlc>), Failure> {
        let command = Command::parse(&request.payload)?;
        *counted_as = counts::index(&command);
        let timestamp = parse_hlc::<Stamp>(request.timestamp, |ts| *ts)?;
        let fencing_token = parse_hlc::<Hlc>(request.fencing_token, |ft| ft.into())?;
        let skew = self.config.max_skew_ms;
        if timestamp.is_some_and(|ts| !check_skew(ts, now_ms, skew)) {
            return Err(Refusal::TimestampSkew.into());
        }
        if fencing_token
            .as_ref()
            .is_some_and(|ft| !check_skew(ft, now_ms, skew))
        {
            return Err(Refusal::FencingTokenSkew.into());
        }
        if matches!(command, Command::Set { .. }) && timestamp.is_none() {
            return Err(Refusal::MissingTimestamp.into());
        }
        if let Some(key) = command.key() {
            if !request.allowed(&self.authorizer, key, operation(&command)) {
                return Err(Refusal::NotAuthorized.into());
            }
        }
        if let (true, Some(key)) = (backlog, command.key()) {
            self.expire_key_if_due(key, now_ms, effects)?;
        }
        self.engine
            .observe_request(&mut self.clock, timestamp, now_ms);
        Ok((command, fencing_token))
    }

    fn count_notifications(&mut self, effects: &[Effect]) {
        let n = effects
            .iter()
            .filter(|e| matches!(e, Effect::Notify(_)))
            .count();
        self.counts.notifications += n as u64;
    }

    /// One effect per observer of `key`, in client id order. The payload is built only
    /// when someone observes the key (a SET's copies its value). Nothing when the engine
    /// feeds its changes: [`Machine::apply_change`] notifies then.
    fn notify(
        &self,
        key: &Bytes,
        payload: impl FnOnce() -> Bytes,
        version: &Hlc,
        effects: &mut Vec<Effect>,
    ) {
        if self.engine.publishes_changes() {
            return;
        }
        let mut observers = self.observers.of(key).peekable();
        if observers.peek().is_none() {
            return;
        }
        let payload = payload();
        for (client_id, _) in observers {
            effects.push(Effect::Notify(Notification {
                client_id: client_id.clone(),
                key: key.clone(),
                payload: payload.clone(),
                version: version.clone(),
            }));
        }
    }
}

/// A `__ts` or `__ft`: `malformed timestamp` unless it is an HLC in range (one the clock
/// can merge and still advance past, see [`Stamp::in_range`]).
fn parse_hlc<T: std::str::FromStr>(
    property: Option<&str>,
    stamp: fn(&T) -> Stamp,
) -> Result<Option<T>, Refusal> {
    property
        .map(|s| match s.parse::<T>() {
            Ok(hlc) if stamp(&hlc).in_range() => Ok(hlc),
            _ => Err(Refusal::MalformedTimestamp),
        })
        .transpose()
}

fn operation(command: &Command) -> Operation {
    match command {
        Command::Set { .. } => Operation::Set,
        Command::Get { .. } => Operation::Get,
        Command::Del { .. } | Command::VDel { .. } => Operation::Delete,
        Command::KeyNotify { .. } => Operation::KeyNotify,
        Command::Scan { .. } => Operation::Scan,
    }
}
