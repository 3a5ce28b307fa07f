//! The CONNECT path's part in moving a session between nodes: the session a CONNECT
//! found here may leave for another node before the CONNECT takes it.

use std::sync::Arc;

use parking_lot::Mutex;
use statehub_mqtt_codec::{ByteString, Connect, ConnectProperties, ProtocolVersion, ReasonCode};

use super::{accept, fetch_session, Refused};
use crate::auth::Identity;
use crate::fabric::{Fabric, FabricError, SharedPicks};
use crate::message::Message;
use crate::service::BoxFuture;
use crate::session_store::{SessionChange, SessionStore, SessionStoreError, StoredSession};
use crate::{Broker, BrokerConfig};

/// Remembers the incarnation of every session record made.
#[derive(Debug, Default)]
struct Saves(Mutex<Vec<u64>>);

impl SessionStore for Saves {
    fn record(&self, change: SessionChange<'_>) {
        if let SessionChange::Saved { incarnation, .. } = change {
            self.0.lock().push(incarnation);
        }
    }
    fn barrier(&self) -> BoxFuture<'static, Result<(), SessionStoreError>> {
        Box::pin(async { Ok(()) })
    }
    fn begin_group(&self) {}
    fn end_group(&self) {}
}

/// A cluster of which this node is the only one that says anything.
#[derive(Debug)]
struct Quiet;

impl Fabric for Quiet {
    fn is_available(&self) -> bool {
        true
    }
    fn shared_picks(&self, _topic: &str) -> SharedPicks {
        SharedPicks::default()
    }
    fn forward(
        &self,
        _msg: &Message,
        _picks: SharedPicks,
    ) -> BoxFuture<'static, Result<(), FabricError>> {
        Box::pin(async { Ok(()) })
    }
    fn connected(&self, _: &str, _: bool) -> BoxFuture<'static, Result<(), FabricError>> {
        Box::pin(async { Ok(()) })
    }
    fn announcing(&self, _client_id: &str) -> bool {
        false
    }
    fn shared_group_changed(&self, _filter: &str, _group: &str, _present: bool) {}
}

fn resuming(client_id: &str) -> Connect {
    Connect {
        protocol: ProtocolVersion::V5,
        clean_start: false,
        keep_alive: 30,
        client_id: client_id.into(),
        username: None,
        password: None,
        will: None,
        properties: ConnectProperties {
            session_expiry_interval: Some(300),
            ..Default::default()
        },
    }
}

/// The session was here when the CONNECT looked (so it fetched nothing), and the
/// cluster reader handed it to another node before the CONNECT took it. Starting a
/// new session instead would record a new incarnation under the client id, which in
/// Redis replaces the one in transit with every message it had queued.
#[tokio::test]
async fn a_session_that_leaves_while_a_connect_resumes_it_is_not_replaced() {
    let broker = Broker::new(BrokerConfig::default());
    let saves = Arc::new(Saves::default());
    broker.set_session_store(saves.clone(), Vec::new());
    assert!(broker.set_fabric(Arc::new(Quiet)));
    let stored = StoredSession {
        client_id: ByteString::from("mover"),
        incarnation: 7,
        expiry_interval: 300,
        expires_in: None,
        subscriptions: Vec::new(),
        messages: Vec::new(),
        incoming_qos2: Vec::new(),
    };
    assert!(broker.adopt_stored(stored));
    let mut connect = resuming("mover");

    let expected = fetch_session(&broker, &connect).await.unwrap();
    // Another node's request for the session, read here meanwhile.
    assert_eq!(broker.hand_off_session("mover").map(|(i, _)| i), Some(7));
    let taken = accept(&broker, &mut connect, None, &Identity::default(), expected);

    assert_eq!(taken.err(), Some(Refused(ReasonCode::SERVER_BUSY)));
    assert!(
        saves.0.lock().is_empty(),
        "no session recorded in its place"
    );
    assert!(!broker.has_session("mover"));
}
