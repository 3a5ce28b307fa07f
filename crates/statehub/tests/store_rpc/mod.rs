//! An MQTT 5 client speaking the state store's request/response like the SDKs (QoS 1,
//! Response Topic, Correlation Data, `__ts`), for tests whose server may die under it:
//! connecting and calling give `None` once the connection is gone, never a panic.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;

const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";

pub fn now_ts() -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{ms:015}:00000:client")
}

/// An MQTT 5 client speaking the state store's request/response like the SDKs.
pub struct Client {
    client: AsyncClient,
    response_topic: String,
    rx: mpsc::UnboundedReceiver<Option<rumqttc::v5::mqttbytes::v5::Publish>>,
    correlation: u64,
}

/// A response: payload and `__ts`.
pub struct Answer {
    pub payload: Vec<u8>,
    pub version: Option<String>,
}

impl Client {
    pub async fn connect(addr: SocketAddr, id: &str) -> Option<Client> {
        let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        opts.set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(opts, 16);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(Some(p));
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => {
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
        });
        let response_topic =
            format!("clients/{id}/services/statestore/_any_/command/invoke/response");
        client
            .subscribe(response_topic.clone(), QoS::AtLeastOnce)
            .await
            .ok()?;
        timeout(Duration::from_secs(5), ready_rx.recv())
            .await
            .ok()??;
        Some(Client {
            client,
            response_topic,
            rx,
            correlation: 0,
        })
    }

    /// Sends one request and waits for its answer; `None` if the connection died first.
    pub async fn call(&mut self, payload: Vec<u8>) -> Option<Answer> {
        self.call_many(vec![payload]).await?.pop()
    }

    /// Sends requests back to back, then collects their answers, in request order.
    pub async fn call_many(&mut self, payloads: Vec<Vec<u8>>) -> Option<Vec<Answer>> {
        let first = self.correlation + 1;
        for payload in payloads {
            self.correlation += 1;
            let props = PublishProperties {
                response_topic: Some(self.response_topic.clone()),
                correlation_data: Some(Bytes::copy_from_slice(&self.correlation.to_be_bytes())),
                message_expiry_interval: Some(10),
                user_properties: vec![
                    ("__protVer".into(), "1.0".into()),
                    ("__ts".into(), now_ts()),
                ],
                ..PublishProperties::default()
            };
            self.client
                .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, payload, props)
                .await
                .ok()?;
        }
        let mut answers: Vec<(u64, Answer)> = Vec::new();
        while answers.len() < (self.correlation + 1 - first) as usize {
            let p = timeout(Duration::from_secs(10), self.rx.recv())
                .await
                .ok()???;
            let props = p.properties.as_ref()?;
            let user = &props.user_properties;
            let prop = |name: &str| user.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
            assert_eq!(
                prop("__stat").as_deref(),
                Some("200"),
                "a request failed: {:?}",
                p.payload
            );
            let correlation =
                u64::from_be_bytes(props.correlation_data.as_deref()?.try_into().ok()?);
            answers.push((
                correlation,
                Answer {
                    payload: p.payload.to_vec(),
                    version: prop("__ts"),
                },
            ));
        }
        answers.sort_by_key(|(c, _)| *c);
        Some(answers.into_iter().map(|(_, a)| a).collect())
    }
}
