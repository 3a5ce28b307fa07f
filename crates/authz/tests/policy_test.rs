//! The rules engine end to end: rules as written (YAML, JSON), principals matched,
//! grants unioned, placeholders filled in safely, everything else denied.

use std::collections::BTreeMap;

use statehub_authz::rules::{self, Format};
use statehub_authz::{Access, Policy, Principal};
use statehub_state_store::{Authorizer, Operation};

/// An AIO resource, as pasted from its documentation (with a state store section).
const AIO_RESOURCE: &str = r#"
apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata:
  name: "my-authz-policies"
  namespace: azure-iot-operations
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      - principals:
          clientIds:
            - "temperature-sensor"
            - "humidity-sensor"
          attributes:
            - city: "seattle"
              organization: "contoso"
        brokerResources:
          - method: Connect
          - method: Publish
            topics:
              - "/telemetry/{principal.clientId}"
              - "/telemetry/{principal.attributes.organization}"
          - method: Subscribe
            topics:
              - "/commands/{principal.attributes.organization}"
        stateStoreResources:
          - method: Read
            keyType: "pattern"
            keys:
              - "myreadkey"
              - "myotherkey?"
              - "mynumerickeysuffix[0-9]"
              - "clients/{principal.clientId}/*"
          - method: ReadWrite
            keyType: "binary"
            keys:
              - "dGVzdA=="
"#;

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn access(
    policy: &Policy,
    id: &str,
    user: Option<&str>,
    attributes: &BTreeMap<String, String>,
) -> Access {
    policy.access(&Principal {
        client_id: id,
        username: user,
        attributes,
    })
}

fn yaml(text: &str) -> Policy {
    Policy::compile(&rules::parse(text, Format::Yaml).expect("parses")).expect("compiles")
}

#[test]
fn an_aio_resource_is_read_as_is() {
    let policy = yaml(AIO_RESOURCE);
    let none = BTreeMap::new();
    let sensor = access(&policy, "temperature-sensor", None, &none);
    assert!(sensor.may_connect());
    assert!(sensor.may_publish("/telemetry/temperature-sensor"));
    assert!(!sensor.may_publish("/telemetry/humidity-sensor"));
    // No organization attribute: the grants that need it give nothing.
    assert!(!sensor.may_publish("/telemetry/contoso"));
    assert!(!sensor.may_subscribe("/commands/contoso"));
    assert!(sensor.may_read(b"clients/temperature-sensor/x"));
    assert!(!sensor.may_read(b"clients/humidity-sensor/x"));
    assert!(sensor.may_read(b"myotherkey1") && sensor.may_read(b"mynumerickeysuffix7"));
    assert!(!sensor.may_write(b"myreadkey"));
    assert!(sensor.may_write(b"test") && sensor.may_read(b"test"));

    let contoso = attrs(&[("city", "seattle"), ("organization", "contoso")]);
    let other = access(&policy, "anything", None, &contoso);
    assert!(other.may_connect());
    assert!(other.may_publish("/telemetry/contoso"));
    assert!(other.may_subscribe("/commands/contoso"));
    // An attribute set matches only with all its pairs.
    let half = attrs(&[("organization", "contoso")]);
    assert!(!access(&policy, "anything", None, &half).may_connect());
}

#[test]
fn every_document_shape_gives_the_same_rules() {
    let list = "- principals: {usernames: [u]}\n  brokerResources: [{method: connect}]\n";
    let policies = format!("rules:\n{}", indent(list));
    let properties = format!(
        "authorizationPolicies:\n  cache: Enabled\n  rules:\n{}",
        indent(&indent(list))
    );
    let json = r#"{"authorizationPolicies": {"rules": [{"principals": {"usernames": ["u"]},
        "brokerResources": [{"method": "Connect", "clientIds": [], "topics": []}]}]}}"#;
    let expected = rules::parse(list, Format::Yaml).unwrap();
    assert_eq!(expected.len(), 1);
    assert_eq!(rules::parse(&policies, Format::Yaml).unwrap(), expected);
    assert_eq!(rules::parse(&properties, Format::Yaml).unwrap(), expected);
    assert_eq!(rules::parse(json, Format::Json).unwrap(), expected);
    assert_eq!(rules::parse(json, Format::Yaml).unwrap(), expected);
    assert!(rules::parse("", Format::Yaml).unwrap().is_empty());
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

#[test]
fn mistakes_are_errors_that_name_the_rule() {
    let cases = [
        ("- principals: {}\n", "rule 1 (principals)"),
        (
            "- principals: {usernames: [u]}\n  brokerResources: [{method: Publish, topics: ['a/#/b']}]\n",
            "rule 1 (brokerResources[0])",
        ),
        (
            "- principals: {usernames: [u]}\n  brokerResources: [{method: Publish, topics: ['x-{principal.clientId}']}]\n",
            "whole topic level",
        ),
        (
            "- principals: {usernames: [u]}\n  brokerResources: [{method: Connect, topics: [a]}]\n",
            "Connect takes clientIds",
        ),
        (
            "- principals: {usernames: [u]}\n  stateStoreResources: [{method: Read, keyType: Binary, keys: ['!!']}]\n",
            "not base64",
        ),
        (
            "- principals: {usernames: [u]}\n  stateStoreResources: [{method: Read, keys: ['{principal.password}']}]\n",
            "unknown placeholder",
        ),
    ];
    for (text, expected) in cases {
        let rules = rules::parse(text, Format::Yaml).expect("parses");
        let error = Policy::compile(&rules).expect_err(text).to_string();
        assert!(
            error.contains(expected),
            "{error:?} should say {expected:?}"
        );
    }
    let unknown = rules::parse(
        "- principals: {usernames: [u]}\n  brokerResources: [{method: Delete}]\n",
        Format::Yaml,
    );
    assert!(unknown.unwrap_err().to_string().contains("unknown method"));
    let field = rules::parse("- principals: {users: [u]}\n", Format::Yaml);
    assert!(field.unwrap_err().to_string().contains("unknown field"));
}

#[test]
fn deny_by_default_and_union_of_grants() {
    let policy = yaml(
        "
- principals: {clientIds: ['sensor-*']}
  brokerResources:
    - {method: Connect}
    - {method: Publish, topics: ['telemetry/{principal.clientId}']}
- principals: {usernames: [ops]}
  brokerResources:
    - {method: Subscribe, topics: ['telemetry/#']}
  stateStoreResources:
    - {method: Write, keyType: String, keys: ['config*']}
",
    );
    let none = BTreeMap::new();
    let stranger = access(&policy, "laptop", Some("guest"), &none);
    assert!(!stranger.may_connect());
    assert!(!stranger.may_publish("telemetry/laptop"));
    assert!(!stranger.may_subscribe("telemetry/#"));
    assert!(!stranger.may_read(b"config*"));

    // Both rules match: the grants add up.
    let both = access(&policy, "sensor-1", Some("ops"), &none);
    assert!(both.may_connect());
    assert!(both.may_publish("telemetry/sensor-1"));
    assert!(both.may_subscribe("telemetry/#"));
    // A String key is exact: `config*` is not a pattern, and braces are text.
    assert!(both.may_write(b"config*"));
    assert!(!both.may_write(b"config1"));
    assert!(!both.may_read(b"config*"));
    assert!(both.authorize("sensor-1", b"config*", Operation::Set));
    assert!(both.authorize("sensor-1", b"config*", Operation::Delete));
    assert!(!both.authorize("sensor-1", b"config*", Operation::Get));
}

#[test]
fn subscriptions_must_fit_inside_a_grant() {
    let policy = yaml(
        "
- principals: {clientIds: ['*']}
  brokerResources:
    - {method: Subscribe, topics: ['sensors/+/temp', 'alerts/#']}
",
    );
    let a = access(&policy, "c", None, &BTreeMap::new());
    for ok in [
        "sensors/1/temp",
        "sensors/+/temp",
        "alerts/#",
        "alerts/x/+",
        "alerts",
        "$share/g/alerts/#",
    ] {
        assert!(a.may_subscribe(ok), "{ok}");
    }
    for no in ["sensors/#", "#", "sensors/1/+", "+/+/temp", "$share/g/#"] {
        assert!(!a.may_subscribe(no), "{no}");
    }
}

#[test]
fn connect_client_ids_take_placeholders() {
    let policy = yaml(
        "
- principals:
    attributes: [{building: building22}, {building: 'b*'}]
  brokerResources:
    - method: Connect
      clientIds: ['{principal.attributes.building}*']
",
    );
    let b22 = attrs(&[("building", "building22")]);
    assert!(access(&policy, "building22-dev", None, &b22).may_connect());
    assert!(!access(&policy, "building23-dev", None, &b22).may_connect());
    // The attribute `b*` is matched literally, not as a pattern.
    let star = attrs(&[("building", "b*")]);
    assert!(access(&policy, "b*-x", None, &star).may_connect());
    assert!(!access(&policy, "bob", None, &star).may_connect());
}

#[test]
fn substituted_names_never_widen_a_grant() {
    let policy = yaml(
        "
- principals: {clientIds: ['*']}
  brokerResources:
    - {method: Publish, topics: ['users/{principal.username}/out']}
    - {method: Subscribe, topics: ['users/{principal.username}/#', '{principal.clientId}/in']}
  stateStoreResources:
    - {method: ReadWrite, keys: ['users/{principal.username}/*']}
",
    );
    let none = BTreeMap::new();
    for name in ["+", "#", "a/b", "*", "?", "[a-z]", "]"] {
        let a = access(&policy, "c", Some(name), &none);
        assert!(!a.may_subscribe("users/#"), "{name:?}");
        assert!(!a.may_subscribe("users/other/#"), "{name:?}");
        assert!(!a.may_publish("users/other/out"), "{name:?}");
        assert!(!a.may_read(b"users/other/k"), "{name:?}");
        assert!(!a.may_read(b"users/x/k"), "{name:?}");
    }
    // Glob characters are matched literally instead.
    let star = access(&policy, "c", Some("*"), &none);
    assert!(star.may_read(b"users/*/k"));
    // A client id of `$SYS` must not reach the `$` topics.
    let dollar = access(&policy, "$SYS", Some("u"), &none);
    assert!(!dollar.may_subscribe("$SYS/in"));
    assert!(dollar.may_subscribe("users/u/x"));
}
