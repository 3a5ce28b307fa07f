//! The authentication hook and who a client is once it passed it.
//!
//! The broker calls an [`Authenticator`] on CONNECT and on every AUTH packet (the
//! rounds of an enhanced authentication and re-authentication, [MQTT-4.12]); the
//! methods themselves (password files, K8S-SAT tokens, X.509 names) are
//! implementations of the trait supplied by the binary. A successful step returns an
//! [`Identity`]; the broker makes it the connection's [`Principal`], which later
//! packets (PUBLISH, SUBSCRIBE, a built-in service's requests through
//! [`crate::ClientInfo::principal`]) are judged by, and which a re-authentication
//! replaces.
//!
//! The default, [`AllowAll`], accepts every client without an Authentication Method
//! and refuses any method with 0x8C.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::SystemTime;

use bytes::Bytes;
use statehub_mqtt_codec::{Auth, ByteString, Connect, ReasonCode};

use crate::service::BoxFuture;

/// Who a connected client is: what authorization rules match against.
///
/// Built by the broker from the client id it settled on (the one it assigned if the
/// client sent none) and the [`Identity`] the authenticator returned; replaced as a
/// whole when the client re-authenticates, so a reader holding an `Arc<Principal>`
/// always sees one consistent identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Principal {
    /// The MQTT client id of the connection.
    pub client_id: ByteString,
    /// The authenticated user name: the CONNECT's User Name checked against a
    /// password file, a token's claim, a certificate's name. For an anonymous client
    /// it is the User Name the client sent, unchecked (or `None`).
    pub username: Option<ByteString>,
    /// Authorization attributes: token claims, the attributes configured for a
    /// client certificate or its issuing CA. Empty when the method gives none.
    pub attributes: BTreeMap<String, String>,
}

impl Principal {
    /// The principal of client `client_id` authenticated as `identity`.
    pub fn new(client_id: ByteString, identity: Identity) -> Principal {
        Principal {
            client_id,
            username: identity.username,
            attributes: identity.attributes,
        }
    }
}

/// What one successful authentication established about a client.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// See [`Principal::username`].
    pub username: Option<ByteString>,
    /// See [`Principal::attributes`].
    pub attributes: BTreeMap<String, String>,
    /// When the credential stops being valid (a token's `exp`, a certificate's
    /// `notAfter`): the connection is closed then unless a re-authentication
    /// replaced it first. `None`: it does not expire.
    pub expires_at: Option<SystemTime>,
}

impl Identity {
    /// An identity with just a user name, no attributes, no expiry.
    pub fn user(username: Option<ByteString>) -> Identity {
        Identity {
            username,
            ..Identity::default()
        }
    }
}

/// What the broker knows about the other end of a connection before it
/// authenticates: where it comes from and what its transport proved.
#[derive(Debug, Clone)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// Whether the connection came over TLS.
    pub tls: bool,
    /// The certificate chain a mutual-TLS client presented and the TLS layer
    /// verified (DER, the client's own certificate first); empty otherwise.
    pub certificates: Vec<Bytes>,
}

impl Peer {
    /// A plain TCP peer.
    pub fn plain(addr: SocketAddr) -> Peer {
        Peer {
            addr,
            tls: false,
            certificates: Vec::new(),
        }
    }
}

/// The outcome of one authentication step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthDecision {
    /// Authenticated as `identity`; `data` goes back as Authentication Data (CONNACK
    /// or AUTH 0x00).
    Success {
        data: Option<Bytes>,
        identity: Identity,
    },
    /// Another round: send AUTH 0x18 with this data and wait for the client's AUTH.
    Continue { data: Option<Bytes> },
    /// Refused with this reason code (CONNACK for a connect, DISCONNECT otherwise).
    Deny(ReasonCode),
}

/// Decides who may connect. Called from connection tasks: work that takes more than
/// a few microseconds of CPU (a password hash) belongs on a blocking thread, awaited
/// in the returned future.
pub trait Authenticator: Send + Sync + std::fmt::Debug + 'static {
    /// First step, from the CONNECT packet.
    fn connect<'a>(&'a self, peer: &'a Peer, connect: &'a Connect) -> BoxFuture<'a, AuthDecision>;

    /// A later AUTH packet: continuation (0x18) during connect or re-authentication
    /// (0x19) afterwards; `method` is the one fixed at CONNECT.
    fn auth<'a>(
        &'a self,
        peer: &'a Peer,
        client_id: &'a ByteString,
        method: &'a ByteString,
        auth: &'a Auth,
    ) -> BoxFuture<'a, AuthDecision> {
        let _ = (peer, client_id, method, auth);
        Box::pin(std::future::ready(AuthDecision::Deny(
            ReasonCode::BAD_AUTHENTICATION_METHOD,
        )))
    }
}

/// Accepts everyone who does not ask for enhanced authentication, as the User Name
/// they sent.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl Authenticator for AllowAll {
    fn connect<'a>(&'a self, _peer: &'a Peer, connect: &'a Connect) -> BoxFuture<'a, AuthDecision> {
        let decision = if connect.properties.authentication_method.is_some() {
            AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD)
        } else {
            AuthDecision::Success {
                data: None,
                identity: Identity::user(connect.username.clone()),
            }
        };
        Box::pin(std::future::ready(decision))
    }
}
