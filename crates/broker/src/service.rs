//! Built-in services: code inside the broker that owns a set of topics.
//!
//! The state store is the first user. A service receives every PUBLISH on its topic
//! filters (together with who sent it and all its properties) instead of the normal
//! subscribers; it answers by publishing straight into a client's session with
//! [`crate::Broker::deliver_to`], whether or not that client subscribed; it hears
//! when a client's connection ends; and it may disconnect a client with a reason
//! code through [`crate::Broker::disconnect_client`].
//!
//! `on_publish` is awaited by the publisher's connection task before it acknowledges
//! the PUBLISH (PUBACK/PUBREC), so a service that must make a write durable before
//! the client hears "done" can do so, and a slow service back-pressures only the
//! clients that use it. A service that can take a request over at once and answer it
//! later ([`Service::start_publish`]) lets the connection read on meanwhile: the
//! acknowledgement still waits for the service, in the order of the PUBLISHes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use statehub_mqtt_codec::{ByteString, ProtocolVersion, Publish};

use crate::auth::Principal;
use crate::Broker;

/// A boxed future, as returned by [`Service::on_publish`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future of a service that has already done everything: boxing it allocates
/// nothing (it has no size), unlike `Box::pin(ready(()))`, which costs a service that
/// answers in place one allocation per PUBLISH.
pub fn done<'a>() -> BoxFuture<'a, ()> {
    Box::pin(Done)
}

/// Ready at once, and zero-sized.
struct Done;

impl Future for Done {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Ready(())
    }
}

/// Who sent a PUBLISH.
#[derive(Debug, Clone)]
pub struct ClientInfo {
    pub client_id: ByteString,
    pub protocol: ProtocolVersion,
    /// What the authorization rules grant the client (the state store asks it about
    /// each key); `None` when no rules are installed, and everything is allowed.
    pub access: Option<Arc<statehub_authz::Access>>,
    /// Who the client authenticated as (its user name and authorization attributes);
    /// the current one, replaced when the client re-authenticates.
    pub principal: Arc<Principal>,
}

/// A built-in service. Implementations must not block the thread; long work goes in
/// the returned future.
pub trait Service: Send + Sync + std::fmt::Debug + 'static {
    /// Handles one PUBLISH on one of the service's topics, lent for the call (its
    /// payload and strings are cheap to clone, a `Bytes` and `ByteString`s, if kept;
    /// lending spares every request the moves of the whole packet through the
    /// layers). The topic alias has been
    /// resolved; the packet id is the publisher's; the topic and any Response Topic are
    /// valid Topic Names (non-empty, no wildcards, no U+0000).
    fn on_publish<'a>(
        &'a self,
        broker: &'a Broker,
        from: &'a ClientInfo,
        publish: &'a Publish,
    ) -> BoxFuture<'a, ()>;

    /// Takes a QoS 1/2 PUBLISH over without holding up its connection: what the service
    /// must do in the order its client sent the requests (queue it, say) is done before
    /// this returns, and the returned future, which borrows nothing, ends once the
    /// PUBLISH may be acknowledged. The connection reads its next packets meanwhile;
    /// the acknowledgement waits for the future, behind those of earlier PUBLISHes
    /// (bounded by Receive Maximum, see `connection/acks.rs`). `None` (the default):
    /// [`Service::on_publish`] is awaited in place instead.
    fn start_publish(
        self: Arc<Self>,
        _broker: &Broker,
        _from: &ClientInfo,
        _publish: &Publish,
    ) -> Option<BoxFuture<'static, ()>> {
        None
    }

    /// Whether every future [`Service::on_publish`] returns is ready at once (it answers
    /// in place, as [`done`] does): the connection then handles the PUBLISH on its
    /// thread's stack, without boxing its handling. A service that says so and then
    /// returns a future that waits gets the publisher's connection closed (0x83).
    fn answers_in_place(&self) -> bool {
        false
    }

    /// The client's network connection ended (for any reason, including takeover).
    fn on_connection_closed(&self, _broker: &Broker, _client_id: &str) {}
}
