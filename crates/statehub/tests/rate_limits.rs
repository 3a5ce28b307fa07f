//! Abuse rates against the binary with rumqttc: connections per source address
//! (`[mqtt] connect_rate_per_address`, CONNACK 0x9F; 3.1.1 return code 3) and PUBLISH
//! packets per connection (`[mqtt] max_publish_rate`, DISCONNECT 0x96).

mod common;
mod store_client;

use std::net::SocketAddr;
use std::time::Duration;

use common::start;
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode, DisconnectReasonCode, Packet};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions, StateError};
use store_client::{config_file, LOCAL, PATIENCE};
use tokio::time::timeout;

fn serve(name: &str, mqtt: &str) -> common::Server {
    let config = config_file(name, &format!("[mqtt]\n{mqtt}"));
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(LOCAL);
    start(&args, &[])
}

/// One MQTT 5 CONNECT: its CONNACK's code.
async fn connack_v5(addr: SocketAddr, id: &str) -> ConnectReturnCode {
    let opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
    let (_client, mut events) = AsyncClient::new(opts, 8);
    match timeout(PATIENCE, events.poll())
        .await
        .expect("a CONNACK in time")
    {
        Ok(Event::Incoming(Packet::ConnAck(a))) => a.code,
        Err(ConnectionError::ConnectionRefused(code)) => code,
        other => panic!("{other:?}"),
    }
}

/// One MQTT 3.1.1 CONNECT: accepted, or refused with its return code.
async fn connack_v311(addr: SocketAddr, id: &str) -> Option<rumqttc::ConnectReturnCode> {
    let opts = rumqttc::MqttOptions::new(id, addr.ip().to_string(), addr.port());
    let (_client, mut events) = rumqttc::AsyncClient::new(opts, 8);
    match timeout(PATIENCE, events.poll())
        .await
        .expect("a CONNACK in time")
    {
        Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => None,
        Err(rumqttc::ConnectionError::ConnectionRefused(code)) => Some(code),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_rate_per_address_get_0x9f() {
    let server = serve(
        "connect-rate.toml",
        "connect_rate_per_address = 1\nconnect_burst_per_address = 3\n",
    );
    // The burst is served; then at one a second, a quick run of CONNECTs is refused
    // before the bucket can refill (however slow the machine, one of 60 is).
    for i in 0..3 {
        let code = connack_v5(server.mqtt, &format!("burst-{i}")).await;
        assert_eq!(code, ConnectReturnCode::Success, "CONNECT {i} of the burst");
    }
    let mut refused = None;
    for i in 0..60 {
        match connack_v5(server.mqtt, &format!("more-{i}")).await {
            ConnectReturnCode::Success => {}
            code => {
                refused = Some(code);
                break;
            }
        }
    }
    assert_eq!(refused, Some(ConnectReturnCode::ConnectionRateExceeded));
    // MQTT 3.1.1 has no such code: Server unavailable (3).
    let mut refused = None;
    for i in 0..60 {
        if let Some(code) = connack_v311(server.mqtt, &format!("v311-{i}")).await {
            refused = Some(code);
            break;
        }
    }
    assert_eq!(
        refused,
        Some(rumqttc::ConnectReturnCode::ServiceUnavailable)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_publishing_past_its_rate_is_disconnected_with_0x96() {
    let server = serve("publish-rate.toml", "max_publish_rate = 5\n");
    let mut opts = MqttOptions::new("flooder", "127.0.0.1", server.mqtt.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(opts, 256);
    for i in 0..100 {
        client
            .publish("flood", QoS::AtMostOnce, false, format!("{i}"))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let reason = loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match timeout(left, events.poll())
            .await
            .expect("DISCONNECT in time")
        {
            Ok(Event::Incoming(Packet::Disconnect(d))) => break d.reason_code,
            Ok(_) => {}
            Err(ConnectionError::MqttState(StateError::ServerDisconnect {
                reason_code, ..
            })) => break reason_code,
            Err(e) => panic!("closed without DISCONNECT: {e}"),
        }
    };
    assert_eq!(reason, DisconnectReasonCode::MessageRateTooHigh);
    // A client within the rate is not touched.
    let mut opts = MqttOptions::new("calm", "127.0.0.1", server.mqtt.port());
    opts.set_keep_alive(Duration::from_secs(30));
    let (calm, mut events) = AsyncClient::new(opts, 8);
    calm.publish("calm", QoS::AtLeastOnce, false, "one")
        .await
        .unwrap();
    loop {
        let event = timeout(PATIENCE, events.poll()).await.unwrap().unwrap();
        if let Event::Incoming(Packet::PubAck(_)) = event {
            break;
        }
    }
}
