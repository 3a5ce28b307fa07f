//! Authentication on the connection: the CONNECT's (with the AUTH rounds of an
//! enhanced authentication), re-authentication (AUTH 0x19), refusals, and the
//! expiry of a credential.
//!
//! A refusal is answered only once a fixed delay (`auth_failure_delay_ms`, ±10%)
//! has passed since the CONNECT arrived, whatever the authenticator took to decide:
//! a client cannot tell from the timing which part of its credentials was wrong (an
//! unknown user answered before a password hash would be), and guessing is slow.
//! The wait is a timer; the thread serves other connections meanwhile.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use rand::Rng;
use statehub_mqtt_codec::{Auth, ByteString, Codec, Connect, Packet, ProtocolVersion, ReasonCode};

use super::handshake::read_packet;
use super::{Close, Conn};
use crate::auth::{AuthDecision, Authenticator, Identity, Peer, Principal};
use crate::ratelimit::LogLimit;
use crate::transport::Transport;
use crate::Broker;

/// Where a connection comes from and who vouches for it: the peer and its listener's
/// authenticator (kept for re-authentication).
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub peer: Peer,
    pub authenticator: Arc<dyn Authenticator>,
}

/// What a successful authentication at CONNECT gives: the Authentication Data for
/// the CONNACK, and who the client is.
pub(super) type Authenticated = (Option<Bytes>, Identity);

/// Authenticates a CONNECT, running AUTH rounds while the authenticator asks for
/// them. `Err(Some(code))`: refuse with this CONNACK code (the failure delay has
/// passed); `Err(None)`: just close (the client went away or ran out of time).
pub(super) async fn on_connect<S: Transport>(
    broker: &Broker,
    origin: &Origin,
    stream: &mut S,
    codec: &mut Codec,
    rbuf: &mut BytesMut,
    connect: &Connect,
    deadline: tokio::time::Instant,
) -> Result<Authenticated, Option<ReasonCode>> {
    let received = tokio::time::Instant::now();
    let method = connect
        .properties
        .authentication_method
        .clone()
        .filter(|_| connect.protocol == ProtocolVersion::V5);
    let peer = &origin.peer;
    let mut decision = origin.authenticator.connect(peer, connect).await;
    loop {
        let data = match decision {
            AuthDecision::Success { data, identity } => return Ok((data, identity)),
            AuthDecision::Continue { data } if method.is_some() => data,
            // A challenge needs MQTT 5 and a method to carry it.
            AuthDecision::Continue { .. } => {
                decision = AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
                continue;
            }
            AuthDecision::Deny(code) => {
                failed(
                    broker,
                    peer,
                    &connect.client_id,
                    code,
                    "authentication refused",
                );
                tokio::time::sleep_until(received + failure_delay(broker)).await;
                return Err(Some(code));
            }
        };
        let method = method.clone().unwrap_or_default();
        let challenge = Packet::Auth(Auth {
            reason_code: ReasonCode::CONTINUE_AUTHENTICATION,
            authentication_method: Some(method.clone()),
            authentication_data: data,
            ..Default::default()
        });
        let mut out = BytesMut::new();
        if let Err(e) = codec.encode(&challenge, &mut out) {
            super::encode_failed(broker, &connect.client_id, "AUTH", &e);
            return Err(None);
        }
        broker.metrics().packets_out.add(15, 1, out.len());
        stream.write_all(&out).await.map_err(|_| None)?;
        let Ok(Some(Packet::Auth(auth))) = read_packet(broker, stream, codec, rbuf, deadline).await
        else {
            return Err(None);
        };
        if auth.reason_code != ReasonCode::CONTINUE_AUTHENTICATION
            || auth.authentication_method.as_ref() != Some(&method)
        {
            return Err(Some(ReasonCode::PROTOCOL_ERROR));
        }
        let step = origin
            .authenticator
            .auth(peer, &connect.client_id, &method, &auth);
        decision = step.await;
    }
}

impl Conn {
    /// AUTH after CONNECT: re-authentication (0x19) [MQTT-4.12.1]. Success replaces
    /// the connection's principal (and the credential's expiry) with what the new
    /// credential proves; failure closes with the authenticator's code after the
    /// failure delay.
    pub(super) async fn on_auth(&mut self, a: Auth) -> Result<(), Close> {
        let Some(method) = self.auth_method.clone() else {
            return Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "AUTH without an authentication method [MQTT-4.12.0-7]",
            ));
        };
        if a.authentication_method.as_ref() != Some(&method) {
            return Err(Close::ByServer(
                ReasonCode::PROTOCOL_ERROR,
                "AUTH method differs from CONNECT's [MQTT-4.12.1-1]",
            ));
        }
        self.within_reauth_rate()?;
        let received = tokio::time::Instant::now();
        let origin = &self.origin;
        let step = origin
            .authenticator
            .auth(&origin.peer, &self.info.client_id, &method, &a);
        let (code, data) = match step.await {
            AuthDecision::Success { data, identity } => {
                self.credential_at = expiry_instant(&self.broker, &identity);
                let principal = Principal::new(self.info.client_id.clone(), identity);
                self.info.principal = Arc::new(principal);
                // The new identity may match other rules.
                self.grants.invalidate();
                let done = &self.broker.metrics().reauthentications;
                done.fetch_add(1, Ordering::Relaxed);
                (ReasonCode::SUCCESS, data)
            }
            AuthDecision::Continue { data } => (ReasonCode::CONTINUE_AUTHENTICATION, data),
            AuthDecision::Deny(code) => {
                let client = &self.info.client_id;
                failed(
                    &self.broker,
                    &origin.peer,
                    client,
                    code,
                    "re-authentication refused",
                );
                tokio::time::sleep_until(received + failure_delay(&self.broker)).await;
                return Err(Close::ByServer(code, "re-authentication failed"));
            }
        };
        self.send(&Packet::Auth(Auth {
            reason_code: code,
            authentication_method: Some(method),
            authentication_data: data,
            ..Default::default()
        }))
    }
}

impl Conn {
    /// Takes a token from `max_reauth_per_minute`'s bucket; with none left the
    /// connection closes with 0x96 Message rate too high (counted, logged
    /// rate-limited).
    fn within_reauth_rate(&mut self) -> Result<(), Close> {
        let per_minute = self.broker.config().max_reauth_per_minute;
        if per_minute == 0
            || self
                .reauth_rate
                .take_per_minute(self.broker.now(), per_minute)
        {
            return Ok(());
        }
        static LOG: LogLimit = LogLimit::per_secs(10);
        let m = self.broker.metrics();
        m.reauth_rate_exceeded.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::warn!(
                peer = %self.origin.peer.addr,
                client = %self.info.client_id,
                left_out,
                "re-authentications above max_reauth_per_minute; DISCONNECT 0x96"
            );
        }
        Err(Close::ByServer(
            ReasonCode::MESSAGE_RATE_TOO_HIGH,
            "re-authentications above max_reauth_per_minute",
        ))
    }
}

/// When, on the broker's clock, the credential behind `identity` expires.
pub(super) fn expiry_instant(broker: &Broker, identity: &Identity) -> Option<Instant> {
    let at = identity.expires_at?;
    let left = at
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(broker.now() + left)
}

/// Logs (rate-limited; never the credential) and counts a refused authentication.
fn failed(broker: &Broker, peer: &Peer, client: &ByteString, code: ReasonCode, what: &str) {
    static LOG: LogLimit = LogLimit::per_secs(1);
    broker
        .metrics()
        .auth_failures
        .fetch_add(1, Ordering::Relaxed);
    if let Some(left_out) = LOG.allow() {
        tracing::warn!(
            peer = %peer.addr,
            client = %client,
            code = code.0,
            left_out,
            "{what}"
        );
    }
}

/// The configured failure delay, give or take 10%.
fn failure_delay(broker: &Broker) -> Duration {
    let ms = broker.config().auth_failure_delay_ms;
    if ms == 0 {
        return Duration::ZERO;
    }
    let jitter = rand::thread_rng().gen_range(0.9..=1.1);
    Duration::from_millis(ms).mul_f64(jitter)
}
