//! Authorization rules enforced by the broker, with the protocol's own codes: CONNECT
//! 0x87 (3.1.1: return code 5), PUBACK/PUBREC 0x87 (3.1.1: the normal acknowledgement,
//! the message dropped), SUBACK 0x87 per filter (3.1.1: 0x80); and the built-in
//! protections that hold without rules.
//!
//! "Nothing was delivered" is shown without waiting: after the refused message the
//! same publisher sends an allowed marker, and the subscriber's next message must be
//! the marker (one publisher's messages arrive in order).

use std::sync::Arc;

use statehub_authz::rules::{self, Format};
use statehub_authz::Policy;
use statehub_broker::codec::{LastWill, Packet, ProtocolVersion, QoS, ReasonCode};
use statehub_broker::{Broker, BrokerConfig};
use statehub_test_support::*;

const RULES: &str = "
- principals: {clientIds: ['sensor-*']}
  brokerResources:
    - {method: Connect}
    - {method: Publish, topics: ['telemetry/{principal.clientId}', 'shared/#']}
- principals: {clientIds: [watcher]}
  brokerResources:
    - {method: Connect}
    - {method: Subscribe, topics: ['telemetry/#', 'shared/+/public']}
- principals: {usernames: [admin]}
  brokerResources:
    - {method: Connect, clientIds: ['admin-*']}
    - {method: Subscribe, topics: ['#']}
";

fn policy(text: &str) -> Arc<Policy> {
    let rules = rules::parse(text, Format::Yaml).expect("rules parse");
    Arc::new(Policy::compile(&rules).expect("rules compile"))
}

async fn broker_with_rules() -> (Broker, std::net::SocketAddr) {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    broker.set_policy(Some(policy(RULES)));
    (broker, addr)
}

async fn connect(
    addr: std::net::SocketAddr,
    version: ProtocolVersion,
    id: &str,
) -> (RawClient, ReasonCode) {
    let (client, ack) = RawClient::connect_with(addr, connect_packet(version, id)).await;
    (client, ack.reason_code)
}

#[tokio::test]
async fn connect_is_granted_by_the_rules_only() {
    let (broker, addr) = broker_with_rules().await;
    for version in [V5, V311] {
        let (_ok, code) = connect(addr, version, "sensor-1").await;
        assert_eq!(code, ReasonCode::SUCCESS);
        let (mut refused, code) = connect(addr, version, "laptop").await;
        assert_eq!(code, ReasonCode::NOT_AUTHORIZED, "{version:?}");
        refused.expect_closed().await;
    }
    // `admin` may connect only with an admin-* client id.
    let mut c = connect_packet(V5, "admin-1");
    c.username = Some(bs("admin"));
    assert_eq!(
        RawClient::connect_with(addr, c.clone()).await.1.reason_code,
        ReasonCode::SUCCESS
    );
    c.client_id = bs("other");
    assert_eq!(
        RawClient::connect_with(addr, c).await.1.reason_code,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        broker
            .metrics()
            .connects_denied
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test]
async fn the_3_1_1_refusal_is_return_code_5_on_the_wire() {
    let (_broker, addr) = broker_with_rules().await;
    let mut raw = RawClient::open(addr, V311).await;
    raw.send(&Packet::Connect(Box::new(connect_packet(V311, "laptop"))))
        .await;
    raw.stream.readable().await.unwrap();
    let mut buf = [0u8; 4];
    use tokio::io::AsyncReadExt;
    raw.stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf, [0x20, 2, 0, 5], "CONNACK, Not authorized");
}

#[tokio::test]
async fn a_will_topic_must_be_publishable() {
    let (_broker, addr) = broker_with_rules().await;
    let will = |topic: &str| LastWill {
        topic: bs(topic),
        qos: QoS::AtLeastOnce,
        retain: false,
        payload: bytes::Bytes::from_static(b"gone"),
        properties: Default::default(),
    };
    let mut c = connect_packet(V5, "sensor-1");
    c.will = Some(will("telemetry/sensor-2"));
    assert_eq!(
        RawClient::connect_with(addr, c.clone()).await.1.reason_code,
        ReasonCode::NOT_AUTHORIZED
    );
    c.will = Some(will("telemetry/sensor-1"));
    assert_eq!(
        RawClient::connect_with(addr, c).await.1.reason_code,
        ReasonCode::SUCCESS
    );
}

#[tokio::test]
async fn a_denied_publish_is_0x87_and_goes_nowhere() {
    let (broker, addr) = broker_with_rules().await;
    let (mut watcher, _) = connect(addr, V5, "watcher").await;
    assert_eq!(
        watcher
            .subscribe("telemetry/#", opts(QoS::AtLeastOnce))
            .await
            .reason_codes,
        [ReasonCode::GRANTED_QOS_1]
    );
    let (mut sensor, _) = connect(addr, V5, "sensor-1").await;
    for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
        let code = sensor
            .publish_simple("telemetry/sensor-2", qos, b"forged")
            .await;
        assert_eq!(code, ReasonCode::NOT_AUTHORIZED, "{qos:?}");
    }
    assert_eq!(
        sensor
            .publish_simple("telemetry/sensor-2", QoS::AtMostOnce, b"forged")
            .await,
        ReasonCode::SUCCESS
    );
    sensor
        .publish_simple("telemetry/sensor-1", QoS::AtLeastOnce, b"marker")
        .await;
    let got = watcher.expect_publish().await;
    assert_eq!(
        (&*got.topic, &got.payload[..]),
        ("telemetry/sensor-1", &b"marker"[..])
    );
    assert_eq!(
        broker
            .metrics()
            .publishes_denied
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test]
async fn a_denied_3_1_1_publish_is_acknowledged_and_dropped() {
    let (_broker, addr) = broker_with_rules().await;
    let (mut watcher, _) = connect(addr, V5, "watcher").await;
    watcher
        .subscribe("telemetry/#", opts(QoS::AtLeastOnce))
        .await;
    let (mut sensor, _) = connect(addr, V311, "sensor-1").await;
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        // The QoS 2 exchange completes (PUBREC, PUBREL, PUBCOMP) as for any message.
        let code = sensor
            .publish_simple("telemetry/sensor-2", qos, b"forged")
            .await;
        assert_eq!(code, ReasonCode::SUCCESS, "{qos:?}");
    }
    sensor
        .publish_simple("telemetry/sensor-1", QoS::AtLeastOnce, b"marker")
        .await;
    assert_eq!(&watcher.expect_publish().await.payload[..], b"marker");
}

#[tokio::test]
async fn a_subscription_must_fit_inside_a_grant() {
    let (broker, addr) = broker_with_rules().await;
    for (version, refused) in [(V5, ReasonCode::NOT_AUTHORIZED), (V311, ReasonCode(0x80))] {
        let (mut watcher, _) = connect(addr, version, "watcher").await;
        let filters = [
            "telemetry/+",
            "#",
            "shared/+/public",
            "shared/#",
            "$share/g/telemetry/#",
        ];
        let ack = watcher
            .subscribe_with(
                filters
                    .iter()
                    .map(|f| (bs(f), opts(QoS::AtMostOnce)))
                    .collect(),
                None,
            )
            .await;
        let ok = ReasonCode::SUCCESS;
        assert_eq!(
            ack.reason_codes,
            [ok, refused, ok, refused, ok],
            "{version:?}"
        );
    }
    assert_eq!(
        broker
            .metrics()
            .subscriptions_denied
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}

#[tokio::test]
async fn retained_messages_follow_the_grants() {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    let (mut writer, _) = connect(addr, V5, "writer").await;
    for topic in ["shared/a/public", "shared/a/private"] {
        let mut p = publish(topic, QoS::AtLeastOnce, topic.as_bytes());
        p.retain = true;
        writer.publish(p).await;
    }
    broker.set_policy(Some(policy(RULES)));
    let (mut watcher, _) = connect(addr, V5, "watcher").await;
    // Only filters inside the grant are accepted, so only their retained messages come.
    let ack = watcher.subscribe("shared/#", opts(QoS::AtLeastOnce)).await;
    assert_eq!(ack.reason_codes, [ReasonCode::NOT_AUTHORIZED]);
    watcher
        .subscribe("shared/+/public", opts(QoS::AtLeastOnce))
        .await;
    assert_eq!(
        &watcher.expect_publish().await.payload[..],
        b"shared/a/public"
    );
    watcher.expect_nothing(QUIET).await;
}

#[tokio::test]
async fn replaced_rules_apply_to_the_next_operation() {
    let (broker, addr) = broker_with_rules().await;
    let (mut sensor, _) = connect(addr, V5, "sensor-1").await;
    assert_eq!(
        sensor
            .publish_simple("shared/x", QoS::AtLeastOnce, b"1")
            .await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    broker.set_policy(Some(policy(
        "- principals: {clientIds: ['sensor-*']}\n  brokerResources: [{method: Publish, topics: [other]}]\n",
    )));
    assert_eq!(
        sensor
            .publish_simple("shared/x", QoS::AtLeastOnce, b"2")
            .await,
        ReasonCode::NOT_AUTHORIZED
    );
    assert_eq!(
        sensor.publish_simple("other", QoS::AtLeastOnce, b"3").await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    // The connection is judged by them, but new connections need a Connect grant.
    assert_eq!(
        connect(addr, V5, "sensor-2").await.1,
        ReasonCode::NOT_AUTHORIZED
    );
    broker.set_policy(None);
    assert_eq!(connect(addr, V5, "anyone").await.1, ReasonCode::SUCCESS);
}

/// Attributes come from authentication ("floor=<password>" here) and are replaced
/// when the client re-authenticates, and the grants with them.
#[derive(Debug)]
struct Floors;

impl statehub_broker::Authenticator for Floors {
    fn connect<'a>(
        &'a self,
        _peer: &'a statehub_broker::Peer,
        connect: &'a statehub_broker::codec::Connect,
    ) -> statehub_broker::BoxFuture<'a, statehub_broker::AuthDecision> {
        let floor = connect
            .properties
            .authentication_data
            .clone()
            .unwrap_or_default();
        Box::pin(std::future::ready(floor_identity(&floor)))
    }

    fn auth<'a>(
        &'a self,
        _peer: &'a statehub_broker::Peer,
        _client_id: &'a statehub_broker::codec::ByteString,
        _method: &'a statehub_broker::codec::ByteString,
        auth: &'a statehub_broker::codec::Auth,
    ) -> statehub_broker::BoxFuture<'a, statehub_broker::AuthDecision> {
        let floor = auth.authentication_data.clone().unwrap_or_default();
        Box::pin(std::future::ready(floor_identity(&floor)))
    }
}

fn floor_identity(floor: &[u8]) -> statehub_broker::AuthDecision {
    let mut identity = statehub_broker::Identity::default();
    identity
        .attributes
        .insert("floor".into(), String::from_utf8_lossy(floor).into_owned());
    statehub_broker::AuthDecision::Success {
        data: None,
        identity,
    }
}

#[tokio::test]
async fn attributes_from_authentication_select_the_grants() {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    broker.set_authenticator(Arc::new(Floors));
    broker.set_policy(Some(policy(
        "
- principals: {attributes: [{floor: '1'}, {floor: '2'}]}
  brokerResources:
    - {method: Connect}
    - {method: Publish, topics: ['floors/{principal.attributes.floor}/#']}
",
    )));
    let connect = |floor: &'static [u8]| {
        let mut c = connect_packet(V5, "dev");
        c.properties.authentication_method = Some(bs("FLOOR"));
        c.properties.authentication_data = Some(bytes::Bytes::from_static(floor));
        c
    };
    assert_eq!(
        RawClient::connect_with(addr, connect(b"3"))
            .await
            .1
            .reason_code,
        ReasonCode::NOT_AUTHORIZED
    );
    let (mut dev, ack) = RawClient::connect_with(addr, connect(b"1")).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    assert_eq!(
        dev.publish_simple("floors/1/t", QoS::AtLeastOnce, b"")
            .await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    assert_eq!(
        dev.publish_simple("floors/2/t", QoS::AtLeastOnce, b"")
            .await,
        ReasonCode::NOT_AUTHORIZED
    );
    dev.send(&Packet::Auth(statehub_broker::codec::Auth {
        reason_code: ReasonCode::RE_AUTHENTICATE,
        authentication_method: Some(bs("FLOOR")),
        authentication_data: Some(bytes::Bytes::from_static(b"2")),
        ..Default::default()
    }))
    .await;
    dev.expect_reply("AUTH", |p| matches!(p, Packet::Auth(_)))
        .await;
    assert_eq!(
        dev.publish_simple("floors/2/t", QoS::AtLeastOnce, b"")
            .await,
        ReasonCode::NO_MATCHING_SUBSCRIBERS
    );
    assert_eq!(
        dev.publish_simple("floors/1/t", QoS::AtLeastOnce, b"")
            .await,
        ReasonCode::NOT_AUTHORIZED
    );
}
