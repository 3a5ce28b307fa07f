//! A small MQTT 5 client on statehub's own codec, for the command-line tools.
//!
//! One connection driven by the command's own task: no background task and no
//! reconnect, since a command-line run that loses its connection should say so and
//! exit. Reading sends PINGREQ when the keep alive is due and answers the server's
//! QoS 1 and 2 deliveries. Every write goes through a buffer that a cancelled
//! operation leaves intact, so a command may drop any operation (Ctrl-C, a timeout)
//! and still send a well-formed DISCONNECT.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use statehub_mqtt_codec::{
    ByteString, Codec, ConnAck, Connect, ConnectProperties, Disconnect, Packet, ProtocolVersion,
    PubResponse, Publish, QoS, ReasonCode, SubAck, Subscribe, SubscriptionOptions,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, timeout, Instant};

use crate::connect::Endpoint;
use crate::error::ClientError;

/// Messages the server may have in flight to us at QoS 1 and 2 (our Receive Maximum),
/// which also bounds the QoS 2 packet ids awaiting PUBREL.
const RECEIVE_MAXIMUM: u16 = 64;
/// Messages kept while an operation waits for its acknowledgement.
pub const MAX_PENDING: usize = 10_000;

/// The byte stream under the client: TCP today, and TLS wraps it the same way.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One MQTT 5 connection.
pub struct Client {
    io: Box<dyn Io>,
    codec: Codec,
    rbuf: BytesMut,
    wbuf: BytesMut,
    next_id: u16,
    keep_alive: Option<Duration>,
    last_sent: Instant,
    /// When a PINGREQ went unanswered since.
    ping_sent: Option<Instant>,
    /// Messages that arrived while an operation waited, handed out first.
    pending: VecDeque<Publish>,
    /// QoS 2 messages delivered and acknowledged with PUBREC, awaiting PUBREL.
    awaiting_rel: HashSet<u16>,
    timeout: Duration,
    max_packet: Option<u32>,
    client_id: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Opens the connection and sends CONNECT (clean start, no session kept); fails
    /// unless the CONNACK is a success.
    pub async fn connect(endpoint: &Endpoint) -> Result<Client, ClientError> {
        let addr = endpoint.address();
        let stream = timeout(
            endpoint.timeout,
            TcpStream::connect((endpoint.host.as_str(), endpoint.port)),
        )
        .await
        .map_err(|_| ClientError::Timeout("connecting"))?
        .map_err(|source| ClientError::Connect { addr, source })?;
        stream.set_nodelay(true)?;
        let mut client = Client {
            io: Box::new(stream),
            codec: Codec::with_version(ProtocolVersion::V5, 0),
            rbuf: BytesMut::with_capacity(8192),
            wbuf: BytesMut::new(),
            next_id: 0,
            keep_alive: (endpoint.keep_alive > 0)
                .then(|| Duration::from_secs(u64::from(endpoint.keep_alive))),
            last_sent: Instant::now(),
            ping_sent: None,
            pending: VecDeque::new(),
            awaiting_rel: HashSet::new(),
            timeout: endpoint.timeout,
            max_packet: None,
            client_id: endpoint.client_id.clone(),
        };
        let connect = Connect {
            protocol: ProtocolVersion::V5,
            clean_start: true,
            keep_alive: endpoint.keep_alive,
            client_id: ByteString::from(endpoint.client_id.as_str()),
            username: endpoint.username.as_deref().map(ByteString::from),
            password: endpoint.password.clone().map(Bytes::from),
            will: None,
            properties: ConnectProperties {
                receive_maximum: Some(RECEIVE_MAXIMUM),
                ..ConnectProperties::default()
            },
        };
        client.send(&Packet::Connect(Box::new(connect))).await?;
        let ack = client
            .wait_for("waiting for CONNACK", |p| matches!(p, Packet::ConnAck(_)))
            .await?;
        let Packet::ConnAck(ack) = ack else {
            return Err(ClientError::Protocol("expected CONNACK".into()));
        };
        client.accept(ack)?;
        Ok(client)
    }

    fn accept(&mut self, ack: ConnAck) -> Result<(), ClientError> {
        if !ack.reason_code.is_success() {
            return Err(ClientError::Refused {
                what: "connection".into(),
                code: ack.reason_code,
                reason: ack.properties.reason_string.map(|s| s.to_string()),
            });
        }
        if let Some(id) = ack.properties.assigned_client_identifier {
            self.client_id = id.to_string();
        }
        if let Some(secs) = ack.properties.server_keep_alive {
            self.keep_alive = (secs > 0).then(|| Duration::from_secs(u64::from(secs)));
        }
        self.max_packet = ack.properties.maximum_packet_size;
        Ok(())
    }

    /// The client id the server knows this connection by.
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// Publishes and completes the QoS exchange; returns the PUBACK's or PUBREC's
    /// reason code (success for QoS 0), failing on a refusal.
    pub async fn publish(&mut self, mut publish: Publish) -> Result<ReasonCode, ClientError> {
        let qos = publish.qos;
        let id = (qos != QoS::AtMostOnce).then(|| self.next_packet_id());
        publish.packet_id = id;
        let what = format!("publish to {}", publish.topic);
        self.send(&Packet::Publish(publish)).await?;
        let Some(id) = id else {
            return Ok(ReasonCode::SUCCESS);
        };
        let ack = match qos {
            QoS::AtLeastOnce => {
                self.wait_ack("waiting for PUBACK", |p| match p {
                    Packet::PubAck(a) if a.packet_id == id => Some(a),
                    _ => None,
                })
                .await?
            }
            _ => {
                self.wait_ack("waiting for PUBREC", |p| match p {
                    Packet::PubRec(a) if a.packet_id == id => Some(a),
                    _ => None,
                })
                .await?
            }
        };
        refused(&what, &ack)?;
        if qos == QoS::ExactlyOnce {
            self.send(&Packet::PubRel(PubResponse::ok(id))).await?;
            let comp = self
                .wait_ack("waiting for PUBCOMP", |p| match p {
                    Packet::PubComp(a) if a.packet_id == id => Some(a),
                    _ => None,
                })
                .await?;
            refused(&what, &comp)?;
        }
        Ok(ack.reason_code)
    }

    /// Subscribes to each filter; fails if the server refuses any of them.
    pub async fn subscribe(&mut self, filters: &[(String, QoS)]) -> Result<SubAck, ClientError> {
        let packet_id = self.next_packet_id();
        let subscribe = Subscribe {
            packet_id,
            filters: filters
                .iter()
                .map(|(f, qos)| {
                    let options = SubscriptionOptions {
                        qos: *qos,
                        ..SubscriptionOptions::default()
                    };
                    (ByteString::from(f.as_str()), options)
                })
                .collect(),
            ..Subscribe::default()
        };
        self.send(&Packet::Subscribe(subscribe)).await?;
        let ack = self
            .wait_ack("waiting for SUBACK", |p| match p {
                Packet::SubAck(a) if a.packet_id == packet_id => Some(a),
                _ => None,
            })
            .await?;
        for ((filter, _), code) in filters.iter().zip(&ack.reason_codes) {
            if !code.is_success() {
                return Err(ClientError::Refused {
                    what: format!("subscription to {filter}"),
                    code: *code,
                    reason: ack.reason_string.as_ref().map(|s| s.to_string()),
                });
            }
        }
        Ok(ack)
    }

    /// The next message, already acknowledged. No deadline of its own: callers race it
    /// against theirs.
    pub async fn recv(&mut self) -> Result<Publish, ClientError> {
        self.recv_where(|_| true).await
    }

    /// The next message `want` accepts; others are kept (up to [`MAX_PENDING`]) for
    /// later calls.
    pub async fn recv_where(
        &mut self,
        want: impl Fn(&Publish) -> bool,
    ) -> Result<Publish, ClientError> {
        if let Some(i) = self.pending.iter().position(&want) {
            if let Some(p) = self.pending.remove(i) {
                return Ok(p);
            }
        }
        loop {
            match self.read_packet().await? {
                Packet::Publish(p) => {
                    let Some(p) = self.deliver(p).await? else {
                        continue;
                    };
                    if want(&p) {
                        return Ok(p);
                    }
                    self.keep(p)?;
                }
                other => self.unexpected(other).await?,
            }
        }
    }

    /// Sends DISCONNECT (normal) and closes; errors are of no interest by then.
    pub async fn disconnect(mut self) {
        let bye = Packet::Disconnect(Disconnect::with_reason(ReasonCode::NORMAL_DISCONNECTION));
        if self.send(&bye).await.is_ok() {
            let _ = timeout(self.timeout, self.io.shutdown()).await;
        }
    }

    fn next_packet_id(&mut self) -> u16 {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.next_id
    }

    fn keep(&mut self, p: Publish) -> Result<(), ClientError> {
        if self.pending.len() >= MAX_PENDING {
            return Err(ClientError::Backlog(MAX_PENDING));
        }
        self.pending.push_back(p);
        Ok(())
    }

    /// Acknowledges an incoming message; `None` for a QoS 2 message delivered before.
    async fn deliver(&mut self, p: Publish) -> Result<Option<Publish>, ClientError> {
        match (p.qos, p.packet_id) {
            (QoS::AtLeastOnce, Some(id)) => {
                self.send(&Packet::PubAck(PubResponse::ok(id))).await?;
                Ok(Some(p))
            }
            (QoS::ExactlyOnce, Some(id)) => {
                let first = !self.awaiting_rel.contains(&id);
                if first && self.awaiting_rel.len() >= usize::from(RECEIVE_MAXIMUM) {
                    return Err(ClientError::Protocol(format!(
                        "more than {RECEIVE_MAXIMUM} QoS 2 messages in flight (our Receive Maximum)"
                    )));
                }
                self.awaiting_rel.insert(id);
                self.send(&Packet::PubRec(PubResponse::ok(id))).await?;
                Ok(first.then_some(p))
            }
            _ => Ok(Some(p)),
        }
    }

    /// A packet no operation waits for: PUBREL and PINGRESP are handled, DISCONNECT
    /// ends the connection, anything else is a protocol error.
    async fn unexpected(&mut self, packet: Packet) -> Result<(), ClientError> {
        match packet {
            Packet::PubRel(r) => {
                self.awaiting_rel.remove(&r.packet_id);
                self.send(&Packet::PubComp(PubResponse::ok(r.packet_id)))
                    .await
            }
            Packet::PingResp => Ok(()),
            Packet::Disconnect(d) => Err(ClientError::Disconnected {
                code: d.reason_code,
                reason: d.reason_string.map(|s| s.to_string()),
            }),
            other => Err(ClientError::Protocol(format!(
                "unexpected packet from the server: {}",
                packet_name(&other)
            ))),
        }
    }

    /// The acknowledgement `pick` selects, within the timeout; messages arriving
    /// meanwhile are acknowledged and kept.
    async fn wait_ack<T>(
        &mut self,
        what: &'static str,
        pick: impl Fn(Packet) -> Option<T>,
    ) -> Result<T, ClientError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let packet = tokio::time::timeout_at(deadline, self.read_packet())
                .await
                .map_err(|_| ClientError::Timeout(what))??;
            let packet = match packet {
                Packet::Publish(p) => {
                    if let Some(p) = self.deliver(p).await? {
                        self.keep(p)?;
                    }
                    continue;
                }
                p @ (Packet::PubAck(_)
                | Packet::PubRec(_)
                | Packet::PubComp(_)
                | Packet::SubAck(_)
                | Packet::UnsubAck(_)
                | Packet::ConnAck(_)) => p,
                other => {
                    self.unexpected(other).await?;
                    continue;
                }
            };
            if let Some(found) = pick(packet) {
                return Ok(found);
            }
        }
    }

    async fn wait_for(
        &mut self,
        what: &'static str,
        want: impl Fn(&Packet) -> bool,
    ) -> Result<Packet, ClientError> {
        self.wait_ack(what, |p| want(&p).then_some(p)).await
    }

    async fn send(&mut self, packet: &Packet) -> Result<(), ClientError> {
        let start = self.wbuf.len();
        self.codec
            .encode(packet, &mut self.wbuf)
            .map_err(|e| ClientError::Protocol(format!("cannot encode: {e}")))?;
        let size = self.wbuf.len() - start;
        if let Some(max) = self.max_packet.filter(|&max| size > max as usize) {
            self.wbuf.truncate(start);
            return Err(ClientError::TooLarge { size, max });
        }
        self.flush().await
    }

    /// Writes out the buffer; a cancelled flush leaves the unwritten rest in it.
    async fn flush(&mut self) -> Result<(), ClientError> {
        while !self.wbuf.is_empty() {
            self.io.write_buf(&mut self.wbuf).await?;
        }
        self.last_sent = Instant::now();
        Ok(())
    }

    /// The next packet off the wire, pinging when the keep alive is due.
    async fn read_packet(&mut self) -> Result<Packet, ClientError> {
        loop {
            if let Some(p) = self
                .codec
                .decode(&mut self.rbuf)
                .map_err(|e| ClientError::Protocol(e.to_string()))?
            {
                if matches!(p, Packet::PingResp) {
                    self.ping_sent = None;
                }
                return Ok(p);
            }
            self.flush().await?;
            let due = self.keep_alive.map(|k| match self.ping_sent {
                // No answer within another keep alive: the server is gone.
                Some(sent) => sent + k,
                None => self.last_sent + k,
            });
            let tick = async {
                match due {
                    Some(at) => sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                read = self.io.read_buf(&mut self.rbuf) => match read? {
                    0 => return Err(ClientError::Closed),
                    _ => continue,
                },
                () = tick => {
                    if self.ping_sent.is_some() {
                        return Err(ClientError::Io(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no answer to PINGREQ within the keep alive",
                        )));
                    }
                    self.send(&Packet::PingReq).await?;
                    self.ping_sent = Some(Instant::now());
                }
            }
        }
    }
}

fn refused(what: &str, ack: &PubResponse) -> Result<(), ClientError> {
    if ack.reason_code.is_success() {
        return Ok(());
    }
    Err(ClientError::Refused {
        what: what.to_owned(),
        code: ack.reason_code,
        reason: ack.reason_string.as_ref().map(|s| s.to_string()),
    })
}

fn packet_name(p: &Packet) -> &'static str {
    match p {
        Packet::Connect(_) => "CONNECT",
        Packet::ConnAck(_) => "CONNACK",
        Packet::Publish(_) => "PUBLISH",
        Packet::PubAck(_) => "PUBACK",
        Packet::PubRec(_) => "PUBREC",
        Packet::PubRel(_) => "PUBREL",
        Packet::PubComp(_) => "PUBCOMP",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::SubAck(_) => "SUBACK",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::PingReq => "PINGREQ",
        Packet::PingResp => "PINGRESP",
        Packet::Disconnect(_) => "DISCONNECT",
        Packet::Auth(_) => "AUTH",
    }
}
