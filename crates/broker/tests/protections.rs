//! Built-in protections, without any rule: `$` topics are the server's, state store
//! notification topics take no client's PUBLISH, a client subscribes to its own
//! state store topics only, and a message addressed to one client (a state store
//! response) reaches no one else, whatever they subscribed to.

use statehub_broker::codec::{PublishProperties, QoS, ReasonCode};
use statehub_broker::{BrokerConfig, Message};
use statehub_test_support::*;

const STORE: &str = "FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8";

fn notify_topic(client_hex: &str) -> String {
    format!("clients/statestore/v1/{STORE}/{client_hex}/command/notify/6B6579")
}

fn message(topic: &str, payload: &'static [u8]) -> Message {
    Message {
        topic: bs(topic),
        payload: bytes::Bytes::from_static(payload),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: PublishProperties::default(),
        expires_at: None,
        publisher: None,
        recipient: None,
    }
}

#[tokio::test]
async fn only_the_server_publishes_on_dollar_topics_and_wildcards_skip_them() {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    let mut all = RawClient::connect(addr, V5, "all").await;
    all.subscribe("#", opts(QoS::AtLeastOnce)).await;
    let mut sys = RawClient::connect(addr, V5, "sys").await;
    sys.subscribe("$SYS/#", opts(QoS::AtLeastOnce)).await;
    let mut c = RawClient::connect(addr, V5, "c").await;
    assert_eq!(
        c.publish_simple("$SYS/x", QoS::AtLeastOnce, b"forged")
            .await,
        ReasonCode::NOT_AUTHORIZED
    );
    broker.publish(message("$SYS/x", b"server"));
    assert_eq!(&sys.expect_publish().await.payload[..], b"server");
    c.publish_simple("plain", QoS::AtLeastOnce, b"marker").await;
    // `#` saw neither `$SYS/x`: the next thing it gets is the marker.
    assert_eq!(&all.expect_publish().await.payload[..], b"marker");
}

#[tokio::test]
async fn nobody_publishes_a_notification() {
    let (_broker, addr) = start_default().await;
    let mut victim = RawClient::connect(addr, V5, "a").await;
    let own = notify_topic("61");
    victim.subscribe(&own, opts(QoS::AtLeastOnce)).await;
    let mut attacker = RawClient::connect(addr, V5, "b").await;
    for qos in [QoS::AtLeastOnce, QoS::ExactlyOnce] {
        assert_eq!(
            attacker.publish_simple(&own, qos, b"forged").await,
            ReasonCode::NOT_AUTHORIZED
        );
    }
    attacker
        .publish_simple(&own, QoS::AtMostOnce, b"forged")
        .await;
    // Not even the owner may.
    assert_eq!(
        victim.publish_simple(&own, QoS::AtLeastOnce, b"self").await,
        ReasonCode::NOT_AUTHORIZED
    );
    victim.subscribe("marker", opts(QoS::AtLeastOnce)).await;
    attacker
        .publish_simple("marker", QoS::AtLeastOnce, b"marker")
        .await;
    assert_eq!(&victim.expect_publish().await.payload[..], b"marker");
}

#[tokio::test]
async fn a_client_subscribes_to_its_own_state_store_topics_only() {
    let (_broker, addr) = start_default().await;
    let response = |id: &str| format!("clients/{id}/services/statestore/v1/{STORE}/command/invoke");
    for version in [V5, V311] {
        let refused = if version == V5 {
            ReasonCode::NOT_AUTHORIZED
        } else {
            ReasonCode(0x80)
        };
        let mut b = RawClient::connect(addr, version, "b").await;
        let filters = [
            notify_topic("61"),                            // a's notifications
            format!("clients/statestore/v1/{STORE}/62/#"), // b's own
            response("a"),                                 // a's responses
            response("b"),                                 // b's own
            format!("$share/g/{}", response("a")),
            "clients/#".to_owned(), // a wildcard: allowed
        ];
        let ack = b
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
            [refused, ok, refused, ok, refused, ok],
            "{version:?}"
        );
    }
}

#[tokio::test]
async fn a_message_for_one_client_reaches_no_one_else() {
    let (broker, addr) = start_default().await;
    let topic = format!("clients/a/services/statestore/v1/{STORE}/command/invoke");
    let mut a = RawClient::connect(addr, V5, "a").await;
    a.subscribe(&topic, opts(QoS::AtLeastOnce)).await;
    let mut snoop = RawClient::connect(addr, V5, "snoop").await;
    snoop.subscribe("clients/#", opts(QoS::AtLeastOnce)).await;
    snoop.subscribe("#", opts(QoS::AtLeastOnce)).await;
    snoop
        .subscribe("$share/g/clients/#", opts(QoS::AtLeastOnce))
        .await;
    let sent = broker.publish(message(&topic, b"answer").for_client(bs("a")));
    assert_eq!(sent, 1);
    assert_eq!(&a.expect_publish().await.payload[..], b"answer");
    broker.publish(message("clients/x", b"marker"));
    let got = snoop.expect_publish().await;
    assert_eq!(&got.payload[..], b"marker", "{got:?}");
}
