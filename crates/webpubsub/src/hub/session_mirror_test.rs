use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::cluster::{Cluster, ClusterError, Mirrored, Written};
use crate::config::Limits;
use crate::hub::Hub;
use crate::mirror::{ClaimError, SessionWrite};
use crate::outbox::{outbox, Next};
use crate::protocol::json::{DataMessageRef, MessageSource};
use crate::protocol::{Payload, Subprotocol};
use crate::token::ClientClaims;

/// A cluster whose store takes session writes when the test says so.
#[derive(Debug, Default)]
struct Store {
    tickets: AtomicU64,
    full: AtomicBool,
    stored: watch::Sender<u64>,
}

impl Cluster for Store {
    fn broadcast(&self, _: Vec<u8>) -> Result<u64, ClusterError> {
        Ok(0)
    }
    fn written(&self, _: u64) -> Written {
        Box::pin(async { Ok(()) })
    }
    fn ask(
        &self,
        _: &str,
        _: Vec<u8>,
        _: &dyn Fn(&[u8]) -> bool,
    ) -> Result<Vec<Vec<u8>>, ClusterError> {
        Ok(Vec::new())
    }
    fn answer(&self, _: &str, _: Vec<u8>) {}
    fn session(&self, _: &str, _: &str, _: SessionWrite) -> Result<u64, ClusterError> {
        if self.full.load(Ordering::Relaxed) {
            return Err(ClusterError::Backlog(0));
        }
        Ok(self.tickets.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn mirrored(&self, ticket: u64) -> Mirrored {
        let mut stored = self.stored.subscribe();
        Box::pin(async move {
            stored
                .wait_for(|s| *s >= ticket)
                .await
                .map_or(u64::MAX, |s| *s)
        })
    }
    fn claim(&self, _: &str, _: &str, _: &str, _: &str, _: Vec<u8>) -> Result<(), ClaimError> {
        Err(ClaimError::Gone)
    }
    fn stop_reading(&self) {}
    fn flush(&self, _: Duration) -> bool {
        true
    }
    fn stop(&self) {}
    fn sent_after(&self, _: u64) -> Option<Vec<(u64, Vec<u8>)>> {
        Some(Vec::new())
    }
}

fn setup(store: &Arc<Store>) -> (Arc<Hub>, Arc<super::Session>, crate::outbox::OutboxReceiver) {
    let hub = Arc::new(Hub::new("chat", Limits::default()).with_cluster(store.clone()));
    let claims = ClientClaims {
        user_id: Some("u".into()),
        roles: vec![],
        groups: vec!["g".into()],
    };
    let session = hub.create_session(&claims, Subprotocol::JsonReliable);
    let (out, mut rx) = outbox(16, 1 << 20);
    rx.set_gate(
        session
            .gate()
            .expect("a reliable session in a cluster is mirrored"),
    );
    session.attach(out).unwrap();
    (hub, session, rx)
}

fn publish(hub: &Hub) {
    let payload = Payload::Text("m".into());
    let msg = DataMessageRef {
        from: MessageSource::Group,
        group: Some("g"),
        from_user_id: None,
        payload: &payload,
        stream: None,
    };
    hub.send_to_group("g", &msg, None);
}

#[tokio::test]
async fn a_sequenced_frame_reaches_the_socket_once_its_mirror_write_is_stored() {
    let store = Arc::new(Store::default());
    let (hub, _session, mut rx) = setup(&store);
    publish(&hub);
    assert!(rx.try_frame().is_none(), "held until the store has it");
    let written = store.tickets.load(Ordering::Relaxed);
    store.stored.send_replace(written);
    match rx.next().await {
        Next::Frame(f) => assert_eq!(f.seq, Some(1)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_change_that_cannot_be_queued_ends_the_session_with_1008() {
    let store = Arc::new(Store::default());
    let (hub, _session, mut rx) = setup(&store);
    store.full.store(true, Ordering::Relaxed);
    publish(&hub);
    match tokio::time::timeout(Duration::from_secs(10), rx.next()).await {
        Ok(Next::Close(c)) => assert_eq!(c.code, 1008, "{c:?}"),
        other => panic!("expected a close, got {other:?}"),
    }
}
