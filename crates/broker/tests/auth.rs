//! The authentication hook and the AUTH packet plumbing [MQTT-4.12]: a
//! challenge/response method driven through CONNECT → AUTH 0x18 → AUTH → CONNACK,
//! re-authentication (AUTH 0x19 → AUTH 0x00), refusals, and the default that
//! refuses any method with 0x8C.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use parking_lot::Mutex;
use statehub_broker::codec::{Auth, ByteString, Connect, Packet, Publish, QoS, ReasonCode};
use statehub_broker::{
    done, AuthDecision, Authenticator, BoxFuture, Broker, BrokerConfig, ClientInfo, Identity, Peer,
    Principal, Service,
};
use statehub_test_support::*;

/// Method "CHAL": the server challenges with "nonce", the client must answer with
/// "ecnon" (the nonce reversed). A CONNECT carrying "ecnon" right away is accepted
/// in one step; "deny" is refused with 0x87.
#[derive(Debug)]
struct Challenge;

const METHOD: &str = "CHAL";

impl Challenge {
    fn step(data: Option<&[u8]>, first: bool) -> AuthDecision {
        match data {
            Some(b"ecnon") => AuthDecision::Success {
                data: Some(Bytes::from_static(b"welcome")),
                identity: Identity {
                    username: Some(bs("chal-user")),
                    attributes: BTreeMap::from([("round".to_owned(), "1".to_owned())]),
                    expires_at: None,
                },
            },
            // A second credential that proves other attributes (re-authentication).
            Some(b"ecnon2") => AuthDecision::Success {
                data: None,
                identity: Identity {
                    username: Some(bs("chal-user")),
                    attributes: BTreeMap::from([("round".to_owned(), "2".to_owned())]),
                    expires_at: None,
                },
            },
            Some(b"deny") if first => AuthDecision::Deny(ReasonCode::NOT_AUTHORIZED),
            _ if first => AuthDecision::Continue {
                data: Some(Bytes::from_static(b"nonce")),
            },
            _ => AuthDecision::Deny(ReasonCode::NOT_AUTHORIZED),
        }
    }
}

impl Authenticator for Challenge {
    fn connect<'a>(&'a self, _peer: &'a Peer, connect: &'a Connect) -> BoxFuture<'a, AuthDecision> {
        let decision = if connect.properties.authentication_method.as_deref() != Some(METHOD) {
            AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD)
        } else {
            Challenge::step(connect.properties.authentication_data.as_deref(), true)
        };
        Box::pin(std::future::ready(decision))
    }

    fn auth<'a>(
        &'a self,
        _peer: &'a Peer,
        _client_id: &'a ByteString,
        _method: &'a ByteString,
        auth: &'a Auth,
    ) -> BoxFuture<'a, AuthDecision> {
        let decision = Challenge::step(auth.authentication_data.as_deref(), false);
        Box::pin(std::future::ready(decision))
    }
}

/// Records the principal of every PUBLISH on `who/#`.
#[derive(Debug, Default)]
struct WhoAmI {
    seen: Mutex<Vec<Principal>>,
}

impl Service for WhoAmI {
    fn on_publish<'a>(
        &'a self,
        _broker: &'a Broker,
        from: &'a ClientInfo,
        _publish: &'a Publish,
    ) -> BoxFuture<'a, ()> {
        self.seen.lock().push((*from.principal).clone());
        done()
    }
}

async fn broker_with_challenge() -> std::net::SocketAddr {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    broker.set_authenticator(Arc::new(Challenge));
    addr
}

fn connect_with_method(id: &str, data: Option<&'static [u8]>) -> Connect {
    let mut c = connect_packet(V5, id);
    c.properties.authentication_method = Some(bs(METHOD));
    c.properties.authentication_data = data.map(Bytes::from_static);
    c
}

fn auth(code: ReasonCode, data: &'static [u8]) -> Packet {
    Packet::Auth(Auth {
        reason_code: code,
        authentication_method: Some(bs(METHOD)),
        authentication_data: Some(Bytes::from_static(data)),
        ..Default::default()
    })
}

#[tokio::test]
async fn challenge_response_during_connect() {
    let addr = broker_with_challenge().await;
    let mut c = RawClient::open(addr, V5).await;
    c.send(&Packet::Connect(Box::new(connect_with_method(
        "auth-1", None,
    ))))
    .await;
    match c.expect().await {
        Packet::Auth(a) => {
            assert_eq!(a.reason_code, ReasonCode::CONTINUE_AUTHENTICATION);
            assert_eq!(a.authentication_method.as_deref(), Some(METHOD));
            assert_eq!(a.authentication_data.as_deref(), Some(&b"nonce"[..]));
        }
        other => panic!("expected AUTH 0x18, got {other:?}"),
    }
    c.send(&auth(ReasonCode::CONTINUE_AUTHENTICATION, b"ecnon"))
        .await;
    match c.expect().await {
        Packet::ConnAck(ack) => {
            assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
            assert_eq!(
                ack.properties.authentication_method.as_deref(),
                Some(METHOD)
            );
            assert_eq!(
                ack.properties.authentication_data.as_deref(),
                Some(&b"welcome"[..])
            );
        }
        other => panic!("expected CONNACK, got {other:?}"),
    }
    // The connection works afterwards.
    c.send(&Packet::PingReq).await;
    assert_eq!(c.expect().await, Packet::PingResp);
}

#[tokio::test]
async fn wrong_answer_during_connect_is_refused_with_the_hook_code() {
    let addr = broker_with_challenge().await;
    let mut c = RawClient::open(addr, V5).await;
    c.send(&Packet::Connect(Box::new(connect_with_method(
        "auth-2", None,
    ))))
    .await;
    assert!(matches!(c.expect().await, Packet::Auth(_)));
    c.send(&auth(ReasonCode::CONTINUE_AUTHENTICATION, b"guess"))
        .await;
    match c.expect().await {
        Packet::ConnAck(ack) => assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED),
        other => panic!("expected CONNACK 0x87, got {other:?}"),
    }
    c.expect_closed().await;
}

#[tokio::test]
async fn one_step_success_and_denial_on_connect() {
    let addr = broker_with_challenge().await;
    let (_ok, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-3", Some(b"ecnon"))).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    let (mut denied, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-4", Some(b"deny"))).await;
    assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED);
    denied.expect_closed().await;
}

#[tokio::test]
async fn re_authentication_after_connect() {
    let addr = broker_with_challenge().await;
    let (mut c, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-5", Some(b"ecnon"))).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    c.send(&auth(ReasonCode::RE_AUTHENTICATE, b"ecnon")).await;
    match c.expect().await {
        Packet::Auth(a) => {
            assert_eq!(a.reason_code, ReasonCode::SUCCESS);
            assert_eq!(a.authentication_data.as_deref(), Some(&b"welcome"[..]));
        }
        other => panic!("expected AUTH 0x00, got {other:?}"),
    }
    // A failed re-authentication disconnects with the hook's code.
    c.send(&auth(ReasonCode::RE_AUTHENTICATE, b"guess")).await;
    c.expect_disconnect(ReasonCode::NOT_AUTHORIZED).await;
}

#[tokio::test]
async fn auth_without_a_method_at_connect_is_a_protocol_error() {
    // A client that named no method at CONNECT (default hook) may not send AUTH.
    let (_broker, plain) = start_default().await;
    let mut c = RawClient::connect(plain, V5, "auth-6").await;
    c.send(&auth(ReasonCode::RE_AUTHENTICATE, b"x")).await;
    c.expect_disconnect(ReasonCode::PROTOCOL_ERROR).await;
}

#[tokio::test]
async fn default_hook_refuses_any_method_with_0x8c() {
    let (_broker, addr) = start_default().await;
    let (mut c, ack) = RawClient::connect_with(addr, connect_with_method("auth-7", None)).await;
    assert_eq!(ack.reason_code, ReasonCode::BAD_AUTHENTICATION_METHOD);
    c.expect_closed().await;
}

#[tokio::test]
async fn services_see_the_principal_and_re_authentication_replaces_it() {
    let (broker, addr) = start_broker(BrokerConfig::default()).await;
    broker.set_authenticator(Arc::new(Challenge));
    let who = Arc::new(WhoAmI::default());
    broker.register_service("who/#", who.clone());
    let (mut c, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-8", Some(b"ecnon"))).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    assert_eq!(
        c.publish_simple("who/am/i", QoS::AtLeastOnce, b"").await,
        ReasonCode::SUCCESS
    );
    c.send(&auth(ReasonCode::RE_AUTHENTICATE, b"ecnon2")).await;
    match c.expect().await {
        Packet::Auth(a) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected AUTH 0x00, got {other:?}"),
    }
    assert_eq!(
        c.publish_simple("who/am/i", QoS::AtLeastOnce, b"").await,
        ReasonCode::SUCCESS
    );
    let seen = who.seen.lock().clone();
    let principal = |round: &str| Principal {
        client_id: bs("auth-8"),
        username: Some(bs("chal-user")),
        attributes: BTreeMap::from([("round".to_owned(), round.to_owned())]),
    };
    assert_eq!(seen, vec![principal("1"), principal("2")]);
}

#[tokio::test]
async fn the_principal_of_an_assigned_client_id_carries_that_id() {
    let (broker, addr) = start_default().await;
    let who = Arc::new(WhoAmI::default());
    broker.register_service("who/#", who.clone());
    let mut connect = connect_packet(V5, "");
    connect.username = Some(bs("alice"));
    let (mut c, ack) = RawClient::connect_with(addr, connect).await;
    let assigned = ack.properties.assigned_client_identifier.expect("an id");
    assert_eq!(
        c.publish_simple("who/am/i", QoS::AtLeastOnce, b"").await,
        ReasonCode::SUCCESS
    );
    let seen = who.seen.lock().clone();
    assert_eq!(
        seen,
        vec![Principal {
            client_id: assigned,
            username: Some(bs("alice")),
            attributes: BTreeMap::new(),
        }]
    );
}

/// Method "TTL": the authentication data is the number of seconds the credential is
/// valid for.
#[derive(Debug)]
struct Expiring;

impl Expiring {
    fn step(data: Option<&[u8]>) -> AuthDecision {
        let secs = data
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| d.parse::<u64>().ok());
        match secs {
            Some(secs) => AuthDecision::Success {
                data: None,
                identity: Identity {
                    expires_at: Some(SystemTime::now() + Duration::from_secs(secs)),
                    ..Identity::default()
                },
            },
            None => AuthDecision::Deny(ReasonCode::NOT_AUTHORIZED),
        }
    }
}

impl Authenticator for Expiring {
    fn connect<'a>(&'a self, _peer: &'a Peer, connect: &'a Connect) -> BoxFuture<'a, AuthDecision> {
        let data = connect.properties.authentication_data.as_deref();
        Box::pin(std::future::ready(Expiring::step(data)))
    }

    fn auth<'a>(
        &'a self,
        _peer: &'a Peer,
        _client_id: &'a ByteString,
        _method: &'a ByteString,
        auth: &'a Auth,
    ) -> BoxFuture<'a, AuthDecision> {
        let data = auth.authentication_data.as_deref();
        Box::pin(std::future::ready(Expiring::step(data)))
    }
}

fn ttl_connect(id: &str, secs: &'static [u8]) -> Connect {
    let mut c = connect_packet(V5, id);
    // No keep alive: the test moves the clock by hours.
    c.keep_alive = 0;
    c.properties.authentication_method = Some(bs("TTL"));
    c.properties.authentication_data = Some(Bytes::from_static(secs));
    c
}

fn ttl_auth(secs: &'static [u8]) -> Packet {
    Packet::Auth(Auth {
        reason_code: ReasonCode::RE_AUTHENTICATE,
        authentication_method: Some(bs("TTL")),
        authentication_data: Some(Bytes::from_static(secs)),
        ..Default::default()
    })
}

#[tokio::test]
async fn a_connection_whose_credential_expires_is_closed_without_disconnect() {
    let (broker, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    broker.set_authenticator(Arc::new(Expiring));
    let (mut c, ack) = RawClient::connect_with(addr, ttl_connect("ttl-1", b"60")).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    c.ping().await;
    clock.advance(Duration::from_secs(61));
    c.expect_closed().await;
    assert_eq!(broker.metrics().credentials_expired.load(Relaxed), 1);
}

#[tokio::test]
async fn re_authentication_moves_the_expiry() {
    let (broker, addr, clock) = start_with_clock(BrokerConfig::default()).await;
    broker.set_authenticator(Arc::new(Expiring));
    let (mut c, _) = RawClient::connect_with(addr, ttl_connect("ttl-2", b"60")).await;
    c.send(&ttl_auth(b"3600")).await;
    match c.expect().await {
        Packet::Auth(a) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
        other => panic!("expected AUTH 0x00, got {other:?}"),
    }
    clock.advance(Duration::from_secs(120));
    // Past the first credential's expiry, the connection still works.
    c.ping().await;
    clock.advance(Duration::from_secs(3600));
    c.expect_closed().await;
    assert_eq!(broker.metrics().credentials_expired.load(Relaxed), 1);
}

#[tokio::test]
async fn a_refusal_waits_for_the_failure_delay_and_is_counted() {
    let cfg = BrokerConfig {
        auth_failure_delay_ms: 400,
        ..BrokerConfig::default()
    };
    let (broker, addr) = start_broker(cfg).await;
    broker.set_authenticator(Arc::new(Challenge));
    let started = Instant::now();
    let (mut c, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-9", Some(b"deny"))).await;
    assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED);
    // The delay is a lower bound (less 10% jitter); the machine may add to it.
    assert!(started.elapsed() >= Duration::from_millis(360));
    c.expect_closed().await;
    assert_eq!(broker.metrics().auth_failures.load(Relaxed), 1);
    // Other clients are served meanwhile: the wait is a timer, not a blocked thread.
    let mut waiting = RawClient::open(addr, V5).await;
    waiting
        .send(&Packet::Connect(Box::new(connect_with_method(
            "auth-10",
            Some(b"deny"),
        ))))
        .await;
    let (_ok, ack) =
        RawClient::connect_with(addr, connect_with_method("auth-11", Some(b"ecnon"))).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    match waiting.expect().await {
        Packet::ConnAck(ack) => assert_eq!(ack.reason_code, ReasonCode::NOT_AUTHORIZED),
        other => panic!("expected CONNACK 0x87, got {other:?}"),
    }
}
