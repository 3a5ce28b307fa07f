//! Exact bytes on the wire: requests from a raw MQTT 5 client with hand-picked
//! properties, responses and notifications checked byte for byte, property by property.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{now_ts, resp, start, user, user1, Client, Seen};
use rumqttc::v5::mqttbytes::QoS;
use statehub_state_store::notify_topic;
use statehub_state_store_service::REQUEST_TOPIC;

#[tokio::test]
async fn set_get_del_exact_bytes_and_properties() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect(addr, "wire-basic").await;

    let set = c
        .call(&resp(&[b"SET", b"k1", b"v1"]), 1, Some(now_ts()))
        .await;
    assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
    assert_eq!(set.topic, Bytes::from(c.response_topic.clone()));
    assert_eq!(set.qos, QoS::AtLeastOnce);
    let props = set.properties.clone().unwrap();
    assert_eq!(props.correlation_data, Some(Bytes::from(vec![1u8; 16])));
    assert_eq!(
        props.content_type.as_deref(),
        Some("application/octet-stream")
    );
    let expiry = props.message_expiry_interval.unwrap();
    assert!((9..=10).contains(&expiry), "expiry {expiry}");
    assert_eq!(user1(&set, "__stat").as_deref(), Some("200"));
    assert_eq!(user1(&set, "__protVer").as_deref(), Some("1.0"));
    let version = user1(&set, "__ts").expect("SET carries __ts");
    assert!(version.ends_with(":state-store"), "{version}");

    let get = c.call(&resp(&[b"GET", b"k1"]), 2, None).await;
    assert_eq!(get.payload, Bytes::from_static(b"$2\r\nv1\r\n"));
    assert_eq!(user1(&get, "__ts"), Some(version));

    let missing = c.call(&resp(&[b"GET", b"nope"]), 3, None).await;
    assert_eq!(missing.payload, Bytes::from_static(b"$-1\r\n"));
    assert_eq!(user1(&missing, "__stat").as_deref(), Some("200"));
    assert!(user(&missing, "__ts").is_empty(), "$-1 must not carry __ts");

    let nx = c
        .call(&resp(&[b"SET", b"k1", b"v2", b"NX"]), 4, Some(now_ts()))
        .await;
    assert_eq!(nx.payload, Bytes::from_static(b":-1\r\n"));
    assert!(user1(&nx, "__ts").is_some(), ":-1 carries __ts");

    let del = c.call(&resp(&[b"DEL", b"k1"]), 5, None).await;
    assert_eq!(del.payload, Bytes::from_static(b":1\r\n"));
    let del = c.call(&resp(&[b"DEL", b"k1"]), 6, None).await;
    assert_eq!(del.payload, Bytes::from_static(b":0\r\n"));

    let bad = c.call(b"*1\r\n$5\r\nHELLO\r\n", 7, None).await;
    assert_eq!(bad.payload, Bytes::from_static(b"-ERR unknown command\r\n"));
    assert_eq!(user1(&bad, "__stat").as_deref(), Some("200"));
    let no_ts = c.call(&resp(&[b"SET", b"k", b"v"]), 8, None).await;
    assert_eq!(
        no_ts.payload,
        Bytes::from_static(b"-ERR missing timestamp\r\n")
    );
}

#[tokio::test]
async fn rpc_faults() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect(addr, "wire-faults").await;
    let get = resp(&[b"GET", b"k"]);

    let mut props = c.props(1, None);
    props.correlation_data = None;
    c.send(&get, props).await;
    let r = c.next_publish().await;
    assert_eq!(user1(&r, "__stat").as_deref(), Some("400"));
    assert_eq!(user1(&r, "__propName").as_deref(), Some("Correlation Data"));
    assert_eq!(user1(&r, "__protVer").as_deref(), Some("1.0"));
    assert!(user1(&r, "__stMsg").is_some());
    assert!(r.payload.is_empty());

    let mut props = c.props(2, None);
    props.message_expiry_interval = None;
    c.send(&get, props).await;
    let r = c.next_publish().await;
    assert_eq!(user1(&r, "__stat").as_deref(), Some("400"));
    assert_eq!(user1(&r, "__propName").as_deref(), Some("Message Expiry"));
    assert_eq!(
        r.properties.as_ref().unwrap().correlation_data,
        Some(Bytes::from(vec![2u8; 16]))
    );

    let mut props = c.props(3, None);
    props.user_properties.retain(|(k, _)| k != "__protVer");
    props
        .user_properties
        .push(("__protVer".into(), "2.0".into()));
    c.send(&get, props).await;
    let r = c.next_publish().await;
    assert_eq!(user1(&r, "__stat").as_deref(), Some("505"));
    assert_eq!(user1(&r, "__supProtMajVer").as_deref(), Some("1"));
    assert_eq!(user1(&r, "__requestProtVer").as_deref(), Some("2.0"));

    // No __protVer at all means 1.0.
    let mut props = c.props(4, None);
    props.user_properties.retain(|(k, _)| k != "__protVer");
    c.send(&get, props).await;
    let r = c.next_publish().await;
    assert_eq!(user1(&r, "__stat").as_deref(), Some("200"));
    assert_eq!(r.payload, Bytes::from_static(b"$-1\r\n"));
}

#[tokio::test]
async fn qos0_is_refused_and_missing_response_topic_ignored() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect(addr, "wire-qos0").await;
    c.send_qos(&resp(&[b"GET", b"k"]), c.props(1, None), QoS::AtMostOnce)
        .await;
    let r = c.next_publish().await;
    assert_eq!(user1(&r, "__stat").as_deref(), Some("400"));
    assert_eq!(user1(&r, "__propName").as_deref(), Some("QoS"));
    let message = user1(&r, "__stMsg").unwrap();
    assert!(message.contains("QoS 1"), "{message}");
    let payload = std::str::from_utf8(&r.payload).unwrap();
    assert_eq!(payload, format!("-ERR {message}\r\n"));
    let mut props = c.props(2, None);
    props.response_topic = None;
    c.send(&resp(&[b"GET", b"k"]), props).await;
    c.expect_quiet().await;
    let r = c.call(&resp(&[b"GET", b"k"]), 3, None).await;
    assert_eq!(r.payload, Bytes::from_static(b"$-1\r\n"));
}

#[tokio::test]
async fn reserved_response_topics_disconnect() {
    let (_broker, addr) = start().await;
    for (i, topic) in [
        REQUEST_TOPIC.to_owned(),
        "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/x/command/notify/41".to_owned(),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = Client::connect(addr, &format!("wire-reserved-{i}")).await;
        let mut props = c.props(1, None);
        props.response_topic = Some(topic);
        c.send(&resp(&[b"GET", b"k"]), props).await;
        match c.next(common::WAIT).await {
            Some(Seen::Closed(Some(code))) => assert_eq!(code, 0x82),
            other => panic!("expected a DISCONNECT, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn duplicate_request_is_answered_from_cache() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect(addr, "wire-dup").await;
    let set = resp(&[b"SET", b"dup", b"v", b"NX"]);
    let first = c.call(&set, 9, Some(now_ts())).await;
    assert_eq!(first.payload, Bytes::from_static(b"+OK\r\n"));
    let again = c.call(&set, 9, Some(now_ts())).await;
    assert_eq!(again.payload, Bytes::from_static(b"+OK\r\n"));
    assert_eq!(user1(&again, "__ts"), user1(&first, "__ts"));
    let fresh = c.call(&set, 10, Some(now_ts())).await;
    assert_eq!(fresh.payload, Bytes::from_static(b":-1\r\n"));
    // The same correlation data from another client is another call.
    let mut other = Client::connect(addr, "wire-dup-2").await;
    let r = other.call(&resp(&[b"DEL", b"dup"]), 9, None).await;
    assert_eq!(r.payload, Bytes::from_static(b":1\r\n"));
}

/// The cache's bound does not forget a request whose response has not reached its
/// requester: a client whose connection dropped before it acknowledged the response
/// resends the request after reconnecting, however many requests others made meanwhile.
#[tokio::test]
async fn a_request_resent_after_a_reconnect_is_answered_from_cache_under_load() {
    let settings = statehub_state_store_service::Settings {
        response_cache_entries: 4,
        ..Default::default()
    };
    let (_broker, addr) = common::start_with(settings).await;
    let persistent = |opts: &mut rumqttc::v5::MqttOptions| {
        opts.set_clean_start(false);
        opts.set_manual_acks(true);
        opts.set_connect_properties(rumqttc::v5::mqttbytes::v5::ConnectProperties {
            session_expiry_interval: Some(3600),
            ..Default::default()
        });
    };
    let mut requester = Client::connect_with(addr, "wire-resend", persistent).await;
    let set = resp(&[b"SET", b"once", b"v", b"NX"]);
    let props = requester.props(7, Some(now_ts()));
    requester.send(&set, props.clone()).await;
    let first = requester.next_publish().await;
    assert_eq!(first.payload, Bytes::from_static(b"+OK\r\n"));
    // The response is never acknowledged: the connection drops first.
    requester.drop_connection().await;

    let mut others = Client::connect(addr, "wire-resend-others").await;
    for corr in 0..20 {
        let r = others.call(&resp(&[b"GET", b"once"]), corr, None).await;
        assert_eq!(r.payload, Bytes::from_static(b"$1\r\nv\r\n"));
    }

    let mut requester = Client::connect_with(addr, "wire-resend", persistent).await;
    // The session gives back the unacknowledged response...
    let redelivered = requester.next_publish().await;
    assert_eq!(redelivered.payload, first.payload);
    // ...and the request, sent again, is answered from the cache, not run again (a
    // second SET NX would answer :-1).
    requester.send(&set, props).await;
    let again = requester.next_publish().await;
    assert_eq!(again.payload, Bytes::from_static(b"+OK\r\n"));
    assert_eq!(user1(&again, "__ts"), user1(&first, "__ts"));
}

#[tokio::test]
async fn notifications_go_straight_into_the_session_once() {
    let (_broker, addr) = start().await;
    let mut observer = Client::connect(addr, "wire-observer").await;
    let mut writer = Client::connect(addr, "wire-writer").await;
    let topic = notify_topic(b"wire-observer", b"watched");
    // Subscribed or not, exactly one copy: subscribe to prove no routed duplicate.
    observer.subscribe(&topic).await;
    let ok = observer
        .call(&resp(&[b"KEYNOTIFY", b"watched"]), 1, None)
        .await;
    assert_eq!(ok.payload, Bytes::from_static(b"+OK\r\n"));

    let set = writer
        .call(&resp(&[b"SET", b"watched", b"abc"]), 1, Some(now_ts()))
        .await;
    let n = observer.next_publish().await;
    assert_eq!(n.topic, Bytes::from(topic.clone()));
    assert_eq!(
        n.payload,
        Bytes::from_static(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$3\r\nabc\r\n")
    );
    assert_eq!(n.qos, QoS::AtLeastOnce);
    assert_eq!(user1(&n, "__ts"), user1(&set, "__ts"));
    assert_eq!(
        n.properties.as_ref().unwrap().content_type.as_deref(),
        Some("application/octet-stream")
    );
    observer.expect_quiet().await;

    writer.call(&resp(&[b"DEL", b"watched"]), 2, None).await;
    let n = observer.next_publish().await;
    assert_eq!(
        n.payload,
        Bytes::from_static(b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n")
    );
    assert!(user1(&n, "__ts").is_some());
    observer.expect_quiet().await;

    let stop = observer
        .call(&resp(&[b"KEYNOTIFY", b"watched", b"STOP"]), 3, None)
        .await;
    assert_eq!(stop.payload, Bytes::from_static(b"+OK\r\n"));
    let stop = observer
        .call(&resp(&[b"KEYNOTIFY", b"watched", b"STOP"]), 4, None)
        .await;
    assert_eq!(stop.payload, Bytes::from_static(b":0\r\n"));
}

#[tokio::test]
async fn unsubscribed_observer_still_gets_notifications() {
    let (_broker, addr) = start().await;
    let mut observer = Client::connect(addr, "wire-nosub").await;
    observer.call(&resp(&[b"KEYNOTIFY", b"k"]), 1, None).await;
    let (_, n) = observer
        .call_and_notified(&resp(&[b"SET", b"k", b"v"]), 2, Some(now_ts()))
        .await;
    assert_eq!(n.topic, Bytes::from(notify_topic(b"wire-nosub", b"k")));
}

#[tokio::test]
async fn expiry_notifies_within_100ms() {
    let (_broker, addr) = start().await;
    let mut observer = Client::connect(addr, "wire-expiry").await;
    observer
        .call(&resp(&[b"KEYNOTIFY", b"lease"]), 1, None)
        .await;
    let started = Instant::now();
    let (set, n) = observer
        .call_and_notified(
            &resp(&[b"SET", b"lease", b"me", b"NEX", b"PX", b"300"]),
            2,
            Some(now_ts()),
        )
        .await;
    assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
    assert_eq!(
        n.payload,
        Bytes::from_static(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$2\r\nme\r\n")
    );
    let n = observer.next_publish().await;
    let elapsed = started.elapsed();
    assert_eq!(
        n.payload,
        Bytes::from_static(b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n")
    );
    assert!(
        elapsed >= Duration::from_millis(290) && elapsed <= Duration::from_millis(400),
        "{elapsed:?}"
    );
    assert!(user1(&n, "__ts").unwrap() > user1(&set, "__ts").unwrap());
    let get = observer.call(&resp(&[b"GET", b"lease"]), 3, None).await;
    assert_eq!(get.payload, Bytes::from_static(b"$-1\r\n"));
}

#[tokio::test]
async fn observations_end_with_the_connection() {
    let (_broker, addr) = start().await;
    let observer = Client::connect(addr, "wire-leaver").await;
    let mut observer = observer;
    observer.call(&resp(&[b"KEYNOTIFY", b"k"]), 1, None).await;
    observer.client.disconnect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut back = Client::connect(addr, "wire-leaver").await;
    let mut writer = Client::connect(addr, "wire-leaver-writer").await;
    writer
        .call(&resp(&[b"SET", b"k", b"v"]), 1, Some(now_ts()))
        .await;
    back.expect_quiet().await;
    let stop = back
        .call(&resp(&[b"KEYNOTIFY", b"k", b"STOP"]), 2, None)
        .await;
    assert_eq!(stop.payload, Bytes::from_static(b":0\r\n"));
}

/// A response goes to its requester alone: another client subscribed to the
/// requester's response topic sees nothing of it, and the requester gets it once.
#[tokio::test]
async fn a_response_reaches_the_requester_only() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect(addr, "wire-reply-a").await;
    let mut other = Client::connect(addr, "wire-reply-b").await;
    other.subscribe(&c.response_topic).await;
    other.subscribe("#").await;
    let set = c
        .call(&resp(&[b"SET", b"mine", b"v"]), 1, Some(now_ts()))
        .await;
    assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
    c.expect_quiet().await;
    other.expect_quiet().await;
}

/// A response larger than the requester's Maximum Packet Size is not sent [MQTT-3.1.2-25]
/// and does not stop the next, smaller one.
#[tokio::test]
async fn a_response_over_the_requesters_maximum_packet_size_is_dropped() {
    let (_broker, addr) = start().await;
    let mut c = Client::connect_with(addr, "wire-small", |opts| {
        opts.set_max_packet_size(Some(400));
    })
    .await;
    let big = vec![b'x'; 500];
    let set = c
        .call(&resp(&[b"SET", b"big", &big]), 1, Some(now_ts()))
        .await;
    assert_eq!(set.payload, Bytes::from_static(b"+OK\r\n"));
    c.send(&resp(&[b"GET", b"big"]), c.props(2, None)).await;
    c.expect_quiet().await;
    let small = c.call(&resp(&[b"GET", b"none"]), 3, None).await;
    assert_eq!(small.payload, Bytes::from_static(b"$-1\r\n"));
    assert_eq!(
        small.properties.unwrap().correlation_data,
        Some(Bytes::from(vec![3u8; 16]))
    );
}
