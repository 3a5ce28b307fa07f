use std::sync::Arc;

use bytes::Bytes;
use statehub_mqtt_codec::{ProtocolVersion, PublishProperties, QoS, SubscriptionOptions};

use super::Tapped;
use crate::session::PeerInfo;
use crate::signal::Signal;
use crate::{Broker, BrokerConfig, Message};

fn message(topic: &str) -> Message {
    Message {
        topic: topic.into(),
        payload: Bytes::from_static(b"x"),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: PublishProperties::default(),
        expires_at: None,
        publisher: None,
        recipient: None,
    }
}

fn connect(broker: &Broker, id: &str, expiry: u32) -> Arc<crate::session::Session> {
    let generation = broker.next_generation();
    let taken = broker
        .take_session(
            &id.into(),
            (true, false),
            expiry,
            generation,
            Arc::new(Signal::default()),
        )
        .unwrap();
    let peer = PeerInfo {
        addr: "127.0.0.1:4000".parse().unwrap(),
        protocol: ProtocolVersion::V5,
    };
    taken.session.set_peer(generation, peer);
    taken.session
}

#[test]
fn sessions_page_is_sorted_bounded_and_resumes_after_the_last_id() {
    let broker = Broker::new(BrokerConfig::default());
    for id in ["e", "b", "d", "a", "c"] {
        connect(&broker, id, 0);
    }
    let first = broker.sessions_page(None, 2, 10);
    let ids: Vec<_> = first
        .sessions
        .iter()
        .map(|s| s.client_id.as_str())
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(first.more);
    let second = broker.sessions_page(Some("b"), 2, 10);
    let ids: Vec<_> = second
        .sessions
        .iter()
        .map(|s| s.client_id.as_str())
        .collect();
    assert_eq!(ids, ["c", "d"]);
    assert!(second.more);
    let last = broker.sessions_page(Some("d"), 2, 10);
    assert_eq!(last.sessions.len(), 1);
    assert!(!last.more);
}

#[test]
fn snapshot_shows_peer_expiry_and_at_most_the_bound_of_subscriptions() {
    let broker = Broker::new(BrokerConfig::default());
    let session = connect(&broker, "dev", 300);
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        ..SubscriptionOptions::default()
    };
    let subs: Vec<_> = ["c/#", "a/+", "b"]
        .into_iter()
        .map(|f| {
            let sub = crate::Subscription {
                options,
                identifier: None,
            };
            (f.into(), sub)
        })
        .collect();
    session.subscribe(&subs, 10);
    let snap = broker.session_snapshot("dev", 2).unwrap();
    assert!(snap.connected);
    assert_eq!(snap.expiry_interval, 300);
    assert_eq!(snap.peer.unwrap().protocol, ProtocolVersion::V5);
    assert_eq!(snap.subscription_count, 3);
    assert_eq!(
        snap.subscriptions,
        [("a/+".to_owned(), 1), ("b".to_owned(), 1)]
    );
    assert!(broker.session_snapshot("nobody", 2).is_none());
}

#[tokio::test]
async fn tap_sees_matching_messages_only_and_is_cut_off_when_full() {
    let broker = Broker::new(BrokerConfig::default());
    assert!(broker.tap("a/#/b", 4).is_err());
    let mut tap = broker.tap("sensors/+", 2).unwrap();
    broker.publish(message("other/1"));
    broker.publish(message("sensors/1"));
    broker.publish(message("sensors/2"));
    broker.publish(message("sensors/3"));
    for want in ["sensors/1", "sensors/2"] {
        match tap.recv().await {
            Some(Tapped::Message(m)) => assert_eq!(&*m.topic, want),
            other => panic!("expected {want}, got {other:?}"),
        }
    }
    assert!(matches!(tap.recv().await, Some(Tapped::Overflowed)));
    assert!(tap.recv().await.is_none());
    // Cut off: no longer offered anything, and counted.
    assert_eq!(broker.inner_taps().len(), 0);
    assert_eq!(broker.taps_dropped(), 1);
}

#[tokio::test]
async fn dropped_tap_is_removed() {
    let broker = Broker::new(BrokerConfig::default());
    let tap = broker.tap("#", 8).unwrap();
    let other = broker.tap("x", 8).unwrap();
    assert_eq!(broker.inner_taps().len(), 2);
    drop(tap);
    assert_eq!(broker.inner_taps().len(), 1);
    drop(other);
    assert_eq!(broker.inner_taps().len(), 0);
    broker.publish(message("x"));
}

/// A message delivered to one client (a state store notification) reaches the taps
/// on its topic, even when the client has no session: how an in-process observer
/// reads notifications.
#[tokio::test]
async fn tap_sees_messages_delivered_to_a_client_without_a_session() {
    let broker = Broker::new(BrokerConfig::default());
    let mut tap = broker.tap("notify/+", 4).unwrap();
    let publish = statehub_mqtt_codec::Publish {
        dup: false,
        qos: QoS::AtLeastOnce,
        retain: false,
        topic: "notify/k".into(),
        packet_id: None,
        payload: Bytes::from_static(b"v"),
        properties: PublishProperties::default(),
    };
    assert!(broker.deliver_to("no-session", publish).is_err());
    match tap.recv().await {
        Some(Tapped::Message(m)) => assert_eq!(&*m.topic, "notify/k"),
        other => panic!("expected the delivered message, got {other:?}"),
    }
}
