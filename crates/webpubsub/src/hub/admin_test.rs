use std::sync::Mutex as StdMutex;

use axum::extract::ws::Message;

use super::*;
use crate::config::Limits;
use crate::hub::UserEventFuture;
use crate::outbox::{outbox, OutboxReceiver};
use crate::protocol::Subprotocol;
use crate::token::ClientClaims;

#[derive(Debug, Default)]
struct Log(StdMutex<Vec<String>>);

impl super::super::Events for Log {
    fn connected(&self, _: &Hub, s: &Arc<Session>) {
        self.0.lock().unwrap().push(format!("connected {}", s.id()));
    }
    fn disconnected(&self, _: &Hub, s: &Arc<Session>, reason: &str) {
        self.0
            .lock()
            .unwrap()
            .push(format!("disconnected {} {reason}", s.id()));
    }
    fn takes_user_event(&self, _: &str) -> bool {
        false
    }
    fn user_event(&self, _: &Hub, _: &Arc<Session>, _: &str, _: &Payload) -> UserEventFuture {
        Box::pin(async { Ok(None) })
    }
}

fn connect(
    hub: &Hub,
    user: Option<&str>,
    protocol: Subprotocol,
    groups: &[&str],
) -> (Arc<Session>, OutboxReceiver) {
    let claims = ClientClaims {
        user_id: user.map(str::to_owned),
        roles: vec![],
        groups: groups.iter().map(|g| g.to_string()).collect(),
    };
    let s = hub.create_session(&claims, protocol);
    let (out, rx) = outbox(16, 1 << 20);
    s.attach(out).unwrap();
    (s, rx)
}

fn text(rx: &mut OutboxReceiver) -> Option<String> {
    let waker = futures_util::task::noop_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    let fut = rx.recv();
    let mut fut = std::pin::pin!(fut);
    match fut.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(Some(Message::Text(t))) => Some(t.as_str().to_owned()),
        std::task::Poll::Ready(other) => panic!("{other:?}"),
        std::task::Poll::Pending => None,
    }
}

use std::future::Future as _;

fn hi() -> Payload {
    Payload::Text("hi".into())
}

#[tokio::test]
async fn targets_and_selection() {
    let h = Hub::new("chat", Limits::default());
    let (a, mut ra) = connect(&h, Some("alice"), Subprotocol::Json, &["g"]);
    let (b, mut rb) = connect(&h, Some("bob"), Subprotocol::Raw, &["g"]);
    let (_c, mut rc) = connect(&h, None, Subprotocol::Json, &[]);
    let none = Selection::default();

    assert_eq!(h.send(Target::All, &none, &hi(), None), 3);
    assert_eq!(
        text(&mut ra).unwrap(),
        r#"{"type":"message","from":"server","dataType":"text","data":"hi"}"#
    );
    assert_eq!(
        text(&mut rb).unwrap(),
        "hi",
        "raw clients get the bare data"
    );
    assert!(text(&mut rc).is_some());

    assert_eq!(h.send(Target::Group("g"), &none, &hi(), None), 2);
    assert_eq!(
        text(&mut ra).unwrap(),
        r#"{"type":"message","from":"group","group":"g","dataType":"text","data":"hi"}"#
    );
    text(&mut rb).unwrap();

    let excluded = [a.id().to_owned()];
    let sel = Selection {
        excluded: &excluded,
        filter: None,
    };
    assert_eq!(h.send(Target::Group("g"), &sel, &hi(), None), 1);
    text(&mut rb).unwrap();
    assert!(text(&mut ra).is_none());

    let f = Filter::parse("userId eq null").unwrap();
    let sel = Selection {
        excluded: &[],
        filter: Some(&f),
    };
    assert_eq!(h.send(Target::All, &sel, &hi(), None), 1);
    text(&mut rc).unwrap();

    assert_eq!(h.send(Target::User("bob"), &none, &hi(), None), 1);
    assert_eq!(h.send(Target::User("nobody"), &none, &hi(), None), 0);
    assert_eq!(h.send(Target::Connection(b.id()), &none, &hi(), None), 1);
    assert_eq!(h.send(Target::Connection("nope"), &none, &hi(), None), 0);
}

#[tokio::test]
async fn users_and_groups() {
    let h = Hub::new("chat", Limits::default());
    let (a1, _r1) = connect(&h, Some("alice"), Subprotocol::Json, &[]);
    let (a2, _r2) = connect(&h, Some("alice"), Subprotocol::Json, &["x"]);
    assert!(h.has_user("alice") && !h.has_user("bob"));
    assert_eq!(h.add_user_to_group("bob", "g"), Err(NotFound.into()));
    h.add_user_to_group("alice", "g").unwrap();
    assert_eq!(h.list_group("g", None, 10).0.len(), 2);
    h.remove_user_from_group("alice", "g");
    assert!(!h.has_group("g"));
    h.remove_user_from_all_groups("alice");
    assert!(!h.has_group("x") && a2.groups().is_empty());

    assert_eq!(h.add_connection_to_group("nope", "g"), Err(NotFound.into()));
    h.add_connection_to_group(a1.id(), "g").unwrap();
    h.add_connection_to_group(a1.id(), "h").unwrap();
    assert!(h.has_group("g"));
    h.remove_connection_from_group(a1.id(), "g");
    h.remove_connection_from_group("nope", "g");
    assert!(!h.has_group("g") && h.has_group("h"));
    h.remove_connection_from_all_groups(a1.id());
    assert!(!h.has_group("h"));

    h.remove(a1.id());
    h.remove(a2.id());
    assert!(
        !h.has_user("alice"),
        "the user index forgets users without connections"
    );
}

#[tokio::test]
async fn filtered_membership() {
    let h = Hub::new("chat", Limits::default());
    let (a, _ra) = connect(&h, Some("listener-1"), Subprotocol::Json, &[]);
    let (b, _rb) = connect(&h, Some("other"), Subprotocol::Json, &[]);
    let f = Filter::parse("startswith(userId, 'listener-')").unwrap();
    let groups = ["g1".to_owned(), "g2".to_owned()];
    h.add_filtered_to_groups(&groups, Some(&f));
    let mut got = a.groups();
    got.sort();
    assert_eq!(got, ["g1", "g2"]);
    assert!(b.groups().is_empty());
    h.add_filtered_to_groups(&groups[..1], None);
    assert_eq!(b.groups(), ["g1"]);
    h.remove_filtered_from_groups(&groups, Some(&f));
    assert!(a.groups().is_empty());
    assert_eq!(b.groups(), ["g1"]);
}

#[tokio::test]
async fn close_with_reason_fires_disconnected_once() {
    let events = Arc::new(Log::default());
    let h = Hub::new("chat", Limits::default()).with_events(events.clone());
    let (a, mut ra) = connect(&h, Some("u"), Subprotocol::Json, &["g"]);
    let (r, mut rr) = connect(&h, Some("u"), Subprotocol::JsonReliable, &["g"]);
    let (k, _rk) = connect(&h, Some("v"), Subprotocol::Json, &["g"]);
    let excluded = [k.id().to_owned()];
    let sel = Selection {
        excluded: &excluded,
        filter: None,
    };
    assert_eq!(h.close_connections(Target::Group("g"), &sel, "bye"), 2);
    let close = ra.closed().await;
    assert_eq!((close.code, close.reason.as_str()), (1000, "bye"));
    assert_eq!(
        rr.closed().await.code,
        1008,
        "reliable clients are told the session is gone"
    );
    assert!(!h.has_connection(a.id()) && !h.has_connection(r.id()));
    assert!(h.has_connection(k.id()));
    h.remove(a.id());
    let log = events.0.lock().unwrap().clone();
    let mut expected = vec![
        format!("disconnected {} bye", a.id()),
        format!("disconnected {} bye", r.id()),
    ];
    expected.sort();
    let mut log_sorted = log.clone();
    log_sorted.sort();
    assert_eq!(log_sorted, expected, "once each: {log:?}");
    assert_eq!(
        h.close_connections(Target::Connection("nope"), &Selection::default(), ""),
        0
    );
}

#[tokio::test]
async fn permissions_through_the_hub() {
    let h = Hub::new("chat", Limits::default());
    let (a, _ra) = connect(&h, None, Subprotocol::Json, &[]);
    assert!(!h.check_permission(a.id(), Permission::SendToGroup, Some("g")));
    h.grant_permission(a.id(), Permission::SendToGroup, Some("g"))
        .unwrap();
    assert!(h.check_permission(a.id(), Permission::SendToGroup, Some("g")));
    assert!(a.permissions().can_send("g"));
    assert!(!h.check_permission(a.id(), Permission::SendToGroup, None));
    assert_eq!(
        h.grant_permission("nope", Permission::SendToGroup, None),
        Err(NotFound)
    );
    h.revoke_permission("nope", Permission::SendToGroup, None);
    h.revoke_permission(a.id(), Permission::SendToGroup, Some("g"));
    assert!(!a.permissions().can_send("g"));
    assert!(!h.check_permission("nope", Permission::JoinLeaveGroup, None));
}

#[tokio::test]
async fn group_listing_pages_in_order() {
    let h = Hub::new("chat", Limits::default());
    let mut ids: Vec<String> = (0..5)
        .map(|i| {
            let (s, rx) = connect(&h, Some(&format!("u{i}")), Subprotocol::Json, &["g"]);
            std::mem::forget(rx);
            s.id().to_owned()
        })
        .collect();
    ids.sort();
    let (p1, more) = h.list_group("g", None, 2);
    assert!(more);
    let (p2, more) = h.list_group("g", Some(&p1[1].connection_id), 2);
    assert!(more);
    let (p3, more) = h.list_group("g", Some(&p2[1].connection_id), 2);
    assert!(!more);
    let listed: Vec<String> = p1
        .iter()
        .chain(&p2)
        .chain(&p3)
        .map(|m| m.connection_id.clone())
        .collect();
    assert_eq!(listed, ids);
    assert!(p1[0].user_id.as_deref().is_some_and(|u| u.starts_with('u')));
    let (exact, more) = h.list_group("g", None, 5);
    assert_eq!((exact.len(), more), (5, false));
    assert_eq!(h.list_group("none", None, 5), (vec![], false));
}

#[tokio::test(start_paused = true)]
async fn ttl_messages_expire_for_absent_clients() {
    let h = Arc::new(Hub::new("chat", Limits::default()));
    let claims = ClientClaims {
        user_id: None,
        roles: vec![],
        groups: vec![],
    };
    let s = h.create_session(&claims, Subprotocol::JsonReliable);
    let (out, _rx) = outbox(16, 1 << 20);
    let (generation, _, _) = s.attach(out).unwrap();
    h.socket_closed(&s, generation);
    let none = Selection::default();
    let target = Target::Connection(s.id());
    h.send(
        target,
        &none,
        &Payload::Text("short".into()),
        Some(std::time::Duration::from_secs(5)),
    );
    h.send(target, &none, &Payload::Text("forever".into()), None);
    tokio::time::advance(std::time::Duration::from_secs(6)).await;
    let (out, _rx) = outbox(16, 1 << 20);
    let (_, replay, _) = s.attach(out).unwrap();
    assert_eq!(replay.len(), 1);
    assert!(replay[0].1.to_text().unwrap().contains("forever"));
}

#[tokio::test]
async fn view_pages_groups_and_connections_by_name() {
    let h = Hub::new("chat", Limits::default());
    let (_a, _ra) = connect(&h, Some("alice"), Subprotocol::Json, &["z", "b", "a"]);
    let (_b, _rb) = connect(&h, None, Subprotocol::Raw, &["b"]);
    let view = h.view(Default::default(), 2);
    assert_eq!(view.connection_count, 2);
    assert_eq!(view.group_count, 3);
    let groups: Vec<_> = view
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.members))
        .collect();
    assert_eq!(groups, [("a", 1), ("b", 2)]);
    assert_eq!(view.connections.len(), 2);
    let alice = view
        .connections
        .iter()
        .find(|c| c.user_id.as_deref() == Some("alice"))
        .unwrap();
    assert_eq!(alice.groups, ["a", "b"]);
    assert!(h.view(Default::default(), 0).groups.is_empty());
    let from = super::super::view::ViewFrom {
        groups_after: Some("b"),
        connections_after: Some(view.connections[0].connection_id.as_str()),
    };
    let next = h.view(from, 2);
    let groups: Vec<_> = next.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(groups, ["z"]);
    assert_eq!(next.connections.len(), 1);
    assert_eq!(
        next.connections[0].connection_id,
        view.connections[1].connection_id
    );
}
