//! The MQTT shell of statehub's state store.
//!
//! The store itself (`statehub-state-store`) is pure logic; this crate connects it to the
//! broker through the built-in service hooks, so that requests never travel through the
//! subscription index and answers can go straight into a client's session:
//!
//! * every PUBLISH on [`REQUEST_TOPIC`] reaches [`StateStoreService::on_publish`] before
//!   its PUBACK. QoS 0 requests are dropped (with a log): the protocol requires QoS 1 and
//!   the SDKs never send QoS 0. A request without Response Topic cannot be answered and is
//!   dropped too; one whose Response Topic is the request topic or lies in the store's
//!   notification space gets its client disconnected (0x82), as the protocol page says.
//! * RPC faults (missing Correlation Data or Message Expiry, a `__protVer` of another
//!   major) are answered the way the SDKs' command executor answers them (`rpc.rs`).
//! * Otherwise the request runs in the [`Machine`] (behind a short mutex, never held
//!   across an await) and the reply is published on the Response Topic through the
//!   normal routing path, as a real MQTT responder would: the requester receives it
//!   through its subscription, and so does any other subscriber of that topic.
//! * A QoS 1 redelivery of a request is answered from a cache (`cache.rs`).
//! * Notifications go straight into the observer's session with
//!   [`Broker::deliver_to`], exactly once, whether or not it subscribed to the notify
//!   topic (the .NET SDK relies on that); they are never routed, so a client that did
//!   subscribe does not get two copies.
//! * Expiry is active: [`StateStoreService::run_expiry`] (`expiry.rs`) sleeps until the
//!   next key expires and sends the `NOTIFY DELETE`s (see its docs for why).
//! * A client's observations end with its connection.

mod cache;
mod rpc;
mod settings;

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use statehub_broker::codec::{ByteString, Publish, PublishProperties, QoS, ReasonCode};
use statehub_broker::{BoxFuture, Broker, ClientInfo, Message, Service};
use statehub_state_store::{
    unix_ms, AllowAll, Authorizer, Effect, Engine, Machine, MemoryEngine, Request,
    FENCING_TOKEN_PROPERTY, TIMESTAMP_PROPERTY,
};
use tokio::sync::Notify;

use cache::{CacheKey, Lookup, ResponseCache};

pub use settings::SettingsError;
pub use rpc::{is_forbidden_response_topic, CONTENT_TYPE, PROTOCOL_VERSION};
pub use settings::Settings;
pub use statehub_state_store::REQUEST_TOPIC;

/// The state store as a broker service. Register it on [`REQUEST_TOPIC`] and spawn
/// [`StateStoreService::run_expiry`].
#[derive(Debug)]
pub struct StateStoreService<E = MemoryEngine, A = AllowAll> {
    state: Mutex<State<E, A>>,
    /// Wakes the expiry task when a key gets a new expiry.
    rearm: Notify,
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
        Ok(Self::with_machine(Machine::in_memory(settings.machine_config()?), settings))
    }
}

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// A service over an existing machine (another engine, another authorizer).
    pub fn with_machine(machine: Machine<E, A>, settings: &Settings) -> Self {
        Self {
            state: Mutex::new(State { machine, cache: ResponseCache::new(settings.response_cache_entries), failed: false }),
            rearm: Notify::new(),
        }
    }

    fn handle(&self, broker: &Broker, from: &ClientInfo, publish: Publish) {
        let client_id = &*from.client_id;
        if publish.qos == QoS::AtMostOnce {
            tracing::debug!(client = client_id, "state store request with QoS 0 ignored");
            return;
        }
        let props = publish.properties;
        let Some(response_topic) = props.response_topic.clone() else {
            tracing::debug!(client = client_id, "state store request without Response Topic ignored");
            return;
        };
        if rpc::is_forbidden_response_topic(&response_topic) {
            tracing::info!(client = client_id, topic = &*response_topic, "reserved Response Topic; disconnecting");
            broker.disconnect_client(client_id, ReasonCode::PROTOCOL_ERROR);
            return;
        }
        if !rpc::is_publishable(&response_topic) {
            tracing::debug!(client = client_id, "state store request with an invalid Response Topic ignored");
            return;
        }
        let received = Instant::now();
        let deadline = rpc::deadline(&props, received);
        let correlation = props.correlation_data.clone();
        if let Err(fault) = rpc::check(&props) {
            broker.publish(rpc::fault_response(response_topic, correlation, &fault, deadline));
            return;
        }
        let key = CacheKey { client_id: client_id.to_owned(), correlation: correlation.clone().unwrap_or_default() };
        let (reply, effects) = {
            let mut state = self.state.lock();
            match state.cache.lookup(&key, received) {
                Lookup::Hit(reply) => (Some(reply), Vec::new()),
                Lookup::Late => (None, Vec::new()),
                Lookup::Miss => {
                    let (reply, effects) = state.execute(client_id, publish.payload, &props, response_topic, deadline);
                    state.cache.insert(key, reply.clone(), received);
                    (Some(reply), effects)
                }
            }
        };
        self.carry_out(broker, effects);
        if let Some(reply) = reply {
            broker.publish(reply);
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
                            content_type: Some(ByteString::from(CONTENT_TYPE)),
                            user_properties: vec![(TIMESTAMP_PROPERTY.into(), n.version.to_string().into())],
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

impl<E: Engine, A: Authorizer> State<E, A> {
    /// Runs one request in the machine and builds its response.
    fn execute(&mut self, client_id: &str, payload: bytes::Bytes, props: &PublishProperties, topic: ByteString, deadline: Instant) -> (Message, Vec<Effect>) {
        let correlation = props.correlation_data.clone();
        if self.failed {
            return (rpc::fault_response(topic, correlation, &rpc::Fault::unavailable(), deadline), Vec::new());
        }
        let request = Request {
            client_id: client_id.to_owned(),
            payload,
            timestamp: rpc::user_property(props, TIMESTAMP_PROPERTY).map(str::to_owned),
            fencing_token: rpc::user_property(props, FENCING_TOKEN_PROPERTY).map(str::to_owned),
        };
        match self.machine.handle(request, unix_ms(SystemTime::now())) {
            Ok(outcome) => {
                let version = outcome.reply.version.map(|v| v.to_string());
                (rpc::ok_response(topic, correlation, outcome.reply.payload, version, deadline), outcome.effects)
            }
            Err(e) => {
                tracing::error!(error = %e, "state store engine failed; the store now answers 503");
                self.failed = true;
                (rpc::fault_response(topic, correlation, &rpc::Fault::unavailable(), deadline), Vec::new())
            }
        }
    }
}

impl<E, A> Service for StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    fn on_publish<'a>(&'a self, broker: &'a Broker, from: &'a ClientInfo, publish: Publish) -> BoxFuture<'a, ()> {
        self.handle(broker, from, publish);
        Box::pin(std::future::ready(()))
    }

    fn on_connection_closed(&self, _broker: &Broker, client_id: &str) {
        self.state.lock().machine.client_disconnected(client_id);
    }
}

/// How long the expiry task sleeps when no key has an expiry (a wake-up comes with the first).
const IDLE: Duration = Duration::from_secs(3600);

impl<E, A> StateStoreService<E, A>
where
    E: Engine + Send + Debug + 'static,
    A: Authorizer + Send + Debug + 'static,
{
    /// Expires keys on time until the broker shuts down. Spawn it once per service.
    ///
    /// Active expiry: a task that sleeps until the next key expires, removes it and sends
    /// the `NOTIFY DELETE`s. Expiry must be active because the SDKs take leases with
    /// `SET ... PX` and wait for the deletion notification when a lease lapses; waiting for
    /// the next request to notice would leave observers hanging.
    ///
    /// The task re-reads [`statehub_state_store::Machine::next_expiry`] whenever a request
    /// arms a new expiry (through a `Notify`, which keeps a wake-up that arrives while the
    /// task is busy), so it is never more than a timer tick late.
    pub async fn run_expiry(self: Arc<Self>, broker: Broker) {
        let shutdown = broker.shutdown_token();
        loop {
            let wait = match self.next_expiry() {
                Some(at) => Duration::from_millis(at.saturating_sub(unix_ms(SystemTime::now()))),
                None => IDLE,
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.rearm.notified() => continue,
                () = tokio::time::sleep(wait) => {}
            }
            let effects = {
                let mut state = self.state.lock();
                if state.failed {
                    Vec::new()
                } else {
                    match state.machine.expire(unix_ms(SystemTime::now())) {
                        Ok(effects) => effects,
                        Err(e) => {
                            tracing::error!(error = %e, "state store engine failed during expiry; the store now answers 503");
                            state.failed = true;
                            Vec::new()
                        }
                    }
                }
            };
            self.carry_out(&broker, effects);
        }
    }

    fn next_expiry(&self) -> Option<u64> {
        let state = self.state.lock();
        if state.failed {
            return None;
        }
        state.machine.next_expiry().unwrap_or_else(|e| {
            tracing::error!(error = %e, "state store engine failed reading expiries");
            None
        })
    }
}
