//! The official Azure IoT Operations Rust clients (state store, lease, lock) against an
//! in-process statehub: what users run must work, not only what the protocol page says.

mod common;
mod sdk_client;

use std::sync::Arc;
use std::time::Duration;

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock::{lease, lock};
use azure_iot_operations_services::state_store::{self, Operation, SetCondition, SetOptions};
use sdk_client::Sdk;
use tokio::time::timeout;

const TIMEOUT: Duration = Duration::from_secs(5);

/// An SDK session connected to `addr` without TLS.
fn connect(addr: std::net::SocketAddr, client_id: &str) -> Sdk {
    let settings = MqttConnectionSettingsBuilder::default()
        .client_id(client_id)
        .hostname(addr.ip().to_string())
        .tcp_port(addr.port())
        .keep_alive(Duration::from_secs(5))
        .use_tls(false)
        .build()
        .unwrap();
    Sdk::start(settings)
}

/// HLC order: wall clock, then counter (node ids are all the store's).
fn newer(a: &HybridLogicalClock, b: &HybridLogicalClock) -> bool {
    (a.timestamp, a.counter) > (b.timestamp, b.counter)
}

fn opts(condition: SetCondition, expires: Option<Duration>) -> SetOptions {
    SetOptions {
        set_condition: condition,
        expires,
        ..SetOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_get_del_vdel_with_fencing() {
    let (_broker, addr) = common::start().await;
    let sdk = connect(addr, "sdk-basic");
    let s = &sdk.store;

    let set = s
        .set(
            b"k".to_vec(),
            b"v1".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set.response);
    let v1 = set.version.unwrap();
    let get = s.get(b"k".to_vec(), TIMEOUT).await.unwrap();
    assert_eq!(get.response, Some(b"v1".to_vec()));
    assert_eq!(get.version, Some(v1.clone()));
    let nx = s
        .set(
            b"k".to_vec(),
            b"v2".to_vec(),
            TIMEOUT,
            None,
            opts(SetCondition::OnlyIfDoesNotExist, None),
        )
        .await
        .unwrap();
    assert!(!nx.response);
    let nex = s
        .set(
            b"k".to_vec(),
            b"v1".to_vec(),
            TIMEOUT,
            None,
            opts(SetCondition::OnlyIfEqualOrDoesNotExist, None),
        )
        .await
        .unwrap();
    assert!(nex.response);
    let vdel = s
        .vdel(b"k".to_vec(), b"other".to_vec(), None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(vdel.response, -1);
    let vdel = s
        .vdel(b"k".to_vec(), b"v1".to_vec(), None, TIMEOUT)
        .await
        .unwrap();
    assert_eq!(vdel.response, 1);
    let missing = s.get(b"k".to_vec(), TIMEOUT).await.unwrap();
    assert_eq!(missing.response, None);
    assert!(missing.version.is_none());

    // Fencing: the lock's version protects another key.
    let lock = s
        .set(
            b"lock".to_vec(),
            b"me".to_vec(),
            TIMEOUT,
            None,
            opts(
                SetCondition::OnlyIfEqualOrDoesNotExist,
                Some(Duration::from_secs(10)),
            ),
        )
        .await
        .unwrap();
    let token = lock.version.unwrap();
    assert!(
        s.set(
            b"fenced".to_vec(),
            b"a".to_vec(),
            TIMEOUT,
            Some(token.clone()),
            SetOptions::default()
        )
        .await
        .unwrap()
        .response
    );
    assert!(s
        .set(
            b"fenced".to_vec(),
            b"b".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default()
        )
        .await
        .is_err());
    assert!(s.del(b"fenced".to_vec(), None, TIMEOUT).await.is_err());
    assert_eq!(
        s.del(b"fenced".to_vec(), Some(token), TIMEOUT)
            .await
            .unwrap()
            .response,
        1
    );
    assert_eq!(
        s.del(b"fenced".to_vec(), None, TIMEOUT)
            .await
            .unwrap()
            .response,
        0
    );
    sdk.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_set_delete_and_expiry() {
    let (_broker, addr) = common::start().await;
    let sdk = connect(addr, "sdk-observe");
    let s = &sdk.store;
    let mut obs = s
        .observe(b"watched".to_vec(), TIMEOUT)
        .await
        .unwrap()
        .response;

    let set = s
        .set(
            b"watched".to_vec(),
            b"x".to_vec(),
            TIMEOUT,
            None,
            opts(
                SetCondition::Unconditional,
                Some(Duration::from_millis(500)),
            ),
        )
        .await
        .unwrap();
    let (n, _) = timeout(TIMEOUT, obs.recv_notification())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.operation, Operation::Set(b"x".to_vec()));
    assert_eq!(Some(n.version), set.version);
    let (n, _) = timeout(TIMEOUT, obs.recv_notification())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.operation, Operation::Del, "the key expired");

    assert!(
        s.unobserve(b"watched".to_vec(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    assert!(
        !s.unobserve(b"watched".to_vec(), TIMEOUT)
            .await
            .unwrap()
            .response
    );
    sdk.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_pages_through_matching_keys() {
    let mut settings = statehub_state_store_service::Settings::default();
    settings.store.scan_count = 7;
    let (_broker, addr) = common::start_with(settings).await;
    let sdk = connect(addr, "sdk-scan");
    let s = &sdk.store;
    for i in 0..20 {
        s.set(
            format!("scan{i:02}").into_bytes(),
            b"v".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
        s.set(
            format!("other{i:02}").into_bytes(),
            b"v".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
        .await
        .unwrap();
    }
    let mut pager = s.list_keys(b"scan1[0-4]".to_vec(), TIMEOUT).unwrap();
    let mut keys = Vec::new();
    let mut pages = 0;
    while let Some(page) = pager.next().await.unwrap() {
        keys.extend(page);
        pages += 1;
        assert!(pages < 64, "the pager never ends");
    }
    keys.sort();
    let expected: Vec<Vec<u8>> = (10..15).map(|i| format!("scan{i}").into_bytes()).collect();
    assert_eq!(keys, expected);
    assert!(pages > 1, "scan_count 7 over 40 keys needs several pages");
    sdk.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_is_exclusive_and_renewable() {
    let (_broker, addr) = common::start().await;
    let a = connect(addr, "sdk-lease-a");
    let b = connect(addr, "sdk-lease-b");
    let la =
        lease::Client::new(a.store.clone(), b"lease".to_vec(), b"sdk-lease-a".to_vec()).unwrap();
    let lb =
        lease::Client::new(b.store.clone(), b"lease".to_vec(), b"sdk-lease-b".to_vec()).unwrap();

    let t1 = la
        .acquire(Duration::from_secs(2), TIMEOUT, None)
        .await
        .unwrap();
    assert!(lb
        .acquire(Duration::from_secs(2), TIMEOUT, None)
        .await
        .is_err());
    assert_eq!(
        lb.get_holder(TIMEOUT).await.unwrap(),
        Some(b"sdk-lease-a".to_vec())
    );
    let t2 = la
        .acquire(Duration::from_secs(2), TIMEOUT, None)
        .await
        .unwrap();
    assert!(newer(&t2, &t1), "a renewal gets a newer fencing token");
    la.release(TIMEOUT).await.unwrap();
    let t3 = lb
        .acquire(Duration::from_secs(2), TIMEOUT, None)
        .await
        .unwrap();
    assert!(newer(&t3, &t2));
    assert_eq!(t3.node_id, "state-store");
    a.close(TIMEOUT).await;
    b.close(TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_waits_for_the_holder_to_expire() {
    let (_broker, addr) = common::start().await;
    let a = connect(addr, "sdk-lock-a");
    let b = connect(addr, "sdk-lock-b");
    let la = lock::Client::new(a.store.clone(), b"lock".to_vec(), b"sdk-lock-a".to_vec()).unwrap();
    let lb = lock::Client::new(b.store.clone(), b"lock".to_vec(), b"sdk-lock-b".to_vec()).unwrap();
    la.lock(Duration::from_secs(1), TIMEOUT, None)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    // b waits for a's lock to expire (the NOTIFY DELETE wakes it), then takes it.
    let token = timeout(TIMEOUT, lb.lock(Duration::from_secs(2), TIMEOUT, None))
        .await
        .unwrap()
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(500));
    // The token fences a protected key.
    let set = b
        .store
        .set(
            b"protected".to_vec(),
            b"v".to_vec(),
            TIMEOUT,
            Some(token),
            SetOptions::default(),
        )
        .await
        .unwrap();
    assert!(set.response);
    lb.unlock(TIMEOUT).await.unwrap();
    a.close(TIMEOUT).await;
    b.close(TIMEOUT).await;
}

/// The SDK's own recipe under rules: Connect, Publish on the request topic, Subscribe
/// to its response and notification topics, and keys under its client id.
const SDK_RULES: &str = "
- principals: {clientIds: ['sdk-*']}
  brokerResources:
    - {method: Connect}
    - {method: Publish, topics: ['statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/command/invoke']}
    - method: Subscribe
      topics:
        - 'clients/{principal.clientId}/#'
        - 'clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/#'
  stateStoreResources:
    - {method: ReadWrite, keys: ['{principal.clientId}/*']}
    - {method: Read, keyType: String, keys: [shared]}
";

fn not_authorized<T>(result: Result<T, state_store::Error>) -> bool {
    matches!(
        result.as_ref().map_err(state_store::Error::kind),
        Err(state_store::ErrorKind::ServiceError(
            state_store::ServiceError::NotAuthorized
        ))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_key_is_the_sdk_not_authorized_error() {
    let (broker, addr) = common::start().await;
    let rules = statehub_authz::rules::parse(SDK_RULES, statehub_authz::Format::Yaml).unwrap();
    broker.set_policy(Some(Arc::new(
        statehub_authz::Policy::compile(&rules).unwrap(),
    )));
    let sdk = connect(addr, "sdk-a");
    let s = &sdk.store;
    let set = |key: &str| {
        s.set(
            key.as_bytes().to_vec(),
            b"v".to_vec(),
            TIMEOUT,
            None,
            SetOptions::default(),
        )
    };
    assert!(set("sdk-a/k").await.unwrap().response);
    let get = s.get(b"sdk-a/k".to_vec(), TIMEOUT).await.unwrap();
    assert_eq!(get.response, Some(b"v".to_vec()));
    assert_eq!(
        s.get(b"shared".to_vec(), TIMEOUT).await.unwrap().response,
        None
    );
    assert!(
        not_authorized(set("shared").await),
        "write on a read-only key"
    );
    assert!(not_authorized(set("sdk-b/k").await), "another client's key");
    assert!(not_authorized(s.get(b"sdk-b/k".to_vec(), TIMEOUT).await));
    assert!(not_authorized(
        s.del(b"sdk-b/k".to_vec(), None, TIMEOUT).await
    ));
    assert!(not_authorized(
        s.observe(b"sdk-b/k".to_vec(), TIMEOUT).await
    ));
    // The observation of an allowed key works, notification included.
    let mut observed = s
        .observe(b"sdk-a/k".to_vec(), TIMEOUT)
        .await
        .unwrap()
        .response;
    set("sdk-a/k").await.unwrap();
    let (notification, _) = timeout(TIMEOUT, observed.recv_notification())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(notification.key, b"sdk-a/k".to_vec());
    sdk.close(TIMEOUT).await;
}
