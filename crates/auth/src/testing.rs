//! Test credentials made at run time (no private key is ever committed): a CA that
//! issues server and client certificates, and token signing keys. Enabled by the
//! `testing` feature, for this crate's tests and the binary's.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{json, Value};

use crate::jwt::now_secs;

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A self-signed CA.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate, PEM.
    pub cert: String,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TestCa")
    }
}

impl TestCa {
    /// A root CA whose subject is `CN=<cn>, O=statehub tests`.
    pub fn new(cn: &str) -> TestCa {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "statehub tests");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            issuer: Issuer::new(params, key),
            cert: cert.pem(),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self) -> Pem {
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let mut params = CertificateParams::new(names).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params)
    }

    /// A client certificate with subject `CN=<cn>` and the given DNS names.
    pub fn client(&self, cn: &str, dns: &[&str]) -> Pem {
        let names = dns.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params)
    }

    fn issue(&self, params: CertificateParams) -> Pem {
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// An ES256 token signing key.
pub struct TokenKey {
    key: EncodingKey,
    /// The public key, PEM (SPKI), for `[authentication.tokens] keys`.
    pub public_pem: String,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey")
    }
}

impl TokenKey {
    pub fn es256() -> TokenKey {
        let pair = KeyPair::generate().expect("key");
        TokenKey {
            key: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("EC key"),
            public_pem: pair.public_key_pem(),
        }
    }

    /// `claims` signed with this key.
    pub fn mint(&self, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, &self.key).expect("token")
    }
}

/// The claims of a Kubernetes service-account token for `namespace/name`, audience
/// `aud`, valid from now for `ttl_secs` (negative: already expired).
pub fn sat_claims(aud: &str, namespace: &str, name: &str, ttl_secs: i64) -> Value {
    let now = i64::try_from(now_secs()).unwrap_or(i64::MAX);
    json!({
        "aud": [aud],
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "iat": now,
        "nbf": now,
        "exp": now + ttl_secs,
        "kubernetes.io": {
            "namespace": namespace,
            "serviceaccount": { "name": name, "uid": "0f6a2b1c-0000-4000-8000-000000000000" }
        }
    })
}
