//! One listener's authentication: the methods it accepts and whether anonymous
//! clients may connect, as a broker [`Authenticator`].
//!
//! A CONNECT is judged by the first of these that applies:
//! 1. an Authentication Method: `K8S-SAT` with the token as Authentication Data when
//!    tokens are configured (re-authenticated by AUTH 0x19 with a new token), any
//!    other method 0x8C;
//! 2. a client certificate the TLS layer verified, when X.509 is configured;
//! 3. a password: checked against the password file when it has the user name, else
//!    taken as a token when tokens are configured (clients without enhanced
//!    authentication), else refused with 0x86;
//! 4. nothing usable: anonymous, accepted only as the listener allows (never, from
//!    loopback addresses only, or from anywhere), else refused with 0x87. An
//!    anonymous client has no user name: a User Name it sends is not trusted.
//!
//! Hashing and signature checks run on a blocking thread, not the connection's, at
//! most one per core at once ([`Checks`]).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use statehub_broker::codec::{Auth, ByteString, Connect, ReasonCode};
use statehub_broker::{AuthDecision, Authenticator, BoxFuture, Identity, Peer};

use crate::checks::Checks;
use crate::jwt::TokenValidator;
use crate::passwd::PasswordFile;
use crate::watch::Watched;
use crate::x509::X509Mapping;

/// The enhanced authentication method of Kubernetes service-account tokens, as the
/// AIO SDK names it.
pub const SAT_METHOD: &str = "K8S-SAT";

/// Who may connect without credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anonymous {
    Refuse,
    /// From loopback addresses only (Mosquitto 2's local-only mode).
    LoopbackOnly,
    Allow,
}

impl Anonymous {
    /// Whether an anonymous client at `ip` may connect.
    pub fn admits(self, ip: IpAddr) -> bool {
        match self {
            Anonymous::Refuse => false,
            Anonymous::LoopbackOnly => ip.to_canonical().is_loopback(),
            Anonymous::Allow => true,
        }
    }
}

/// The authentication of one listener.
#[derive(Clone)]
pub struct ListenerAuth {
    pub passwords: Option<Arc<Watched<PasswordFile>>>,
    pub tokens: Option<Arc<Watched<TokenValidator>>>,
    pub x509: Option<Arc<X509Mapping>>,
    pub anonymous: Anonymous,
}

impl fmt::Debug for ListenerAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.describe())
    }
}

impl ListenerAuth {
    /// The methods in a few words, for the start-up log.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.passwords.is_some() {
            parts.push("password file");
        }
        if self.tokens.is_some() {
            parts.push("tokens (K8S-SAT, or as password)");
        }
        if self.x509.is_some() {
            parts.push("X.509 client certificates");
        }
        parts.push(match self.anonymous {
            Anonymous::Refuse => "no anonymous clients",
            Anonymous::LoopbackOnly => "anonymous clients from loopback only",
            Anonymous::Allow => "anonymous clients from anywhere",
        });
        parts.join(", ")
    }

    async fn token(&self, token: Option<bytes::Bytes>, refusal: ReasonCode) -> AuthDecision {
        let (Some(tokens), Some(token)) = (&self.tokens, token) else {
            return AuthDecision::Deny(refusal);
        };
        let validator = tokens.get();
        let checked = Checks::shared().run(move || validator.validate(&token));
        match checked.await {
            Some(Ok(identity)) => success(identity),
            Some(Err(e)) => refused(refusal, &e),
            None => AuthDecision::Deny(ReasonCode::UNSPECIFIED_ERROR),
        }
    }

    async fn password(&self, user: &ByteString, password: bytes::Bytes) -> AuthDecision {
        let refusal = ReasonCode::BAD_USER_NAME_OR_PASSWORD;
        match &self.passwords {
            Some(file) if file.get().has_user(user) || self.tokens.is_none() => {
                let file = file.get();
                let name = user.to_string();
                let check = move || file.verify(&name, &password);
                match Checks::shared().run(check).await {
                    Some(true) => success(Identity::user(Some(user.clone()))),
                    Some(false) => AuthDecision::Deny(refusal),
                    None => AuthDecision::Deny(ReasonCode::UNSPECIFIED_ERROR),
                }
            }
            _ => self.token(Some(password), refusal).await,
        }
    }

    async fn decide(&self, peer: &Peer, connect: &Connect) -> AuthDecision {
        if let Some(method) = &connect.properties.authentication_method {
            if **method != *SAT_METHOD || self.tokens.is_none() {
                return AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
            }
            let token = connect.properties.authentication_data.clone();
            return self.token(token, ReasonCode::NOT_AUTHORIZED).await;
        }
        if let (Some(x509), false) = (&self.x509, peer.certificates.is_empty()) {
            return match x509.identity(&peer.certificates) {
                Ok(identity) => success(identity),
                Err(e) => refused(ReasonCode::NOT_AUTHORIZED, &e),
            };
        }
        let password_methods = self.passwords.is_some() || self.tokens.is_some();
        if let (Some(password), true) = (&connect.password, password_methods) {
            let user = connect.username.clone().unwrap_or_default();
            return self.password(&user, password.clone()).await;
        }
        match self.anonymous.admits(peer.addr.ip()) {
            true => success(Identity::default()),
            false => AuthDecision::Deny(ReasonCode::NOT_AUTHORIZED),
        }
    }
}

fn success(identity: Identity) -> AuthDecision {
    AuthDecision::Success {
        data: None,
        identity,
    }
}

/// A refusal whose reason is worth a debug line (the broker logs the refusal itself).
fn refused(code: ReasonCode, reason: &dyn std::error::Error) -> AuthDecision {
    tracing::debug!("credential refused: {reason}");
    AuthDecision::Deny(code)
}

impl Authenticator for ListenerAuth {
    fn connect<'a>(&'a self, peer: &'a Peer, connect: &'a Connect) -> BoxFuture<'a, AuthDecision> {
        Box::pin(self.decide(peer, connect))
    }

    fn auth<'a>(
        &'a self,
        _peer: &'a Peer,
        _client_id: &'a ByteString,
        method: &'a ByteString,
        auth: &'a Auth,
    ) -> BoxFuture<'a, AuthDecision> {
        Box::pin(async move {
            if **method != *SAT_METHOD {
                return AuthDecision::Deny(ReasonCode::BAD_AUTHENTICATION_METHOD);
            }
            let token = auth.authentication_data.clone();
            self.token(token, ReasonCode::NOT_AUTHORIZED).await
        })
    }
}
