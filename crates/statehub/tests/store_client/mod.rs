//! A state store client for tests against the binary: rumqttc speaking the store's
//! request/response as the SDKs do (QoS 1, Response Topic, 8-byte Correlation Data,
//! Message Expiry, `__ts` and `__ft`), plus what the limit tests measure (the server's
//! resident memory).
#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;

pub const REQUEST_TOPIC: &str = "statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke";
pub const NOTIFY_PREFIX: &str = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/";
pub const QUOTA: &[u8] = b"-ERR the quota has been exceeded\r\n";

/// How long any one answer may take: generous, for a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub mod held;
pub mod raw;

use crate::common::user_property;
// Not every test file that includes this module uses every helper.
#[allow(unused_imports)]
pub use crate::common::{resp, rss_kib, LOCAL};

/// Milliseconds since the epoch now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A client HLC at the current time.
pub fn now_ts() -> String {
    format!("{:015}:00000:client", now_ms())
}

/// One request: its payload and the `__ts` and `__ft` to send (`__ts` defaults to now).
#[derive(Debug, Clone, Default)]
pub struct Call {
    pub payload: Vec<u8>,
    pub ts: Option<String>,
    pub ft: Option<String>,
}

impl Call {
    pub fn new(args: &[&[u8]]) -> Self {
        Self {
            payload: resp(args),
            ..Self::default()
        }
    }

    pub fn ts(mut self, ts: impl Into<String>) -> Self {
        self.ts = Some(ts.into());
        self
    }

    pub fn ft(mut self, ft: impl Into<String>) -> Self {
        self.ft = Some(ft.into());
        self
    }
}

/// A response: payload and `__ts`.
#[derive(Debug, Clone)]
pub struct Answer {
    pub payload: Vec<u8>,
    pub version: Option<String>,
}

/// An MQTT 5 client of the state store.
pub struct StoreClient {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Publish>,
    response_topic: String,
    correlation: u64,
    /// Notifications received while waiting for answers, oldest first.
    pub notifications: VecDeque<Publish>,
}

impl StoreClient {
    /// Connects (clean start, large packets allowed) and subscribes to its response topic.
    pub async fn connect(addr: SocketAddr, id: &str) -> StoreClient {
        let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        opts.set_keep_alive(Duration::from_secs(60));
        opts.set_max_packet_size(Some(4 << 20));
        opts.set_connection_timeout(PATIENCE.as_secs());
        let (client, mut eventloop) = AsyncClient::new(opts, 1_000);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(Ok(()));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                }
            }
        });
        let response_topic = format!("clients/{id}/services/statestore/command/response");
        client
            .subscribe(response_topic.clone(), QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        let ready = timeout(PATIENCE, ready_rx.recv())
            .await
            .expect("CONNACK and SUBACK in time");
        if let Some(Err(e)) = ready {
            panic!("{id} could not connect and subscribe: {e}");
        }
        StoreClient {
            client,
            rx,
            response_topic,
            correlation: 0,
            notifications: VecDeque::new(),
        }
    }

    /// One request with `__ts` = now; its answer.
    pub async fn call(&mut self, args: &[&[u8]]) -> Answer {
        self.call_many(vec![Call::new(args)]).await.remove(0)
    }

    /// One request as given.
    pub async fn call_with(&mut self, call: Call) -> Answer {
        self.call_many(vec![call]).await.remove(0)
    }

    /// Sends the requests back to back, then waits for their answers (in request order).
    pub async fn call_many(&mut self, calls: Vec<Call>) -> Vec<Answer> {
        let first = self.correlation + 1;
        let count = calls.len();
        for call in calls {
            self.send(call).await;
        }
        self.answers(first, count).await
    }

    /// Publishes one request without waiting for its answer; returns its correlation.
    pub async fn send(&mut self, call: Call) -> u64 {
        self.correlation += 1;
        let mut user = vec![("__protVer".into(), "1.0".into())];
        user.push(("__ts".into(), call.ts.unwrap_or_else(now_ts)));
        if let Some(ft) = call.ft {
            user.push(("__ft".into(), ft));
        }
        let props = PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(Bytes::copy_from_slice(&self.correlation.to_be_bytes())),
            message_expiry_interval: Some(60),
            user_properties: user,
            ..PublishProperties::default()
        };
        self.client
            .publish_with_properties(REQUEST_TOPIC, QoS::AtLeastOnce, false, call.payload, props)
            .await
            .expect("publish");
        self.correlation
    }

    /// The answers to correlations `first..first + count`, in that order.
    pub async fn answers(&mut self, first: u64, count: usize) -> Vec<Answer> {
        let mut got: HashMap<u64, Answer> = HashMap::new();
        while got.len() < count {
            let p = timeout(PATIENCE, self.rx.recv())
                .await
                .expect("an answer in time")
                .expect("connection alive");
            if p.topic.starts_with(NOTIFY_PREFIX.as_bytes()) {
                self.notifications.push_back(p);
                continue;
            }
            let props = p.properties.expect("response properties");
            let prop = |name: &str| user_property(&props, name);
            assert_eq!(prop("__stat").as_deref(), Some("200"), "{:?}", p.payload);
            let correlation = props.correlation_data.as_deref().expect("correlation");
            let correlation = u64::from_be_bytes(correlation.try_into().expect("8 bytes"));
            got.insert(
                correlation,
                Answer {
                    payload: p.payload.to_vec(),
                    version: prop("__ts"),
                },
            );
        }
        (first..first + count as u64)
            .map(|c| got.remove(&c).expect("answer for every request"))
            .collect()
    }

    /// One request's response as it came, whatever its `__stat`: its status and payload.
    pub async fn call_status(&mut self, args: &[&[u8]]) -> (Option<String>, Vec<u8>) {
        let correlation = self.send(Call::new(args)).await;
        loop {
            let p = timeout(PATIENCE, self.rx.recv())
                .await
                .expect("an answer in time")
                .expect("connection alive");
            if p.topic.starts_with(NOTIFY_PREFIX.as_bytes()) {
                self.notifications.push_back(p);
                continue;
            }
            let props = p.properties.expect("response properties");
            let matches = props.correlation_data.as_deref() == Some(&correlation.to_be_bytes()[..]);
            if matches {
                let stat = props
                    .user_properties
                    .iter()
                    .find(|(k, _)| k == "__stat")
                    .map(|(_, v)| v.clone());
                return (stat, p.payload.to_vec());
            }
        }
    }

    /// The next notification, waiting up to `within`.
    pub async fn notification(&mut self, within: Duration) -> Option<Publish> {
        if let Some(n) = self.notifications.pop_front() {
            return Some(n);
        }
        loop {
            let p = timeout(within, self.rx.recv()).await.ok()??;
            if p.topic.starts_with(NOTIFY_PREFIX.as_bytes()) {
                return Some(p);
            }
        }
    }
}

/// Writes `contents` to a config file of its own and returns its path.
pub fn config_file(name: &str, contents: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("statehub-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}
