//! Each mechanism against credentials made at run time: tokens (valid, expired,
//! forged, wrong audience or issuer, not yet valid), client certificates (names and
//! attributes), TLS files (the errors name the file), the listener's decisions
//! (anonymous from loopback and elsewhere, passwords, methods), and reloads.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use statehub_auth::jwt::{TokenConfig, TokenError, TokenValidator};
use statehub_auth::passwd::{hash_line, PasswordFile};
use statehub_auth::testing::{sat_claims, TestCa, TokenKey};
use statehub_auth::tls::{server_config, TlsError, TlsFiles};
use statehub_auth::x509::{SubjectAttributes, UsernameFrom, X509Config, X509Mapping};
use statehub_auth::{Anonymous, ListenerAuth, LoadError, Reload, Watched, SAT_METHOD};
use statehub_broker::codec::{Connect, ConnectProperties, ProtocolVersion, ReasonCode};
use statehub_broker::{AuthDecision, Authenticator, Peer};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn token_config(dir: &Path, key: &TokenKey) -> TokenConfig {
    TokenConfig {
        keys: vec![write(dir, "sa.pub", &key.public_pem)],
        jwks: None,
        hmac_secret_file: None,
        audiences: vec!["statehub".into()],
        issuer: Some("https://kubernetes.default.svc.cluster.local".into()),
        username_claim: "sub".into(),
        attributes: BTreeMap::from([
            ("namespace".into(), "/kubernetes.io/namespace".into()),
            ("sa".into(), "/kubernetes.io/serviceaccount/name".into()),
        ]),
        leeway_secs: 0,
    }
}

#[test]
fn a_service_account_token_names_its_account_and_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let key = TokenKey::es256();
    let v = TokenValidator::load(&token_config(dir.path(), &key)).unwrap();
    let token = key.mint(&sat_claims("statehub", "factory", "robot", 600));
    let id = v.validate(token.as_bytes()).unwrap();
    assert_eq!(
        id.username.as_deref(),
        Some("system:serviceaccount:factory:robot")
    );
    assert_eq!(id.attributes["namespace"], "factory");
    assert_eq!(id.attributes["sa"], "robot");
    assert!(id.expires_at.is_some());
    // A trailing newline, as in a token file, is fine.
    assert!(v.validate(format!("{token}\n").as_bytes()).is_ok());
}

#[test]
fn bad_tokens_are_refused_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let key = TokenKey::es256();
    let v = TokenValidator::load(&token_config(dir.path(), &key)).unwrap();
    let check = |claims: &serde_json::Value| v.validate(key.mint(claims).as_bytes());
    assert_eq!(
        check(&sat_claims("statehub", "ns", "a", -120)),
        Err(TokenError::Expired)
    );
    assert_eq!(
        check(&sat_claims("other-service", "ns", "a", 600)),
        Err(TokenError::Audience)
    );
    let mut wrong_issuer = sat_claims("statehub", "ns", "a", 600);
    wrong_issuer["iss"] = json!("https://evil.example");
    assert_eq!(check(&wrong_issuer), Err(TokenError::Issuer));
    let mut early = sat_claims("statehub", "ns", "a", 600);
    early["nbf"] = json!(statehub_auth::jwt::now_secs() + 300);
    assert_eq!(check(&early), Err(TokenError::NotYetValid));
    let forger = TokenKey::es256();
    let forged = forger.mint(&sat_claims("statehub", "ns", "a", 600));
    assert_eq!(v.validate(forged.as_bytes()), Err(TokenError::Signature));
    assert_eq!(v.validate(b"not a token"), Err(TokenError::Malformed));
    // An HS256 token cannot pass with an EC public key taken as its secret.
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &sat_claims("statehub", "ns", "a", 600),
        &jsonwebtoken::EncodingKey::from_secret(key.public_pem.as_bytes()),
    )
    .unwrap();
    assert_eq!(
        v.validate(hs.as_bytes()),
        Err(TokenError::NoKey(jsonwebtoken::Algorithm::HS256))
    );
}

#[test]
fn hmac_and_jwks_keys_verify_and_kid_selects() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write(dir.path(), "secret", "a-long-shared-secret-for-hs256\n");
    let jwk = json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256",
        "k": "c2Vjb25kLXNoYXJlZC1zZWNyZXQtZm9yLWp3a3M"}]});
    let jwks = write(dir.path(), "jwks.json", &jwk.to_string());
    let config = TokenConfig {
        keys: vec![],
        jwks: Some(jwks),
        hmac_secret_file: Some(secret),
        issuer: None,
        ..token_config(dir.path(), &TokenKey::es256())
    };
    let v = TokenValidator::load(&TokenConfig {
        keys: vec![],
        ..config
    })
    .unwrap();
    let claims = sat_claims("statehub", "ns", "hs", 600);
    let hs = |secret: &[u8], kid: Option<&str>| {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = kid.map(str::to_owned);
        let key = jsonwebtoken::EncodingKey::from_secret(secret);
        jsonwebtoken::encode(&header, &claims, &key).unwrap()
    };
    assert!(v
        .validate(hs(b"a-long-shared-secret-for-hs256", None).as_bytes())
        .is_ok());
    assert!(v
        .validate(hs(b"second-shared-secret-for-jwks", Some("k1")).as_bytes())
        .is_ok());
    assert_eq!(
        v.validate(hs(b"guessed", None).as_bytes()),
        Err(TokenError::Signature)
    );
}

#[test]
fn rs256_tokens_verify_with_a_pem_public_key() {
    // ring cannot generate RSA keys: the openssl tool makes one for this test.
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("rsa.pem");
    let public = dir.path().join("rsa.pub");
    let run = |args: &[&str]| {
        let ok = std::process::Command::new("openssl")
            .args(args)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (Debian package openssl; scripts/install-test-deps.sh)");
        assert!(ok.success(), "openssl {args:?}");
    };
    let (private_s, public_s) = (private.to_str().unwrap(), public.to_str().unwrap());
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private_s,
    ]);
    run(&["pkey", "-in", private_s, "-pubout", "-out", public_s]);
    let config = TokenConfig {
        keys: vec![public],
        ..token_config(dir.path(), &TokenKey::es256())
    };
    let v = TokenValidator::load(&config).unwrap();
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(&std::fs::read(&private).unwrap()).unwrap();
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &sat_claims("statehub", "ns", "rsa", 600),
        &key,
    )
    .unwrap();
    let id = v.validate(token.as_bytes()).unwrap();
    assert_eq!(id.username.as_deref(), Some("system:serviceaccount:ns:rsa"));
}

fn der_chain(pem: &str) -> Vec<Bytes> {
    rustls_pemfile::certs(&mut pem.as_bytes())
        .map(|c| Bytes::copy_from_slice(c.unwrap().as_ref()))
        .collect()
}

#[test]
fn client_certificates_give_names_and_per_ca_and_per_subject_attributes() {
    let ca = TestCa::new("Factory CA");
    let mapping = X509Mapping::new(&X509Config {
        username: UsernameFrom::Cn,
        attributes: vec![
            SubjectAttributes {
                subject: "O = statehub tests, CN = Factory CA".into(),
                attributes: BTreeMap::from([
                    ("site".into(), "plant-1".into()),
                    ("role".into(), "device".into()),
                ]),
            },
            SubjectAttributes {
                subject: "CN=smart-fan".into(),
                attributes: BTreeMap::from([("role".into(), "fan".into())]),
            },
        ],
    })
    .unwrap();
    let fan = ca.client("smart-fan", &["fan.plant-1.example"]);
    let id = mapping.identity(&der_chain(&fan.cert)).unwrap();
    assert_eq!(id.username.as_deref(), Some("smart-fan"));
    assert_eq!(id.attributes["site"], "plant-1");
    assert_eq!(id.attributes["role"], "fan", "the subject's own entry wins");
    assert!(id.expires_at.is_some());
    let other = ca.client("lamp", &[]);
    let id = mapping.identity(&der_chain(&other.cert)).unwrap();
    assert_eq!(id.attributes["role"], "device");
    let by_san = X509Mapping::new(&X509Config {
        username: UsernameFrom::San,
        attributes: vec![],
    })
    .unwrap();
    let id = by_san.identity(&der_chain(&fan.cert)).unwrap();
    assert_eq!(id.username.as_deref(), Some("fan.plant-1.example"));
}

#[test]
fn tls_errors_name_the_file_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("CA");
    let server = ca.server();
    let other = ca.server();
    let cert = write(dir.path(), "server.crt", &server.cert);
    let key = write(dir.path(), "server.key", &server.key);
    let wrong_key = write(dir.path(), "other.key", &other.key);
    let files = |cert: &Path, key: &Path| TlsFiles {
        cert: cert.to_owned(),
        key: key.to_owned(),
        client_ca: None,
        require_client_cert: false,
    };
    assert!(server_config(&files(&cert, &key), &[]).is_ok());
    let missing = dir.path().join("missing.crt");
    let e = server_config(&files(&missing, &key), &[]).unwrap_err();
    assert!(matches!(e, TlsError::Read { .. }));
    assert!(e.to_string().contains("missing.crt"), "{e}");
    let e = server_config(&files(&cert, &wrong_key), &[]).unwrap_err();
    assert!(matches!(e, TlsError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("other.key"), "{e}");
    let e = server_config(&files(&cert, &cert), &[]).unwrap_err();
    assert!(
        e.to_string().contains("server.crt") && e.to_string().contains("no PRIVATE KEY"),
        "{e}"
    );
    let e = server_config(&files(&key, &key), &[]).unwrap_err();
    assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
}

fn connect(username: Option<&str>, password: Option<&[u8]>) -> Connect {
    Connect {
        protocol: ProtocolVersion::V5,
        clean_start: true,
        keep_alive: 30,
        client_id: "c".into(),
        username: username.map(Into::into),
        password: password.map(Bytes::copy_from_slice),
        will: None,
        properties: ConnectProperties::default(),
    }
}

fn peer(addr: &str) -> Peer {
    Peer::plain(addr.parse::<SocketAddr>().unwrap())
}

async fn decide(auth: &ListenerAuth, peer: &Peer, c: &Connect) -> AuthDecision {
    auth.connect(peer, c).await
}

fn code(d: &AuthDecision) -> Option<ReasonCode> {
    match d {
        AuthDecision::Deny(code) => Some(*code),
        _ => None,
    }
}

fn anonymous_only(anonymous: Anonymous) -> ListenerAuth {
    ListenerAuth {
        passwords: None,
        tokens: None,
        x509: None,
        anonymous,
    }
}

#[tokio::test]
async fn anonymous_clients_are_local_only_unless_allowed() {
    let local = anonymous_only(Anonymous::LoopbackOnly);
    let c = connect(Some("claims-to-be-admin"), None);
    for ok in ["127.0.0.1:5000", "[::1]:5000", "[::ffff:127.0.0.1]:5000"] {
        match decide(&local, &peer(ok), &c).await {
            AuthDecision::Success { identity, .. } => {
                assert_eq!(
                    identity.username, None,
                    "an anonymous user name is not trusted"
                )
            }
            other => panic!("{ok}: {other:?}"),
        }
    }
    for remote in [
        "192.0.2.7:5000",
        "[2001:db8::1]:5000",
        "[::ffff:192.0.2.7]:5000",
    ] {
        let d = decide(&local, &peer(remote), &c).await;
        assert_eq!(code(&d), Some(ReasonCode::NOT_AUTHORIZED), "{remote}");
    }
    let open = anonymous_only(Anonymous::Allow);
    assert_eq!(code(&decide(&open, &peer("192.0.2.7:1"), &c).await), None);
    let closed = anonymous_only(Anonymous::Refuse);
    let d = decide(&closed, &peer("127.0.0.1:1"), &c).await;
    assert_eq!(code(&d), Some(ReasonCode::NOT_AUTHORIZED));
}

#[tokio::test]
async fn passwords_tokens_and_methods_get_their_codes() {
    let dir = tempfile::tempdir().unwrap();
    let passwd = write(
        dir.path(),
        "passwd",
        &format!("{}\n", hash_line("alice", b"wonderland", 101).unwrap()),
    );
    let key = TokenKey::es256();
    let tokens = token_config(dir.path(), &key);
    let auth = ListenerAuth {
        passwords: Some(
            Watched::load("passwords", vec![passwd.clone()], move || {
                Ok(PasswordFile::load(&passwd)?)
            })
            .unwrap(),
        ),
        tokens: Some(
            Watched::load("tokens", vec![], move || Ok(TokenValidator::load(&tokens)?)).unwrap(),
        ),
        x509: None,
        anonymous: Anonymous::Refuse,
    };
    let p = peer("192.0.2.7:1");
    let good = decide(&auth, &p, &connect(Some("alice"), Some(b"wonderland"))).await;
    match good {
        AuthDecision::Success { identity, .. } => {
            assert_eq!(identity.username.as_deref(), Some("alice"))
        }
        other => panic!("{other:?}"),
    }
    let bad = decide(&auth, &p, &connect(Some("alice"), Some(b"guess"))).await;
    assert_eq!(code(&bad), Some(ReasonCode::BAD_USER_NAME_OR_PASSWORD));
    // Not in the file: the password is taken as a token.
    let token = key.mint(&sat_claims("statehub", "ns", "robot", 600));
    let as_password = decide(&auth, &p, &connect(Some("x"), Some(token.as_bytes()))).await;
    match as_password {
        AuthDecision::Success { identity, .. } => {
            assert_eq!(
                identity.username.as_deref(),
                Some("system:serviceaccount:ns:robot")
            )
        }
        other => panic!("{other:?}"),
    }
    let mut sat = connect(None, None);
    sat.properties.authentication_method = Some(SAT_METHOD.into());
    sat.properties.authentication_data = Some(Bytes::from(token.clone()));
    assert_eq!(code(&decide(&auth, &p, &sat).await), None);
    let expired = key.mint(&sat_claims("statehub", "ns", "robot", -60));
    sat.properties.authentication_data = Some(Bytes::from(expired));
    assert_eq!(
        code(&decide(&auth, &p, &sat).await),
        Some(ReasonCode::NOT_AUTHORIZED)
    );
    sat.properties.authentication_method = Some("SCRAM-SHA-1".into());
    assert_eq!(
        code(&decide(&auth, &p, &sat).await),
        Some(ReasonCode::BAD_AUTHENTICATION_METHOD)
    );
    let nothing = decide(&auth, &p, &connect(None, None)).await;
    assert_eq!(code(&nothing), Some(ReasonCode::NOT_AUTHORIZED));
}

#[test]
fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "passwd", &hash_line("a", b"1", 101).unwrap());
    let p = path.clone();
    let watched: Arc<Watched<PasswordFile>> =
        Watched::load("passwords", vec![path.clone()], move || {
            Ok(PasswordFile::load(&p)?)
        })
        .unwrap();
    assert!(!watched.reload(false).unwrap(), "unchanged");
    let two = format!(
        "{}\n{}\n",
        hash_line("a", b"1", 101).unwrap(),
        hash_line("b", b"2", 101).unwrap()
    );
    std::fs::write(&path, two).unwrap();
    assert!(watched.reload(false).unwrap());
    assert!(watched.get().verify("b", b"2"));
    std::fs::write(&path, "b:broken").unwrap();
    assert!(matches!(watched.reload(false), Err(LoadError::Passwd(_))));
    assert!(watched.get().verify("b", b"2"), "the old file stays in use");
    assert!(watched.reload(true).is_err(), "a forced reload tries again");
}
