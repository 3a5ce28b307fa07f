//! The MQTT shell of statehub's state store.
//!
//! The store itself (`statehub-state-store`) is pure logic; this crate connects it to the
//! broker through the built-in service hooks, so that requests never travel through the
//! subscription index and answers can go straight into a client's session:
//!
//! * every PUBLISH on [`REQUEST_TOPIC`] reaches [`StateStoreService::on_publish`] before
//!   its PUBACK. QoS 0 requests are answered with a fault that says QoS 1 is required
//!   (`rpc::qos0_response`): the protocol requires it and the SDKs never send QoS 0, but
//!   hand-made requests (`mosquitto_rr` without `-q 1`) do. A request without Response
//!   Topic cannot be answered and is dropped; one whose Response Topic is the request topic or lies in the store's
//!   notification space gets its client disconnected (0x82), as the protocol page says.
//! * RPC faults (missing Correlation Data or Message Expiry, a `__protVer` of another
//!   major) are answered the way the SDKs' command executor answers them (`rpc.rs`).
//! * Otherwise the request runs in the [`Machine`] (behind a short mutex, never held
//!   across an await) and the reply is published on the Response Topic through the
//!   normal routing path, as a real MQTT responder would, but addressed to the
//!   requester ([`Message::recipient`]): it receives it through its subscription, and no
//!   other client does, whatever it subscribed to (`#` included).
//! * With authorization rules, each key is checked against the requester's grants
//!   ([`ClientInfo::access`]); a denied key is `-ERR not authorized`, and SCAN leaves
//!   out the keys it may not read.
//! * A QoS 1 redelivery of a request is answered from a cache (`cache.rs`).
//! * Notifications go straight into the observer's session with
//!   [`Broker::deliver_to`], exactly once, whether or not it subscribed to the notify
//!   topic (the .NET SDK relies on that); they are never routed, so a client that did
//!   subscribe does not get two copies.
//! * Expiry is active: [`StateStoreService::run_expiry`] (`expiry.rs`) sleeps until the
//!   next key expires and sends the `NOTIFY DELETE`s (see `expiry.rs` for why).
//! * A client's observations end with its connection.
//! * With a persistent engine ([`StateStoreService::open_durable`]), nothing is sent
//!   (reply, notification, PUBACK) before the writes it reveals are durable
//!   (`durable.rs`); the service waits for that through the engine's
//!   [`statehub_state_store_durable::Progress`], never touching the storage itself. A
//!   full disk is not a failure: writes are answered 503 ("disk is full") while reads go
//!   on, and the store takes writes again by itself once there is room.
//! * [`Settings`] (`settings.rs`) is the `[state_store]` table of the configuration file.

mod batch;
mod cache;
mod durable;
mod expiry;
mod offload;
mod on_thread;
mod refuse;
mod rpc;
mod settings;
mod shards;
mod snapshot;
mod state;

use std::fmt::Debug;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use statehub_broker::codec::{ByteString, Publish, PublishProperties, QoS};
use statehub_broker::{BoxFuture, Broker, ClientInfo, Message, Service};
use statehub_state_store::{
    unix_ms, AllowAll, Effect, FatalError, Machine, MemoryEngine, TIMESTAMP_PROPERTY,
};
use statehub_state_store_durable::Progress;
use statehub_stats::Histogram;
use tokio::sync::Notify;

use cache::{CacheKey, Lookup, ResponseCache};
use durable::{Durability, FeedApplied, Next, Tracker};
use offload::Offload;
use shards::Shards;
use state::Call;

pub use rpc::{is_forbidden_response_topic, CONTENT_TYPE, PROTOCOL_VERSION};
pub use settings::Settings;
pub use settings::SettingsError;
pub use snapshot::Snapshot;
pub use statehub_state_store::{
    Authorizer, Change, Counts, Engine, Stats, COMMANDS, REQUEST_TOPIC, RESULTS,
};
pub use statehub_state_store_durable::DurableEngine;

/// The state store as a broker service. Register it on [`REQUEST_TOPIC`] and spawn
/// [`StateStoreService::run_expiry`].
#[derive(Debug)]
pub struct StateStoreService<E = MemoryEngine, A = AllowAll> {
    /// The machines (`shards.rs`): one, or one per Redis connection.
    shards: Shards<E, A>,
    /// Wakes the expiry task when a key gets a new expiry.
    rearm: Notify,
    /// Set for a persistent engine: replies wait for durability.
    durability: Option<Durability>,
    /// From a request's arrival to its reply published (durable, with a persistent
    /// engine).
    latency: Histogram,
    /// Set for an engine that blocks on the network: the threads that make its calls
    /// (`offload.rs`), one per shard.
    offload: OnceLock<Box<[Offload<Self, batch::Queued>]>>,
}

/// The durable store cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The `[state_store]` settings are invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// The stored state could not be loaded.
    #[error("cannot load the state store from {dir}")]
    Load {
        /// The data directory.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: FatalError,
    },
}

#[derive(Debug)]
struct State<E, A> {
    machine: Machine<E, A>,
    cache: ResponseCache,
    /// Set once the engine failed: the store's state is unknown, so it answers 503.
    failed: bool,
}

impl StateStoreService {
    /// An empty in-memory store.
    pub fn in_memory(settings: &Settings) -> Result<Self, SettingsError> {
        Ok(Self::with_machine(
            Machine::in_memory(settings.machine_config()?),
            settings,
        ))
    }
}

impl StateStoreService<DurableEngine> {
    /// The store persisted by `engine` (loaded with [`DurableEngine::open`]): drops the
    /// keys that expired while it was down (nobody observes yet, so without
    /// notifications), and from then on answers only once writes are durable.
    pub fn open_durable(settings: &Settings, engine: DurableEngine) -> Result<Self, OpenError> {
        let config = settings.machine_config()?;
        let progress = engine.progress();
        let dir = engine.data_dir().to_owned();
        let load = |source: FatalError| OpenError::Load {
            dir: dir.clone(),
            source,
        };
        let mut machine = Machine::new(engine, AllowAll, config).map_err(load)?;
        machine.expire(unix_ms(SystemTime::now())).map_err(load)?;
        Ok(Self::with_durability(machine, settings, progress))
    }
}

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// A service over an existing machine (another engine, another authorizer).
    pub fn with_machine(machine: Machine<E, A>, settings: &Settings) -> Self {
        Self::with_machines(machine, Vec::new(), settings)
    }

    fn with_machines(first: Machine<E, A>, rest: Vec<Machine<E, A>>, settings: &Settings) -> Self {
        Self {
            shards: Shards::new(first, rest, settings),
            rearm: Notify::new(),
            durability: None,
            latency: Histogram::default(),
            offload: OnceLock::new(),
        }
    }

    /// A service over a persistent engine whose writes `progress` follows: replies wait
    /// for durability.
    pub fn with_durability(
        machine: Machine<E, A>,
        settings: &Settings,
        progress: Progress,
    ) -> Self {
        Self {
            durability: Some(Durability::new(Tracker::Storage(progress))),
            ..Self::with_machine(machine, settings)
        }
    }

    /// A service over an engine shared by several nodes, whose changes this node applies
    /// with [`StateStoreService::apply_change`]: a reply to a write that fed a change
    /// waits (up to `bound`) until this node applied it, so that this node's observers
    /// are notified first (`durable.rs`).
    ///
    /// `first` and each machine of `rest` serve their own share of the clients, each on
    /// its own connection to the engine (`shards.rs`); `first` also runs expiry. Give
    /// each machine's engine its own name for its observations
    /// ([`Engine::observe_key`]), as for a node of its own.
    pub fn with_change_feed(
        first: Machine<E, A>,
        rest: Vec<Machine<E, A>>,
        settings: &Settings,
        bound: Duration,
    ) -> Self {
        Self {
            durability: Some(Durability::new(Tracker::Feed(FeedApplied::new(bound)))),
            ..Self::with_machines(first, rest, settings)
        }
    }

    /// Notifies this node's observers of a change that the engine fed (an engine shared
    /// by several nodes, see [`Engine::publishes_changes`]). Call it from one task, in
    /// the feed's order.
    pub fn apply_change(&self, broker: &Broker, change: &Change) {
        // Each client observes through its own shard only: one notification per
        // observer, in the feed's order.
        for shard in self.shards.iter() {
            let effects = shard.lock().machine.apply_change(change);
            self.carry_out(broker, effects);
        }
        if let Some(durability) = &self.durability {
            if let Tracker::Feed(feed) = durability.progress() {
                feed.applied(change.seq);
            }
        }
    }

    /// Marks the store failed (see [`State::fail`]).
    fn fail(&self, error: &dyn std::error::Error) {
        for shard in self.shards.iter() {
            shard.lock().fail(error);
        }
    }

    /// Handles one request; `Some` when its answer is held until that write is durable:
    /// what to wait for, and the request's deadline.
    fn handle(
        &self,
        shard: usize,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<(statehub_state_store::WriteSeq, Instant)> {
        let client_id = &*from.client_id;
        let props = &publish.properties;
        let (response_topic, request) = match refuse::screen(publish) {
            Ok(screened) => screened,
            Err(why) => {
                refuse::answer(broker, from, publish, why);
                return None;
            }
        };
        // The broker's clock, which its outboxes expire messages by.
        let received = broker.now();
        let deadline = rpc::deadline(props, received);
        // Looked up with the request's own Correlation Data (a slice of the read buffer);
        // stored under the reply's copy, so a cached entry never pins that buffer.
        let lookup = CacheKey {
            client_id: from.client_id.clone(),
            correlation: props.correlation_data.clone().unwrap_or_default(),
        };
        let next = self.shards.run(shard, |state| {
            let (reply, effects) = match state.cache.lookup(&lookup, received) {
                Lookup::Hit(reply) => {
                    let effects = state.resend_effects(self.durability.is_some());
                    (Some(reply), effects)
                }
                Lookup::Late => (None, Vec::new()),
                Lookup::Miss(at) => {
                    let call = Call {
                        client_id,
                        props,
                        request,
                        topic: response_topic,
                        deadline,
                        stalled: self.stalled(),
                        access: from.access.as_deref().map(|a| a as &dyn Authorizer),
                    };
                    let (answer, effects) = state.execute(&call, publish.payload.clone());
                    let reply = state.record(answer, at, lookup, received);
                    (Some(reply), effects)
                }
            };
            self.next(reply, effects)
        });
        self.dispatch(broker, next).map(|seq| (seq, deadline))
    }

    /// Holds the outcome if a persistent engine says it must wait. Under the state lock.
    fn next(&self, reply: Option<Arc<Message>>, effects: Vec<Effect>) -> Next {
        match &self.durability {
            Some(durability) => durability.hold(reply, effects),
            None => Next::Now(reply, effects),
        }
    }

    /// Whether writes wait for disk space (a persistent engine's storage is full).
    fn stalled(&self) -> bool {
        self.durability
            .as_ref()
            .is_some_and(|d| d.progress().stalled())
    }

    /// Publishes an outcome that need not wait; returns what a held one waits for.
    fn dispatch(&self, broker: &Broker, next: Next) -> Option<statehub_state_store::WriteSeq> {
        match next {
            Next::Now(reply, effects) => {
                self.carry_out(broker, effects);
                if let Some(reply) = reply {
                    broker.publish(reply);
                }
                None
            }
            Next::Wait(seq) => Some(seq),
        }
    }

    /// Publishes notifications and re-arms the expiry timer, in the order given.
    fn carry_out(&self, broker: &Broker, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Notify(n) => {
                    let publish = Publish {
                        dup: false,
                        qos: QoS::AtLeastOnce,
                        retain: false,
                        topic: ByteString::from(n.topic()),
                        packet_id: None,
                        payload: n.payload,
                        properties: PublishProperties {
                            content_type: Some(ByteString::from_static(CONTENT_TYPE)),
                            user_properties: vec![(
                                TIMESTAMP_PROPERTY.into(),
                                n.version.to_string().into(),
                            )],
                            ..PublishProperties::default()
                        },
                    };
                    if let Err(e) = broker.deliver_to(&n.client_id, publish) {
                        tracing::debug!(client = n.client_id, error = %e, "notification not delivered");
                    }
                }
                Effect::ArmExpiry { .. } => self.rearm.notify_one(),
                Effect::AwaitDurable(_) => {}
            }
        }
    }
}

impl<E, A> Service for StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    fn on_publish<'a>(
        &'a self,
        broker: &'a Broker,
        from: &'a ClientInfo,
        publish: &'a Publish,
    ) -> BoxFuture<'a, ()> {
        let received = Instant::now();
        let Some(durability) = &self.durability else {
            self.handle(0, broker, from, publish);
            self.latency.record(received.elapsed());
            return statehub_broker::done();
        };
        Box::pin(async move {
            durability.progress().admit().await;
            let shard = self.shards.index_of(&from.client_id);
            let held = match self.offload.get() {
                None => self.handle(shard, broker, from, publish),
                Some(offloads) => {
                    self.handle_on_thread(offloads, shard, broker, from, publish)
                        .await
                }
            };
            if let Some((seq, deadline)) = held {
                self.finish(broker, durability, seq, Some(deadline)).await;
            }
            self.latency.record(received.elapsed());
        })
    }

    fn start_publish(
        self: Arc<Self>,
        broker: &Broker,
        from: &ClientInfo,
        publish: &Publish,
    ) -> Option<BoxFuture<'static, ()>> {
        self.start_on_thread(broker, from, publish)
    }

    fn answers_in_place(&self) -> bool {
        self.durability.is_none()
    }

    fn on_connection_closed(&self, _broker: &Broker, client_id: &str) {
        let shard = self.shards.index_of(client_id);
        match self.offload.get().and_then(|o| o.get(shard)) {
            // After the client's queued requests, even with its thread's queue full:
            // never on the MQTT worker that calls this.
            Some(offload) => {
                let client_id = client_id.to_owned();
                offload.run_later(move |service: &Self| {
                    service.drop_observations(shard, &client_id);
                });
            }
            None => self.drop_observations(shard, client_id),
        }
    }
}
