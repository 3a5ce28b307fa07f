use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use tokio::sync::watch;

use crate::cluster::{Cluster, ClusterError, Mirrored, Taken, Written};
use crate::config::Limits;
use crate::dispatch::handle_text;
use crate::hub::Hub;
use crate::mirror::{ClaimError, MirroredStream, Restored, SessionWrite};
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
    /// Every client stream write, in order, with its ticket.
    streams: Mutex<Vec<(u64, SessionWrite)>>,
    /// Session writes handed over with an operation, as one.
    with_operation: AtomicU64,
    /// Whether the store took each one, answered by the test when set.
    fates: Option<Mutex<Vec<tokio::sync::oneshot::Sender<bool>>>>,
}

impl Cluster for Store {
    fn broadcast(&self, _: Vec<u8>) -> Result<u64, ClusterError> {
        Ok(0)
    }
    fn broadcast_with(
        &self,
        operation: Vec<u8>,
        (hub, id, write): (&str, &str, SessionWrite),
    ) -> Result<(u64, u64, Taken), ClusterError> {
        self.with_operation.fetch_add(1, Ordering::Relaxed);
        let seq = self.broadcast(operation)?;
        let ticket = self.session(hub, id, write)?;
        let Some(fates) = &self.fates else {
            return Ok((seq, ticket, Box::pin(std::future::ready(true))));
        };
        let (fate, taken) = tokio::sync::oneshot::channel();
        fates.lock().unwrap().push(fate);
        Ok((
            seq,
            ticket,
            Box::pin(async { taken.await.unwrap_or(false) }),
        ))
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
    fn session(&self, _: &str, _: &str, write: SessionWrite) -> Result<u64, ClusterError> {
        if self.full.load(Ordering::Relaxed) {
            return Err(ClusterError::Backlog(0));
        }
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        if let SessionWrite::StreamOpened(_)
        | SessionWrite::StreamAccepted { .. }
        | SessionWrite::StreamClosed(_) = &write
        {
            self.streams.lock().unwrap().push((ticket, write));
        }
        Ok(ticket)
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

/// Handles one frame of `session`: its replies (as JSON) and the ticket they wait for.
fn frame(hub: &Hub, session: &super::Session, frame: Value) -> (Vec<Value>, u64) {
    let fx = handle_text(hub, session, &frame.to_string());
    let replies = fx.replies.iter().map(|r| serde_json::to_value(r).unwrap());
    (replies.collect(), fx.held)
}

/// The client stream writes since the last call, each idle deadline checked to be
/// set, then left out (0) for comparison.
fn stream_writes(store: &Store) -> Vec<(u64, SessionWrite)> {
    let mut writes = std::mem::take(&mut *store.streams.lock().unwrap());
    for (_, w) in &mut writes {
        let deadline = match w {
            SessionWrite::StreamOpened(MirroredStream { deadline_ms, .. })
            | SessionWrite::StreamAccepted { deadline_ms, .. } => deadline_ms,
            _ => continue,
        };
        assert!(*deadline > 0, "{w:?} carries its idle deadline");
        *deadline = 0;
    }
    writes
}

fn data(seq: u64) -> Value {
    json!({"type": "streamData", "streamId": "s1", "streamSequenceId": seq,
           "dataType": "text", "data": format!("f{seq}")})
}

#[tokio::test]
async fn a_stream_is_mirrored_as_it_opens_accepts_and_ends_and_its_replies_wait_for_that() {
    let store = Arc::new(Store::default());
    let (hub, session, _rx) = setup(&store);
    session.permissions().grant("webpubsub.sendToGroup");
    let start = json!({"type": "streamStart", "streamId": "s1", "group": "g2",
                       "idleTimeoutMs": 5000, "noEcho": true});
    let (replies, held) = frame(&hub, &session, start);
    assert_eq!(replies[0]["type"], "streamAck");
    let opened = MirroredStream {
        id: "s1".into(),
        group: "g2".into(),
        no_echo: true,
        idle_ms: 5000,
        expected: 1,
        deadline_ms: 0,
    };
    assert_eq!(
        stream_writes(&store),
        vec![(held, SessionWrite::StreamOpened(opened))]
    );
    let (replies, held) = frame(&hub, &session, data(1));
    assert_eq!(replies[0]["expectedSequenceId"], 2);
    let accepted = SessionWrite::StreamAccepted {
        id: "s1".into(),
        expected: 2,
        deadline_ms: 0,
    };
    assert_eq!(stream_writes(&store), vec![(held, accepted.clone())]);
    assert_eq!(
        store.with_operation.load(Ordering::Relaxed),
        1,
        "the fragment's state travels with its broadcast, as one"
    );
    for repeat in [
        data(1),
        json!({"type": "streamData", "streamId": "s1"}),
        data(3),
    ] {
        let (_, held) = frame(&hub, &session, repeat);
        assert_eq!(held, 0, "a repeat, a keepalive, a nack wait for nothing");
        let writes = stream_writes(&store);
        assert_eq!(writes.len(), 1, "only their idle deadline: {writes:?}");
        assert_eq!(writes[0].1, accepted);
    }
    let (replies, held) = frame(
        &hub,
        &session,
        json!({"type": "streamEnd", "streamId": "s1"}),
    );
    assert_eq!(replies[0]["type"], "streamClosed");
    let closed = SessionWrite::StreamClosed("s1".into());
    assert_eq!(stream_writes(&store), vec![(held, closed)]);
    assert_eq!(
        store.with_operation.load(Ordering::Relaxed),
        2,
        "the removal travels with the terminal message's broadcast"
    );
}

#[tokio::test]
async fn a_stream_id_longer_than_the_bound_is_refused_before_anything_is_written() {
    let store = Arc::new(Store::default());
    let (hub, session, _rx) = setup(&store);
    session.permissions().grant("webpubsub.sendToGroup");
    let long = "x".repeat(crate::hub::stream::MAX_STREAM_ID + 1);
    let start = json!({"type": "streamStart", "streamId": long, "group": "g"});
    let (replies, held) = frame(&hub, &session, start);
    assert_eq!(replies[0]["type"], "streamClosed");
    assert_eq!(replies[0]["error"]["name"], "BadRequest");
    assert_eq!((held, stream_writes(&store)), (0, vec![]));
}

#[tokio::test]
async fn a_restored_stream_goes_on_from_its_next_expected_id_without_republishing() {
    let store = Arc::new(Store::default());
    let hub = Arc::new(Hub::new("chat", Limits::default()).with_cluster(store.clone()));
    let restored = Restored {
        hub: "chat".into(),
        id: "c1".into(),
        protocol: "json.reliable.webpubsub.azure.v1".into(),
        roles: vec!["webpubsub.sendToGroup".into()],
        next: 1,
        streams: vec![MirroredStream {
            id: "s1".into(),
            group: "g".into(),
            no_echo: false,
            idle_ms: 60_000,
            expected: 3,
            deadline_ms: 0,
        }],
        ..Restored::default()
    };
    let session = hub.adopt(restored, "tok".into(), Subprotocol::JsonReliable, |_| {});
    let claims = ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec!["g".into()],
    };
    let member = hub.create_session(&claims, Subprotocol::Json);
    let (out, mut member_rx) = outbox(16, 1 << 20);
    member.attach(out).unwrap();
    let (replies, _) = frame(&hub, &session, data(2));
    assert_eq!(replies[0]["type"], "streamAck", "{replies:?}");
    assert_eq!(replies[0]["expectedSequenceId"], 3);
    assert!(
        member_rx.try_frame().is_none(),
        "sent before the move: not again"
    );
    let (replies, held) = frame(&hub, &session, data(3));
    assert_eq!(replies[0]["expectedSequenceId"], 4);
    assert!(held > 0, "its state is mirrored here too");
    let got = member_rx.try_frame().expect("fragment 3 published");
    let got: Value = match got.msg {
        axum::extract::ws::Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!(got["stream"]["streamSequenceId"], 3, "{got}");
    assert_eq!(got["data"], "f3");
}

/// The member's next message's data, waiting for it.
async fn next_data(rx: &mut crate::outbox::OutboxReceiver) -> Value {
    let next = tokio::time::timeout(Duration::from_secs(10), rx.next()).await;
    let Ok(Next::Frame(f)) = next else {
        panic!("a message for the member, got {next:?}");
    };
    let axum::extract::ws::Message::Text(t) = f.msg else {
        panic!("a text frame");
    };
    serde_json::from_str::<Value>(t.as_str()).unwrap()["data"].clone()
}

#[tokio::test]
async fn members_here_get_a_fragment_once_the_store_took_it_in_order_and_never_a_fenced_one() {
    let store = Arc::new(Store {
        fates: Some(Mutex::default()),
        ..Store::default()
    });
    let hub = crate::hub::shared(Hub::new("chat", Limits::default()).with_cluster(store.clone()));
    let claims = |groups: Vec<String>| ClientClaims {
        user_id: None,
        roles: vec![],
        groups,
    };
    let publisher = hub.create_session(&claims(vec![]), Subprotocol::JsonReliable);
    publisher.permissions().grant("webpubsub.sendToGroup");
    let member = claims(vec!["g".into()]);
    let member = hub.create_session(&member, Subprotocol::Json);
    let (out, mut rx) = outbox(16, 1 << 20);
    member.attach(out).unwrap();
    let send =
        |text: &str| json!({"type": "sendToGroup", "group": "g", "dataType": "text", "data": text});
    frame(
        &hub,
        &publisher,
        json!({"type": "streamStart", "streamId": "s1", "group": "g"}),
    );
    frame(&hub, &publisher, data(1));
    frame(&hub, &publisher, send("after f1"));
    frame(&hub, &publisher, data(2));
    frame(&hub, &publisher, send("after f2"));
    assert!(rx.try_frame().is_none(), "nothing before the store answers");
    let fates: Vec<_> = std::mem::take(&mut *store.fates.as_ref().unwrap().lock().unwrap());
    let [f1, f2] = <[_; 2]>::try_from(fates).expect("two fragments");
    f2.send(false).unwrap();
    assert!(
        rx.try_frame().is_none(),
        "fragment 2's answer does not pass 1"
    );
    f1.send(true).unwrap();
    assert_eq!(next_data(&mut rx).await, "f1");
    assert_eq!(
        next_data(&mut rx).await,
        "after f1",
        "the publisher's order"
    );
    assert_eq!(
        next_data(&mut rx).await,
        "after f2",
        "fragment 2 fenced out"
    );
    frame(&hub, &publisher, send("later"));
    assert_eq!(next_data(&mut rx).await, "later", "nothing waits any more");
}

#[tokio::test]
async fn sends_kept_behind_an_unanswered_fragment_are_bounded_then_refused() {
    let store = Arc::new(Store {
        fates: Some(Mutex::default()),
        ..Store::default()
    });
    let hub = crate::hub::shared(Hub::new("chat", Limits::default()).with_cluster(store.clone()));
    let claims = ClientClaims {
        user_id: None,
        roles: vec!["webpubsub.sendToGroup".into()],
        groups: vec![],
    };
    let publisher = hub.create_session(&claims, Subprotocol::JsonReliable);
    frame(
        &hub,
        &publisher,
        json!({"type": "streamStart", "streamId": "s1", "group": "g"}),
    );
    frame(&hub, &publisher, data(1));
    let send = json!({"type": "sendToGroup", "group": "g", "dataType": "text", "data": "m"});
    for _ in 1..crate::hub::lane::MAX_KEPT {
        frame(&hub, &publisher, send.clone());
    }
    assert_eq!(hub.stats().counters().kept_refusals, 0, "all kept so far");
    let mut acked = send.clone();
    acked["ackId"] = json!(1);
    let (replies, _) = frame(&hub, &publisher, acked);
    assert_eq!(replies[0]["success"], false, "{replies:?}");
    assert_eq!(replies[0]["error"]["name"], "InternalServerError");
    assert_eq!(hub.stats().counters().kept_refusals, 1);
}
