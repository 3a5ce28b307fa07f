//! CONNECT handling: read it (and any AUTH rounds) before the deadline, validate,
//! authenticate, find or create the session (taking it over from an older connection
//! if need be), and answer with the CONNACK, refusing ones encoded by the codec.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use statehub_mqtt_codec::{
    validate, ByteString, Codec, ConnAck, ConnAckProperties, Connect, DecodeError, Packet,
    ProtocolVersion, ReasonCode,
};
use tokio::time::Instant;

use super::authn::{self, Origin};
use super::{barrier, Conn};
use crate::auth::{Identity, Principal};
use crate::authz::Grants;
use crate::broker::OpenConnection;
use crate::fabric::FabricError;
use crate::metrics::packet_type;
use crate::pending::Admission;
use crate::rate::Bucket;
use crate::ratelimit::LogLimit;
use crate::service::{BoxFuture, ClientInfo};
use crate::session::Session;
use crate::signal::Signal;
use crate::topic;
use crate::transport::Transport;
use crate::Broker;

/// The negotiated parameters of an accepted connection.
pub(crate) struct Accepted {
    pub session: Arc<Session>,
    /// What the authorization rules grant the client.
    pub grants: Grants,
    pub generation: u64,
    pub signal: Arc<Signal>,
    pub connack: ConnAck,
    pub keep_alive: Duration,
    pub session_expiry: u32,
    /// The session was recorded in the session store: the CONNACK waits for it.
    pub stored: bool,
    /// The cluster is being told of the connection: the CONNACK waits for it.
    pub announced: Option<BoxFuture<'static, Result<(), FabricError>>>,
}

/// A CONNECT that cannot be accepted: answer with this CONNACK code and close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused(pub ReasonCode);

/// Checks the CONNECT's own fields.
pub(crate) fn check(broker: &Broker, connect: &Connect) -> Result<(), Refused> {
    if connect.client_id.is_empty()
        && !connect.clean_start
        && connect.protocol == ProtocolVersion::V311
    {
        return Err(Refused(ReasonCode::CLIENT_IDENTIFIER_NOT_VALID));
    }
    if let Some(w) = &connect.will {
        if validate::topic_name(&w.topic).is_err()
            || topic::too_deep(&w.topic, broker.config().max_topic_levels)
        {
            return Err(Refused(ReasonCode::TOPIC_NAME_INVALID));
        }
        if w.properties
            .response_topic
            .as_deref()
            .is_some_and(|t| validate::topic_name(t).is_err())
        {
            return Err(Refused(ReasonCode::PROTOCOL_ERROR));
        }
        if w.properties.payload_format_utf8 && std::str::from_utf8(&w.payload).is_err() {
            return Err(Refused(ReasonCode::PAYLOAD_FORMAT_INVALID));
        }
    }
    Ok(())
}

/// Attaches the connection to its session and builds the CONNACK.
pub(crate) fn accept(
    broker: &Broker,
    connect: &mut Connect,
    auth_data: Option<bytes::Bytes>,
    identity: &Identity,
    expected: bool,
) -> Result<Accepted, Refused> {
    let cfg = broker.config();
    let mut props = ConnAckProperties::default();
    if connect.client_id.is_empty() {
        let id: ByteString = format!("statehub-{:016x}", rand::random::<u64>()).into();
        props.assigned_client_identifier = Some(id.clone());
        connect.client_id = id;
    }
    let requested_expiry = match connect.protocol {
        ProtocolVersion::V5 => connect.properties.session_expiry_interval.unwrap_or(0),
        ProtocolVersion::V311 if connect.clean_start => 0,
        ProtocolVersion::V311 => u32::MAX,
    };
    let session_expiry = requested_expiry.min(cfg.max_session_expiry);
    if session_expiry != requested_expiry && connect.protocol == ProtocolVersion::V5 {
        props.session_expiry_interval = Some(session_expiry);
    }

    let mut keep_alive = connect.keep_alive;
    if cfg.max_keep_alive > 0
        && (keep_alive > cfg.max_keep_alive || (keep_alive == 0 && !cfg.keep_alive_zero_allowed))
    {
        keep_alive = cfg.max_keep_alive;
        props.server_keep_alive = Some(keep_alive);
    }

    // Before the session is taken over: a refused client must not end another's.
    let grants = authorize(broker, connect, identity)?;
    let generation = broker.next_generation();
    let signal = Arc::new(Signal::default());
    let taken = broker
        .take_session(
            &connect.client_id,
            (connect.clean_start, expected),
            session_expiry,
            generation,
            signal.clone(),
        )
        .map_err(|code| {
            if code == ReasonCode::QUOTA_EXCEEDED {
                broker.refused_persistent_session(&connect.client_id);
            }
            Refused(code)
        })?;

    props.receive_maximum = Some(cfg.receive_maximum);
    props.maximum_packet_size = Some(cfg.max_packet_size);
    props.topic_alias_maximum = Some(cfg.topic_alias_maximum);
    props.retain_available = Some(true);
    props.wildcard_subscription_available = Some(true);
    props.subscription_identifiers_available = Some(true);
    props.shared_subscription_available = Some(true);
    if connect.properties.request_response_information == Some(true) {
        props.response_information =
            Some(format!("statehub/responses/{}", connect.client_id).into());
    }
    if let Some(method) = &connect.properties.authentication_method {
        props.authentication_method = Some(method.clone());
        props.authentication_data = auth_data;
    }
    Ok(Accepted {
        session: taken.session,
        grants,
        generation,
        signal,
        connack: ConnAck {
            session_present: taken.present,
            reason_code: ReasonCode::SUCCESS,
            properties: props,
        },
        keep_alive: Duration::from_secs(u64::from(keep_alive)),
        session_expiry,
        stored: taken.stored,
        announced: taken.announced,
    })
}

/// The client's grants, or the refusal (0x87, return code 5 for 3.1.1) of a client the
/// rules do not let connect or whose will topic neither they nor the built-in
/// protections let it publish on.
fn authorize(broker: &Broker, connect: &Connect, identity: &Identity) -> Result<Grants, Refused> {
    let client_id = &*connect.client_id;
    let who = statehub_authz::Principal {
        client_id,
        username: identity.username.as_deref(),
        attributes: &identity.attributes,
    };
    let grants = Grants::derive(broker, &who);
    let access = grants.access();
    let will = connect.will.as_ref().map(|w| &*w.topic);
    let reason = if access.is_some_and(|a| !a.may_connect()) {
        Some("no rule grants Connect")
    } else if will.is_some_and(|t| statehub_authz::builtin::check_publish(client_id, t).is_err()) {
        Some("the will topic is protected")
    } else if will.is_some_and(|t| access.is_some_and(|a| !a.may_publish(t))) {
        Some("no rule grants Publish on the will topic")
    } else {
        None
    };
    if let Some(reason) = reason {
        static LOG: crate::LogLimit = crate::LogLimit::per_secs(10);
        let denied = &broker.metrics().connects_denied;
        denied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::info!(
                client = client_id,
                left_out,
                "CONNECT not authorized: {reason}"
            );
        }
        return Err(Refused(ReasonCode::NOT_AUTHORIZED));
    }
    Ok(grants)
}

/// Reads CONNECT (and any AUTH rounds), answers CONNACK. `None` if refused. Until the
/// CONNECT is in, the connection holds its place among the pending ones (`admission`)
/// and closes if evicted from it; from then on it counts against `max_connections`
/// (for as long as the returned guard lives).
pub(super) async fn connect<S: Transport>(
    broker: &Broker,
    stream: &mut S,
    admission: Admission,
    origin: Origin,
) -> Option<(Box<Conn>, BytesMut, OpenConnection)> {
    let cfg = broker.config();
    let deadline = Instant::now() + Duration::from_secs(cfg.connect_timeout_secs);
    let mut codec = Codec::new_server(cfg.max_packet_size);
    let mut rbuf = BytesMut::new();
    let (mut connect, open) =
        read_connect(broker, stream, &mut codec, &mut rbuf, deadline, admission).await?;
    if !broker.connect_rate_admits(origin.peer.addr.ip()) {
        rate_limited(broker, &origin, &connect.client_id);
        refuse(broker, stream, &codec, ReasonCode::CONNECTION_RATE_EXCEEDED).await;
        return None;
    }
    if let Err(Refused(code)) = check(broker, &connect) {
        refuse(broker, stream, &codec, code).await;
        return None;
    }
    let authenticated = authn::on_connect(
        broker, &origin, stream, &mut codec, &mut rbuf, &connect, deadline,
    );
    let (auth_data, identity) = match authenticated.await {
        Ok(authenticated) => authenticated,
        Err(Some(code)) => {
            refuse(broker, stream, &codec, code).await;
            return None;
        }
        Err(None) => return None,
    };
    let expected = match fetch_session(broker, &connect).await {
        Ok(expected) => expected,
        Err(e) => {
            tracing::warn!("{e}; refusing the connection of {}", connect.client_id);
            refuse(broker, stream, &codec, ReasonCode::UNSPECIFIED_ERROR).await;
            return None;
        }
    };
    let mut accepted = match accept(broker, &mut connect, auth_data, &identity, expected) {
        Ok(accepted) => accepted,
        Err(Refused(code)) => {
            refuse(broker, stream, &codec, code).await;
            return None;
        }
    };
    if accepted.stored {
        if let Err(e) = barrier(broker).await {
            // Session Present could not be promised: refuse, and the client retries.
            tracing::error!("{e}; refusing the connection of {}", connect.client_id);
            refuse(broker, stream, &codec, ReasonCode::UNSPECIFIED_ERROR).await;
            return None;
        }
    }
    if let Some(announced) = accepted.announced.take() {
        if let Err(e) = announced.await {
            tracing::debug!(client = %connect.client_id, "takeover not told to the cluster: {e}");
        }
    }
    let conn = Conn::new(broker, codec, &mut connect, accepted, origin, identity)?;
    Some((Box::new(conn), rbuf, open))
}

/// A CONNECT that resumes a session which has none on this node brings it from
/// wherever the session store keeps it (another node, see `SessionStore::fetch`).
/// True if the CONNECT must find the session here: it was brought here, or, in a
/// cluster, it was here already. Either way it may leave again before the CONNECT
/// takes it (another node asked for it meanwhile): the CONNECT must then not start a
/// new session in its place, whose first record would replace the one in transit,
/// with every message it had queued, under the client id.
async fn fetch_session(
    broker: &Broker,
    connect: &Connect,
) -> Result<bool, crate::SessionStoreError> {
    let id = &connect.client_id;
    if connect.clean_start || id.is_empty() {
        return Ok(false);
    }
    if broker.has_session(id) {
        return Ok(broker.fabric().is_some());
    }
    match broker.session_store() {
        Some(store) => store.fetch(broker, id).await,
        None => Ok(false),
    }
}

/// Counts and logs (rate-limited) a CONNECT refused by `connect_rate_per_address`.
fn rate_limited(broker: &Broker, origin: &Origin, client_id: &str) {
    static LOG: LogLimit = LogLimit::per_secs(10);
    let refused = &broker.metrics().connects_rate_limited;
    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(left_out) = LOG.allow() {
        tracing::warn!(
            peer = %origin.peer.addr,
            client = client_id,
            left_out,
            "connection rate per address exceeded (connect_rate_per_address); CONNACK 0x9F"
        );
    }
}

/// Reads the first packet, which must be a CONNECT, and refuses it if the broker is
/// shutting down or full. `None` if the connection is to close.
async fn read_connect<S: Transport>(
    broker: &Broker,
    stream: &mut S,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    deadline: Instant,
    admission: Admission,
) -> Option<(Box<Connect>, OpenConnection)> {
    let cfg = broker.config();
    let first = tokio::select! {
        r = read_packet(broker, stream, codec, rbuf, deadline) => r,
        () = admission.closed.cancelled() => return None,
    };
    drop(admission);
    let first = match first {
        Ok(Some(p)) => p,
        Ok(None) => return None,
        Err(DecodeError::UnsupportedProtocolVersion(level)) => {
            // Answered in the newest version the client may read: MQTT 5 for a newer
            // level, else 3.1.1 (where 0x84 is return code 1).
            let version = if level >= 5 {
                ProtocolVersion::V5
            } else {
                ProtocolVersion::V311
            };
            let codec = Codec::with_version(version, cfg.max_packet_size);
            refuse(
                broker,
                stream,
                &codec,
                ReasonCode::UNSUPPORTED_PROTOCOL_VERSION,
            )
            .await;
            return None;
        }
        Err(e) => {
            tracing::debug!(error = %e, "bad first packet");
            refuse_bad_connect(broker, stream, codec, &e).await;
            return None;
        }
    };
    let Packet::Connect(connect) = first else {
        return None;
    };
    let open = broker.open_connection();
    let unavailable = if broker.is_shutting_down() {
        Some(ReasonCode::SERVER_UNAVAILABLE)
    } else if broker.connection_count() > cfg.max_connections {
        tracing::warn!(client = %connect.client_id, "connection limit reached; refusing with 0x97");
        Some(ReasonCode::QUOTA_EXCEEDED)
    } else {
        None
    };
    if let Some(code) = unavailable {
        refuse(broker, stream, codec, code).await;
        return None;
    }
    Some((connect, open))
}

impl Conn {
    /// The connection of an accepted CONNECT, its CONNACK in the write buffer.
    fn new(
        broker: &Broker,
        codec: Codec,
        connect: &mut Connect,
        accepted: Accepted,
        origin: Origin,
        identity: Identity,
    ) -> Option<Conn> {
        let cfg = broker.config();
        let mut wbuf = BytesMut::with_capacity(1024);
        if let Err(e) = codec.encode(&Packet::ConnAck(accepted.connack), &mut wbuf) {
            super::encode_failed(broker, &connect.client_id, "CONNACK", &e);
            return None;
        }
        let m = broker.metrics();
        m.connections_accepted.fetch_add(1, Ordering::Relaxed);
        m.packets_out.add(2, 1, wbuf.len());
        let p = &connect.properties;
        Some(Conn {
            broker: broker.clone(),
            codec,
            wbuf,
            wbuf_front_left: 0,
            session: accepted.session,
            generation: accepted.generation,
            credential_at: authn::expiry_instant(broker, &identity),
            info: ClientInfo {
                client_id: connect.client_id.clone(),
                protocol: connect.protocol,
                principal: Arc::new(Principal::new(connect.client_id.clone(), identity)),
                access: accepted.grants.access().cloned(),
            },
            grants: accepted.grants,
            origin,
            version: connect.protocol,
            client_receive_max: p.receive_maximum.unwrap_or(u16::MAX).max(1),
            client_max_packet: p.maximum_packet_size.unwrap_or(u32::MAX),
            // The aliases we assign are topics kept for the connection's life: no more
            // of them than we let the client use towards us.
            client_alias_max: if cfg.server_topic_aliases {
                p.topic_alias_maximum
                    .unwrap_or(0)
                    .min(cfg.topic_alias_maximum)
            } else {
                0
            },
            out_aliases: HashMap::new(),
            in_aliases: HashMap::new(),
            will: connect.will.take().map(Box::new),
            auth_method: p.authentication_method.clone(),
            problem_info: p.request_problem_information != Some(false),
            session_expiry: accepted.session_expiry,
            connect_expiry_zero: accepted.session_expiry == 0,
            signal: accepted.signal,
            keep_alive: accepted.keep_alive,
            publish_rate: (cfg.max_publish_rate > 0)
                .then(|| Bucket::full(cfg.max_publish_rate, broker.now())),
            reauth_rate: Bucket::full(cfg.max_reauth_per_minute, broker.now()),
            bandwidth: None,
            paused: None,
            held: Default::default(),
            acks: Default::default(),
        })
    }
}

/// Answers a CONNECT that failed to decode with a refusing CONNACK where the
/// protocol has a code for it (any for MQTT 5 [MQTT-3.2.2-7]; 3.1.1 only for the
/// identifier case, return code 2 [MQTT-3.1.3-8]), then the caller closes.
async fn refuse_bad_connect<S: Transport>(
    broker: &Broker,
    stream: &mut S,
    codec: &Codec,
    e: &DecodeError,
) {
    let code = e.reason_code();
    let answer = match codec.version() {
        Some(ProtocolVersion::V5) => true,
        Some(ProtocolVersion::V311) => code == ReasonCode::CLIENT_IDENTIFIER_NOT_VALID,
        None => false,
    };
    if answer {
        refuse(broker, stream, codec, code).await;
    }
}

/// Writes a CONNACK refusing the connection with `code` (the codec maps it to a
/// 3.1.1 return code); the caller then closes.
async fn refuse<S: Transport>(broker: &Broker, stream: &mut S, codec: &Codec, code: ReasonCode) {
    broker.metrics().connections_refused.add(code);
    let mut out = BytesMut::new();
    let ack = statehub_mqtt_codec::ConnAck {
        reason_code: code,
        ..Default::default()
    };
    match codec.encode(&Packet::ConnAck(ack), &mut out) {
        Ok(()) => {
            broker.metrics().packets_out.add(2, 1, out.len());
            drop(stream.write_all(&out).await)
        }
        Err(e) => tracing::warn!(error = %e, "refusing CONNACK not sent: it cannot be encoded"),
    }
}

/// Reads until one whole packet is decoded, the peer closes (Ok(None)), or the deadline.
pub(super) async fn read_packet<S: Transport>(
    broker: &Broker,
    stream: &mut S,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    deadline: Instant,
) -> Result<Option<Packet>, DecodeError> {
    loop {
        let before = rbuf.len();
        if let Some(p) = codec.decode(rbuf)? {
            let m = broker.metrics();
            m.packets_in.add(packet_type(&p), 1, before - rbuf.len());
            return Ok(Some(p));
        }
        // The buffer is reserved once bytes are there to read: a socket that stays
        // silent holds none.
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Ok(Ok(())) => {}
            _ => return Ok(None),
        }
        rbuf.reserve(4096);
        match stream.try_read_buf(rbuf) {
            Ok(n) if n > 0 => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            _ => return Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
