//! The authentication hook. The broker calls it on CONNECT and on every AUTH packet;
//! authentication methods (passwords, K8S-SAT, ...) are implementations of this
//! trait supplied by the binary. The default accepts every client without an
//! Authentication Method and refuses any method with 0x8C.

use bytes::Bytes;
use statehub_mqtt_codec::{Auth, ByteString, Connect, ReasonCode};

/// The outcome of one authentication step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthDecision {
    /// Authenticated; `data` goes back as Authentication Data (CONNACK or AUTH 0x00).
    Success { data: Option<Bytes> },
    /// Another round: send AUTH 0x18 with this data and wait for the client's AUTH.
    Continue { data: Option<Bytes> },
    /// Refused with this reason code (CONNACK for a connect, DISCONNECT otherwise).
    Deny(ReasonCode),
}

/// Decides who may connect. Called from connection tasks, so it must be cheap or
/// hand heavy work elsewhere.
pub trait Authenticator: Send + Sync + std::fmt::Debug + 'static {
    /// First step, from the CONNECT packet.
    fn connect(&self, connect: &Connect) -> AuthDecision;

    /// A later AUTH packet: continuation (0x18) during connect or re-authentication
    /// (0x19) afterwards; `method` is the one fixed at CONNECT.
    fn auth(&self, client_id: &ByteString, method: &ByteString, auth: &Auth) -> AuthDecision {
        let _ = (client_id, method, auth);
        AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD)
    }
}

/// Accepts everyone who does not ask for enhanced authentication.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl Authenticator for AllowAll {
    fn connect(&self, connect: &Connect) -> AuthDecision {
        if connect.properties.authentication_method.is_some() {
            AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD)
        } else {
            AuthDecision::Success { data: None }
        }
    }
}
