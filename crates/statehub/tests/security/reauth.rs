//! What a client controls in re-authentication: AUTH 0x19 checks a token (a
//! signature) each time, so a connection may start only `max_reauth_per_minute` of
//! them (a burst of a minute's worth); past it DISCONNECT 0x96.

use bytes::Bytes;
use statehub_broker::codec::{Auth, ByteString, Packet, ReasonCode};
use statehub_test_support::{connect_packet, Event, RawClient, V5};

use super::*;

fn reauth(token: &str) -> Packet {
    Packet::Auth(Auth {
        reason_code: ReasonCode::RE_AUTHENTICATE,
        authentication_method: Some(ByteString::from("K8S-SAT")),
        authentication_data: Some(Bytes::from(token.to_owned())),
        ..Default::default()
    })
}

#[tokio::test]
async fn re_authentications_past_their_rate_get_disconnect_0x96() {
    let pki = Pki::new();
    let config = pki.write(
        "reauth.toml",
        &format!(
            "[mqtt]\nmax_reauth_per_minute = 3\n\n[authentication.tokens]\nkeys = [\"{}\"]\n\
             audiences = [\"statehub\"]\n",
            pki.p("sa.pub")
        ),
    );
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(common::LOCAL);
    let server = common::start(&args, &[]);
    let token = pki
        .token_key
        .mint(&sat_claims("statehub", "ns", "robot", 600));
    let mut connect = connect_packet(V5, "reauth-loop");
    connect.properties.authentication_method = Some(ByteString::from("K8S-SAT"));
    connect.properties.authentication_data = Some(Bytes::from(token.clone()));
    let (mut c, ack) = RawClient::connect_with(server.mqtt, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    // The burst: each answered AUTH 0x00.
    for i in 0..3 {
        c.send(&reauth(&token)).await;
        match c.next_event(Duration::from_secs(30)).await {
            Event::Packet(Packet::Auth(a)) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
            other => panic!("re-authentication {i}: {other:?}"),
        }
    }
    c.send(&reauth(&token)).await;
    match c.next_event(Duration::from_secs(30)).await {
        Event::Packet(Packet::Disconnect(d)) => {
            assert_eq!(d.reason_code, ReasonCode::MESSAGE_RATE_TOO_HIGH)
        }
        other => panic!("expected DISCONNECT 0x96, got {other:?}"),
    }
    // Another client is not affected.
    let mut connect = connect_packet(V5, "reauth-calm");
    connect.properties.authentication_method = Some(ByteString::from("K8S-SAT"));
    connect.properties.authentication_data = Some(Bytes::from(token.clone()));
    let (mut calm, ack) = RawClient::connect_with(server.mqtt, connect).await;
    assert_eq!(ack.reason_code, ReasonCode::SUCCESS);
    calm.send(&reauth(&token)).await;
    match calm.next_event(Duration::from_secs(30)).await {
        Event::Packet(Packet::Auth(a)) => assert_eq!(a.reason_code, ReasonCode::SUCCESS),
        other => panic!("{other:?}"),
    }
}
