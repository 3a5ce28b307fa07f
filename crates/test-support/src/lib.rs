//! Helpers shared by the broker's integration tests and the binary's session tests
//! (a dev-dependency only): an in-process broker on a free port, a raw MQTT client over
//! TCP built on our codec (for exact protocol checks), and thin wrappers around rumqttc
//! (v5 and 3.1.1) for end-to-end checks, and a real full disk ([`tmpfs`]).
//!
//! Every wait is bounded: `expect*` panic after [`WAIT`] unless told otherwise.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use statehub_broker::codec::{
    ByteString, Codec, ConnAck, Connect, ConnectProperties, Disconnect, Packet, ProtocolVersion,
    PubResponse, Publish, PublishProperties, QoS, ReasonCode, SubAck, Subscribe,
    SubscriptionOptions, UnsubAck, Unsubscribe,
};
use statehub_broker::{Broker, BrokerConfig, Clock, ManualClock, MqttListener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

pub use ProtocolVersion::{V311, V5};

/// Default bound on every wait for a packet.
pub const WAIT: Duration = Duration::from_secs(3);
/// How long "nothing arrives" is watched for.
pub const QUIET: Duration = Duration::from_millis(300);

/// Starts an in-process broker on 127.0.0.1:0 and returns it with its address.
pub async fn start_broker(cfg: BrokerConfig) -> (Broker, SocketAddr) {
    start_broker_on(cfg, Clock::system()).await
}

/// Starts an in-process broker on `clock` and returns it with its address and the
/// clock's handle (time moves when the test says so, besides real time).
pub async fn start_with_clock(cfg: BrokerConfig) -> (Broker, SocketAddr, ManualClock) {
    let manual = ManualClock::new();
    let (broker, addr) = start_broker_on(cfg, manual.clock()).await;
    (broker, addr, manual)
}

async fn start_broker_on(cfg: BrokerConfig, clock: Clock) -> (Broker, SocketAddr) {
    let broker = Broker::with_clock(cfg, clock);
    let addr = listen(&broker).await;
    (broker, addr)
}

/// Serves `broker` on 127.0.0.1:0 (MQTT over TCP) from a task; returns the address.
pub async fn listen(broker: &Broker) -> SocketAddr {
    let l = MqttListener::bind(broker.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(l.serve(Duration::from_secs(1)));
    addr
}

pub async fn start_default() -> (Broker, SocketAddr) {
    start_broker(BrokerConfig::default()).await
}

pub fn bs(s: &str) -> ByteString {
    ByteString::from(s)
}

/// A CONNECT with clean start, keep alive 60 and no properties.
pub fn connect_packet(version: ProtocolVersion, client_id: &str) -> Connect {
    Connect {
        protocol: version,
        clean_start: true,
        keep_alive: 60,
        client_id: bs(client_id),
        username: None,
        password: None,
        will: None,
        properties: ConnectProperties::default(),
    }
}

/// A RESP array of bulk strings: a state store request's payload as the SDKs write it,
/// encoded here apart from the store's own encoder.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// An MQTT 5 CONNECT of a persistent session: clean start off and a session expiry of
/// `expiry` seconds.
pub fn persistent_connect(client_id: &str, expiry: u32) -> Connect {
    Connect {
        clean_start: false,
        properties: ConnectProperties {
            session_expiry_interval: Some(expiry),
            ..Default::default()
        },
        ..connect_packet(V5, client_id)
    }
}

pub fn opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..Default::default()
    }
}

pub fn publish(topic: &str, qos: QoS, payload: &[u8]) -> Publish {
    Publish {
        topic: bs(topic),
        qos,
        payload: Bytes::copy_from_slice(payload),
        ..Default::default()
    }
}

/// What a read produced.
#[derive(Debug)]
pub enum Event {
    Packet(Packet),
    /// EOF or connection reset.
    Closed,
    /// Bytes the codec could not decode.
    DecodeError(String),
    Timeout,
}

/// A raw MQTT client: one TCP stream and our codec in client mode.
#[derive(Debug)]
pub struct RawClient {
    pub stream: TcpStream,
    pub codec: Codec,
    rbuf: BytesMut,
    next_id: u16,
    /// PUBLISHes that arrived while a helper waited for an acknowledgement; handed
    /// out first by [`RawClient::next_event`].
    pending: std::collections::VecDeque<Packet>,
}

impl RawClient {
    /// Opens a TCP connection without sending anything.
    pub async fn open(addr: SocketAddr, version: ProtocolVersion) -> RawClient {
        let stream = timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("tcp connect timed out")
            .expect("tcp connect");
        stream.set_nodelay(true).unwrap();
        RawClient::from_stream(stream, version)
    }

    pub fn from_stream(stream: TcpStream, version: ProtocolVersion) -> RawClient {
        RawClient {
            stream,
            codec: Codec::with_version(version, 0),
            rbuf: BytesMut::new(),
            next_id: 0,
            pending: Default::default(),
        }
    }

    /// Connects with `connect` and returns the CONNACK (whatever its code).
    pub async fn connect_with(addr: SocketAddr, connect: Connect) -> (RawClient, ConnAck) {
        let mut c = RawClient::open(addr, connect.protocol).await;
        c.send(&Packet::Connect(Box::new(connect))).await;
        match c.expect().await {
            Packet::ConnAck(ack) => (c, ack),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    /// Connects with clean start and asserts success.
    pub async fn connect(addr: SocketAddr, version: ProtocolVersion, client_id: &str) -> RawClient {
        let (c, ack) = RawClient::connect_with(addr, connect_packet(version, client_id)).await;
        assert_eq!(
            ack.reason_code,
            ReasonCode::SUCCESS,
            "CONNACK refused: {ack:?}"
        );
        c
    }

    pub fn next_packet_id(&mut self) -> u16 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    /// Sends one packet (a QoS 1/2 PUBLISH without packet id gets one).
    pub async fn send(&mut self, p: &Packet) {
        let mut out = BytesMut::new();
        match p {
            Packet::Publish(pb) if pb.qos != QoS::AtMostOnce && pb.packet_id.is_none() => {
                let mut pb = pb.clone();
                pb.packet_id = Some(self.next_packet_id());
                self.codec
                    .encode(&Packet::Publish(pb), &mut out)
                    .expect("encode");
            }
            _ => self.codec.encode(p, &mut out).expect("encode"),
        }
        self.send_raw(&out).await;
    }

    pub async fn send_raw(&mut self, bytes: &[u8]) {
        timeout(WAIT, self.stream.write_all(bytes))
            .await
            .expect("write timed out")
            .expect("write failed");
    }

    /// Writes and ignores errors (the broker may already have closed).
    pub async fn try_send_raw(&mut self, bytes: &[u8]) -> bool {
        matches!(
            timeout(WAIT, self.stream.write_all(bytes)).await,
            Ok(Ok(()))
        )
    }

    /// The next event within `within`.
    pub async fn next_event(&mut self, within: Duration) -> Event {
        if let Some(p) = self.pending.pop_front() {
            return Event::Packet(p);
        }
        self.read_event(within).await
    }

    /// The next packet off the wire (ignoring `pending`).
    async fn read_event(&mut self, within: Duration) -> Event {
        let deadline = Instant::now() + within;
        loop {
            match self.codec.decode(&mut self.rbuf) {
                Ok(Some(p)) => return Event::Packet(p),
                Ok(None) => {}
                Err(e) => return Event::DecodeError(e.to_string()),
            }
            self.rbuf.reserve(8192);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.rbuf)).await {
                Err(_) => return Event::Timeout,
                Ok(Ok(0)) | Ok(Err(_)) => return Event::Closed,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// The next packet within [`WAIT`]; panics on close or timeout.
    pub async fn expect(&mut self) -> Packet {
        self.expect_within(WAIT).await
    }

    pub async fn expect_within(&mut self, within: Duration) -> Packet {
        match self.next_event(within).await {
            Event::Packet(p) => p,
            other => panic!("expected a packet within {within:?}, got {other:?}"),
        }
    }

    /// The next packet `want` accepts, within [`WAIT`]; PUBLISHes arriving
    /// meanwhile are kept for later, anything else fails the test.
    pub async fn expect_reply(&mut self, what: &str, want: impl Fn(&Packet) -> bool) -> Packet {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.read_event(left).await {
                Event::Packet(p) if want(&p) => return p,
                Event::Packet(p @ Packet::Publish(_)) => self.pending.push_back(p),
                other => panic!("expected {what}, got {other:?}"),
            }
        }
    }

    pub async fn expect_publish(&mut self) -> Publish {
        match self.expect().await {
            Packet::Publish(p) => p,
            other => panic!("expected PUBLISH, got {other:?}"),
        }
    }

    /// Receives a PUBLISH and acknowledges it (PUBACK, or PUBREC/PUBREL/PUBCOMP).
    pub async fn expect_publish_ack(&mut self) -> Publish {
        let p = self.expect_publish().await;
        self.ack(&p).await;
        p
    }

    pub async fn ack(&mut self, p: &Publish) {
        match p.qos {
            QoS::AtMostOnce => {}
            QoS::AtLeastOnce => {
                self.send(&Packet::PubAck(PubResponse::ok(p.packet_id.unwrap())))
                    .await
            }
            QoS::ExactlyOnce => {
                let id = p.packet_id.unwrap();
                self.send(&Packet::PubRec(PubResponse::ok(id))).await;
                self.expect_reply(
                    "PUBREL",
                    |p| matches!(p, Packet::PubRel(r) if r.packet_id == id),
                )
                .await;
                self.send(&Packet::PubComp(PubResponse::ok(id))).await;
            }
        }
    }

    /// Asserts no packet arrives (and the connection stays open) for `within`.
    pub async fn expect_nothing(&mut self, within: Duration) {
        match self.next_event(within).await {
            Event::Timeout => {}
            other => panic!("expected nothing within {within:?}, got {other:?}"),
        }
    }

    /// Asserts the connection is closed without any further packet.
    pub async fn expect_closed(&mut self) {
        match self.next_event(WAIT).await {
            Event::Closed => {}
            other => panic!("expected the connection to close, got {other:?}"),
        }
    }

    /// Asserts the next packet is a DISCONNECT with `code`, then the close.
    pub async fn expect_disconnect(&mut self, code: ReasonCode) -> Disconnect {
        self.expect_disconnect_within(code, WAIT).await
    }

    pub async fn expect_disconnect_within(
        &mut self,
        code: ReasonCode,
        within: Duration,
    ) -> Disconnect {
        let d = match self.next_event(within).await {
            Event::Packet(Packet::Disconnect(d)) => d,
            other => panic!(
                "expected DISCONNECT 0x{:02X} within {within:?}, got {other:?}",
                code.0
            ),
        };
        assert_eq!(d.reason_code, code, "DISCONNECT reason code: {d:?}");
        self.expect_closed().await;
        d
    }

    /// Subscribes to one filter and returns the SUBACK.
    pub async fn subscribe(&mut self, filter: &str, options: SubscriptionOptions) -> SubAck {
        self.subscribe_with(vec![(bs(filter), options)], None).await
    }

    pub async fn subscribe_with(
        &mut self,
        filters: Vec<(ByteString, SubscriptionOptions)>,
        subscription_identifier: Option<u32>,
    ) -> SubAck {
        let packet_id = self.next_packet_id();
        let s = Subscribe {
            packet_id,
            subscription_identifier,
            filters,
            ..Default::default()
        };
        self.send(&Packet::Subscribe(s)).await;
        match self
            .expect_reply("SUBACK", |p| matches!(p, Packet::SubAck(_)))
            .await
        {
            Packet::SubAck(a) => {
                assert_eq!(a.packet_id, packet_id);
                a
            }
            other => panic!("expected SUBACK, got {other:?}"),
        }
    }

    pub async fn unsubscribe(&mut self, filters: &[&str]) -> UnsubAck {
        let packet_id = self.next_packet_id();
        let u = Unsubscribe {
            packet_id,
            filters: filters.iter().map(|f| bs(f)).collect(),
            ..Default::default()
        };
        self.send(&Packet::Unsubscribe(u)).await;
        match self
            .expect_reply("UNSUBACK", |p| matches!(p, Packet::UnsubAck(_)))
            .await
        {
            Packet::UnsubAck(a) => {
                assert_eq!(a.packet_id, packet_id);
                a
            }
            other => panic!("expected UNSUBACK, got {other:?}"),
        }
    }

    /// Publishes and completes the QoS exchange; returns the PUBACK/PUBREC code
    /// (SUCCESS for QoS 0).
    pub async fn publish(&mut self, mut p: Publish) -> ReasonCode {
        if p.qos != QoS::AtMostOnce && p.packet_id.is_none() {
            p.packet_id = Some(self.next_packet_id());
        }
        let qos = p.qos;
        let id = p.packet_id;
        self.send(&Packet::Publish(p)).await;
        match qos {
            QoS::AtMostOnce => ReasonCode::SUCCESS,
            QoS::AtLeastOnce => match self
                .expect_reply("PUBACK", |p| matches!(p, Packet::PubAck(_)))
                .await
            {
                Packet::PubAck(a) => {
                    assert_eq!(Some(a.packet_id), id);
                    a.reason_code
                }
                other => panic!("expected PUBACK, got {other:?}"),
            },
            QoS::ExactlyOnce => {
                let code = match self
                    .expect_reply("PUBREC", |p| matches!(p, Packet::PubRec(_)))
                    .await
                {
                    Packet::PubRec(a) => {
                        assert_eq!(Some(a.packet_id), id);
                        a.reason_code
                    }
                    other => panic!("expected PUBREC, got {other:?}"),
                };
                if code.is_success() {
                    self.send(&Packet::PubRel(PubResponse::ok(id.unwrap())))
                        .await;
                    match self
                        .expect_reply("PUBCOMP", |p| matches!(p, Packet::PubComp(_)))
                        .await
                    {
                        Packet::PubComp(c) => assert_eq!(Some(c.packet_id), id),
                        other => panic!("expected PUBCOMP, got {other:?}"),
                    }
                }
                code
            }
        }
    }

    pub async fn publish_simple(&mut self, topic: &str, qos: QoS, payload: &[u8]) -> ReasonCode {
        self.publish(publish(topic, qos, payload)).await
    }

    /// Sends PUBLISHes with packet ids 1..=qos.len() on `topic`, each with its id as
    /// its one-byte payload, without waiting for any acknowledgement.
    pub async fn publish_numbered(&mut self, topic: &str, qos: &[QoS]) {
        for (i, q) in qos.iter().enumerate() {
            let id = u16::try_from(i + 1).expect("at most 65,535");
            let mut p = publish(topic, *q, &[id as u8]);
            p.packet_id = Some(id);
            self.send(&Packet::Publish(p)).await;
        }
    }

    /// The next packet is the acknowledgement of `id` (PUBACK for QoS 1, PUBREC for
    /// QoS 2) with `code`.
    pub async fn expect_pub_ack(&mut self, qos: QoS, id: u16, code: ReasonCode) {
        let got = match (qos, self.expect().await) {
            (QoS::AtLeastOnce, Packet::PubAck(a)) | (QoS::ExactlyOnce, Packet::PubRec(a)) => {
                (a.packet_id, a.reason_code)
            }
            (_, other) => panic!("expected the {qos:?} acknowledgement of {id}, got {other:?}"),
        };
        assert_eq!(got, (id, code), "acknowledgements out of order");
    }

    /// A round trip (PINGREQ/PINGRESP): everything sent before was processed.
    pub async fn ping(&mut self) {
        self.send(&Packet::PingReq).await;
        match self
            .expect_reply("PINGRESP", |p| matches!(p, Packet::PingResp))
            .await
        {
            Packet::PingResp => {}
            other => panic!("expected PINGRESP, got {other:?}"),
        }
    }

    pub async fn disconnect(mut self) {
        self.send(&Packet::Disconnect(Disconnect::default())).await;
        let _ = self.next_event(Duration::from_secs(1)).await;
    }
}

/// Publish properties with every field set (for pass-through checks).
pub fn full_properties() -> PublishProperties {
    PublishProperties {
        payload_format_utf8: true,
        message_expiry_interval: Some(3600),
        topic_alias: None,
        response_topic: Some(bs("reply/to/me")),
        correlation_data: Some(Bytes::from_static(&[0, 1, 2, 0xFF])),
        user_properties: vec![
            (bs("k"), bs("1")),
            (bs("a"), bs("x")),
            (bs("k"), bs("2")),
            (bs("k"), bs("1")),
        ],
        subscription_identifiers: Vec::new(),
        content_type: Some(bs("application/json")),
    }
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
pub async fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

mod fabric;
mod rumqtt;
pub use fabric::{FakeFabric, ForwardOutcome};
pub use rumqtt::{v4c, v5c, v5pub};
pub mod tmpfs;
