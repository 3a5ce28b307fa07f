//! The official AIO Rust SDK connecting the way it does in a cluster: TLS verified
//! against a CA file, and a Kubernetes service-account token file sent as K8S-SAT
//! enhanced authentication; state store operations run; a token replaced in its
//! file is re-authenticated on the live connection (AUTH 0x19), which keeps the
//! session past the first token's expiry.

mod sdk_client;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_services::state_store::SetOptions;
use sdk_client::Sdk;
use statehub_auth::jwt::{TokenConfig, TokenValidator};
use statehub_auth::testing::{sat_claims, TestCa, TokenKey};
use statehub_auth::tls::{server_config, TlsFiles};
use statehub_auth::{Anonymous, ListenerAuth, Watched};
use statehub_broker::{Broker, BrokerConfig, ManualClock, MqttListener};
use statehub_state_store_service::{Settings, StateStoreService, REQUEST_TOPIC};
use tokio::time::timeout;

const TIMEOUT: Duration = Duration::from_secs(10);
/// The SDK waits 10 s after the SAT file's last change before re-authenticating.
const REAUTH: Duration = Duration::from_secs(60);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A broker with the state store behind a TLS listener that takes tokens only.
struct Secured {
    broker: Broker,
    port: u16,
    clock: ManualClock,
    ca: PathBuf,
    key: TokenKey,
    _dir: tempfile::TempDir,
}

async fn secured() -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("statehub test CA");
    let server = ca.server();
    let files = TlsFiles {
        cert: write(dir.path(), "server.crt", &server.cert),
        key: write(dir.path(), "server.key", &server.key),
        client_ca: None,
        require_client_cert: false,
    };
    let key = TokenKey::es256();
    let tokens = TokenConfig {
        keys: vec![write(dir.path(), "sa.pub", &key.public_pem)],
        jwks: None,
        hmac_secret_file: None,
        audiences: vec!["statehub".into()],
        issuer: None,
        username_claim: "sub".into(),
        attributes: Default::default(),
        leeway_secs: 0,
    };
    let clock = ManualClock::new();
    let broker = Broker::with_clock(BrokerConfig::default(), clock.clock());
    let svc = Arc::new(StateStoreService::in_memory(&Settings::default()).unwrap());
    broker.register_service(REQUEST_TOPIC, svc.clone());
    tokio::spawn(svc.run_expiry(broker.clone()));
    let auth = ListenerAuth {
        passwords: None,
        tokens: Some(
            Watched::load("tokens", vec![], move || Ok(TokenValidator::load(&tokens)?)).unwrap(),
        ),
        x509: None,
        anonymous: Anonymous::Refuse,
    };
    let tls = Watched::load("tls", vec![], move || Ok(server_config(&files, &[])?)).unwrap();
    let l = MqttListener::bind(broker.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
        .with_authenticator(Arc::new(auth))
        .with_tls(tls);
    let port = l.local_addr().unwrap().port();
    tokio::spawn(l.serve(Duration::from_secs(1)));
    Secured {
        broker,
        port,
        clock,
        ca: write(dir.path(), "ca.pem", &ca.cert),
        key,
        _dir: dir,
    }
}

impl Sdk {
    /// An SDK session over TLS (verified against the test CA) sending the token in
    /// `sat_file` as K8S-SAT, as the SDK does in a cluster.
    fn connect(s: &Secured, client_id: &str, sat_file: &Path) -> Sdk {
        let settings = MqttConnectionSettingsBuilder::default()
            .client_id(client_id)
            .hostname("localhost")
            .tcp_port(s.port)
            .keep_alive(Duration::from_secs(600))
            .use_tls(true)
            .ca_file(Some(s.ca.display().to_string()))
            .sat_file(Some(sat_file.display().to_string()))
            .build()
            .unwrap();
        Sdk::start(settings)
    }

    async fn set_get(&self, key: &str, value: &str) {
        let set = self.store.set(
            key.as_bytes().to_vec(),
            value.as_bytes().to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        );
        assert!(timeout(TIMEOUT, set).await.unwrap().unwrap().response);
        let get = self.store.get(key.as_bytes().to_vec(), TIMEOUT);
        let got = timeout(TIMEOUT, get).await.unwrap().unwrap().response;
        assert_eq!(got.as_deref(), Some(value.as_bytes()));
    }
}

async fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_runs_state_store_operations_over_tls_with_a_sat_file() {
    let s = secured().await;
    let dir = tempfile::tempdir().unwrap();
    let token = s.key.mint(&sat_claims("statehub", "factory", "robot", 600));
    let sat = write(dir.path(), "token", &token);
    let sdk = Sdk::connect(&s, "sdk-sat-1", &sat);
    sdk.set_get("sat-key", "v1").await;
    assert_eq!(s.broker.metrics().auth_failures.load(Relaxed), 0);
    sdk.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_replaced_mid_session_is_re_authenticated_without_a_reconnect() {
    let s = secured().await;
    let dir = tempfile::tempdir().unwrap();
    let first = s.key.mint(&sat_claims("statehub", "factory", "robot", 120));
    let sat = write(dir.path(), "token", &first);
    let sdk = Sdk::connect(&s, "sdk-sat-2", &sat);
    sdk.set_get("rotating", "before").await;
    let connections = s.broker.metrics().connections_total.load(Relaxed);
    // The kubelet writes the renewed token into the file; the SDK reads it after its
    // 10 s aggregation window and sends AUTH 0x19 on the live connection.
    let second = s
        .key
        .mint(&sat_claims("statehub", "factory", "robot", 3600));
    std::fs::write(&sat, &second).unwrap();
    wait_for(REAUTH, "the re-authentication", || {
        s.broker.metrics().reauthentications.load(Relaxed) >= 1
    })
    .await;
    // Past the first token's expiry (well within the keep-alive): the connection
    // lives on the second's.
    s.clock.advance(Duration::from_secs(180));
    sdk.set_get("rotating", "after").await;
    let m = s.broker.metrics();
    assert_eq!(m.credentials_expired.load(Relaxed), 0);
    assert_eq!(
        m.connections_total.load(Relaxed),
        connections,
        "no reconnect"
    );
    assert_eq!(m.auth_failures.load(Relaxed), 0);
    sdk.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_renewed_token_the_connection_ends_at_its_expiry() {
    let s = secured().await;
    let dir = tempfile::tempdir().unwrap();
    let short = s.key.mint(&sat_claims("statehub", "factory", "robot", 120));
    let sat = write(dir.path(), "token", &short);
    let sdk = Sdk::connect(&s, "sdk-sat-3", &sat);
    sdk.set_get("short", "lived").await;
    let connections = s.broker.metrics().connections_total.load(Relaxed);
    s.clock.advance(Duration::from_secs(180));
    wait_for(TIMEOUT, "the expiry", || {
        s.broker.metrics().credentials_expired.load(Relaxed) == 1
    })
    .await;
    // The SDK reconnects by itself with the same token, valid for this broker until
    // the clock passes its expiry again.
    wait_for(TIMEOUT, "the reconnect", || {
        s.broker.metrics().connections_total.load(Relaxed) > connections
    })
    .await;
    assert_eq!(s.broker.metrics().auth_failures.load(Relaxed), 0);
    sdk.close(TIMEOUT).await;
}
