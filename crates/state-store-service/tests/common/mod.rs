//! Helpers for the service's end-to-end tests: an in-process broker with the state
//! store registered on a free port, and a raw MQTT 5 client (rumqttc) that sends
//! requests with exactly the properties a test chooses and collects what arrives.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, MqttOptions, StateError};
use statehub_broker::{Broker, BrokerConfig, MqttListener};
use statehub_state_store_service::{Settings, StateStoreService, REQUEST_TOPIC};
use tokio::sync::mpsc;
use tokio::time::timeout;

/// Bound on every wait for a message.
pub const WAIT: Duration = Duration::from_secs(3);
/// How long "nothing arrives" is watched for.
pub const QUIET: Duration = Duration::from_millis(300);

/// Starts a broker with the state store on 127.0.0.1:0.
pub async fn start() -> (Broker, SocketAddr) {
    start_with(Settings::default()).await
}

pub async fn start_with(settings: Settings) -> (Broker, SocketAddr) {
    serve(Arc::new(StateStoreService::in_memory(&settings).unwrap())).await
}

/// Starts a broker with the state store persisted in `store` on 127.0.0.1:0.
pub async fn start_durable(
    settings: Settings,
    store: &statehub_storage::Store,
) -> (Broker, SocketAddr) {
    let engine = statehub_state_store_service::DurableEngine::open(store).unwrap();
    let svc = Arc::new(StateStoreService::open_durable(&settings, engine).unwrap());
    serve(svc).await
}

async fn serve<E, A>(svc: Arc<StateStoreService<E, A>>) -> (Broker, SocketAddr)
where
    E: statehub_state_store_service::Engine + Send + std::fmt::Debug + 'static,
    A: statehub_state_store_service::Authorizer + Send + std::fmt::Debug + 'static,
{
    let broker = Broker::new(BrokerConfig::default());
    broker.register_service(REQUEST_TOPIC, svc.clone());
    tokio::spawn(svc.run_expiry(broker.clone()));
    let l = MqttListener::bind(broker.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(l.serve(Duration::from_secs(1)));
    (broker, addr)
}

/// What the client's event loop saw.
#[derive(Debug)]
pub enum Seen {
    Publish(Publish),
    /// A DISCONNECT from the server (reason code byte) or the connection ending.
    Closed(Option<u8>),
}

/// A connected MQTT 5 client that subscribed to its own response topic.
pub struct Client {
    pub id: String,
    pub client: AsyncClient,
    pub response_topic: String,
    rx: mpsc::UnboundedReceiver<Seen>,
    /// Runs the connection's event loop; aborting it drops the connection.
    connection: tokio::task::JoinHandle<()>,
}

impl Client {
    pub async fn connect(addr: SocketAddr, id: &str) -> Client {
        Self::connect_opts(addr, id, true).await
    }

    pub async fn connect_opts(addr: SocketAddr, id: &str, clean: bool) -> Client {
        Self::connect_with(addr, id, |opts| {
            opts.set_clean_start(clean);
        })
        .await
    }

    /// Connects with the options `configure` sets on top of the defaults.
    pub async fn connect_with(
        addr: SocketAddr,
        id: &str,
        configure: impl FnOnce(&mut MqttOptions),
    ) -> Client {
        let mut opts = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        opts.set_keep_alive(Duration::from_secs(30));
        configure(&mut opts);
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel();
        let connection = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(Seen::Publish(p));
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Disconnect(d))) => {
                        let _ = tx.send(Seen::Closed(Some(d.reason_code as u8)));
                        return;
                    }
                    Ok(_) => {}
                    Err(ConnectionError::MqttState(StateError::ServerDisconnect {
                        reason_code,
                        ..
                    })) => {
                        let _ = tx.send(Seen::Closed(Some(reason_code as u8)));
                        return;
                    }
                    Err(_) => {
                        let _ = tx.send(Seen::Closed(None));
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
            .unwrap();
        timeout(WAIT, ready_rx.recv())
            .await
            .expect("no SUBACK")
            .unwrap();
        Client {
            id: id.to_owned(),
            client,
            response_topic,
            rx,
            connection,
        }
    }

    /// Drops the connection without a DISCONNECT (as a network failure would).
    pub async fn drop_connection(self) {
        self.connection.abort();
        let _ = self.connection.await;
    }

    /// Subscribes to `filter` and waits for the SUBACK (by waiting for a round trip).
    pub async fn subscribe(&self, filter: &str) {
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Publishes a request with `props` as given (QoS 1).
    pub async fn send(&self, payload: &[u8], props: PublishProperties) {
        self.send_qos(payload, props, QoS::AtLeastOnce).await;
    }

    pub async fn send_qos(&self, payload: &[u8], props: PublishProperties, qos: QoS) {
        self.client
            .publish_with_properties(
                REQUEST_TOPIC,
                qos,
                false,
                Bytes::copy_from_slice(payload),
                props,
            )
            .await
            .unwrap();
    }

    /// The properties an SDK client sends (correlation `corr`, expiry 10 s, `__ts`).
    pub fn props(&self, corr: u8, ts: Option<String>) -> PublishProperties {
        let mut user = vec![
            ("__srcId".to_owned(), self.id.clone()),
            ("__protVer".to_owned(), "1.0".to_owned()),
        ];
        if let Some(ts) = ts {
            user.push(("__ts".to_owned(), ts));
        }
        PublishProperties {
            response_topic: Some(self.response_topic.clone()),
            correlation_data: Some(Bytes::from(vec![corr; 16])),
            message_expiry_interval: Some(10),
            content_type: Some("application/octet-stream".to_owned()),
            user_properties: user,
            ..Default::default()
        }
    }

    /// Sends a request and waits for its response.
    pub async fn call(&mut self, payload: &[u8], corr: u8, ts: Option<String>) -> Publish {
        self.send(payload, self.props(corr, ts)).await;
        self.next_publish().await
    }

    /// Sends a request that also notifies this client: returns (response, notification),
    /// whatever order they arrive in.
    pub async fn call_and_notified(
        &mut self,
        payload: &[u8],
        corr: u8,
        ts: Option<String>,
    ) -> (Publish, Publish) {
        self.send(payload, self.props(corr, ts)).await;
        let a = self.next_publish().await;
        let b = self.next_publish().await;
        if a.topic == self.response_topic.as_bytes() {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// The next message that arrives (panics after [`WAIT`]).
    pub async fn next_publish(&mut self) -> Publish {
        match self.next(WAIT).await {
            Some(Seen::Publish(p)) => p,
            other => panic!("expected a PUBLISH, got {other:?}"),
        }
    }

    pub async fn next(&mut self, wait: Duration) -> Option<Seen> {
        timeout(wait, self.rx.recv()).await.ok().flatten()
    }

    /// Asserts nothing arrives for [`QUIET`].
    pub async fn expect_quiet(&mut self) {
        if let Some(seen) = self.next(QUIET).await {
            panic!("expected nothing, got {seen:?}");
        }
    }
}

/// A client HLC for now (`__ts` of SET requests).
pub fn now_ts() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!("{ms:015}:00000:client")
}

/// RESP array of bulk strings.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// All values of user property `name`.
pub fn user(p: &Publish, name: &str) -> Vec<String> {
    let props = p.properties.as_ref().expect("properties");
    props
        .user_properties
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .collect()
}

/// The single value of user property `name`, if any.
pub fn user1(p: &Publish, name: &str) -> Option<String> {
    let mut values = user(p, name);
    assert!(values.len() <= 1, "{name} appears {} times", values.len());
    values.pop()
}
