//! The rules as written: the AIO `BrokerAuthorization` resource's own field names
//! (`principals.clientIds`, `brokerResources`, `stateStoreResources`, `keyType`, ...), so
//! that an AIO resource's `authorizationPolicies.rules` can be pasted. Method and key type
//! names are read without regard to case (`Read`, `read`; `Pattern`, `pattern`), as the
//! AIO documentation writes both. `snake_case` spellings of the fields are accepted too,
//! for TOML.
//!
//! A rules file (YAML or JSON) may hold the list of rules itself, an object with `rules`
//! (`authorizationPolicies`, whose `cache` is ignored), an object with
//! `authorizationPolicies` (the resource's `properties` or `spec`), or the whole
//! Kubernetes resource (`apiVersion`, `kind`, `metadata`, `spec`).

use std::collections::BTreeMap;

use serde::Deserialize;

/// One rule: whoever matches `principals` gets every resource listed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// Who the rule is for (any listed client id, username or attribute set).
    pub principals: Principals,
    /// MQTT methods and topics granted.
    #[serde(default, alias = "broker_resources")]
    pub broker_resources: Vec<BrokerResource>,
    /// State store keys granted.
    #[serde(default, alias = "state_store_resources")]
    pub state_store_resources: Vec<StateStoreResource>,
}

/// Who a rule is for: a client matches when any listed client id or username pattern
/// matches it, or when it has every key and value of any one attribute map.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Principals {
    /// Client id patterns (`*`, `?`, `[...]` as in SCAN patterns).
    #[serde(alias = "client_ids")]
    pub client_ids: Vec<String>,
    /// Username patterns.
    pub usernames: Vec<String>,
    /// Attribute sets.
    pub attributes: Vec<BTreeMap<String, String>>,
}

/// An MQTT method and what it applies to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrokerResource {
    pub method: BrokerMethod,
    /// Topic filters (`Publish`, `Subscribe`).
    #[serde(default)]
    pub topics: Vec<String>,
    /// Client id patterns a `Connect` is limited to (none: any).
    #[serde(default, alias = "client_ids")]
    pub client_ids: Vec<String>,
}

/// `Connect`, `Publish` or `Subscribe`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum BrokerMethod {
    Connect,
    Publish,
    Subscribe,
}

/// State store keys and what may be done with them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateStoreResource {
    pub method: StoreMethod,
    /// How `keys` are read; `Pattern` when absent, as in AIO.
    #[serde(default, alias = "key_type")]
    pub key_type: KeyType,
    pub keys: Vec<String>,
}

/// `Read` (GET, KEYNOTIFY, SCAN), `Write` (SET, DEL, VDEL) or `ReadWrite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum StoreMethod {
    Read,
    Write,
    ReadWrite,
}

/// How state store keys are written in a rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum KeyType {
    /// A glob, as SCAN patterns are (`*`, `?`, `[...]`); may use placeholders.
    #[default]
    Pattern,
    /// The exact key, as UTF-8 text.
    String,
    /// The exact key, base64 (standard alphabet, padded).
    Binary,
}

/// A name that is not one of the values allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected one of {expected})")]
pub struct UnknownName {
    what: &'static str,
    value: String,
    expected: &'static str,
}

fn pick<T: Copy>(
    value: String,
    what: &'static str,
    choices: &[(&'static str, T)],
    expected: &'static str,
) -> Result<T, UnknownName> {
    choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(&value))
        .map(|(_, v)| *v)
        .ok_or(UnknownName {
            what,
            value,
            expected,
        })
}

impl TryFrom<String> for BrokerMethod {
    type Error = UnknownName;
    fn try_from(value: String) -> Result<Self, UnknownName> {
        use BrokerMethod::*;
        let choices = [
            ("Connect", Connect),
            ("Publish", Publish),
            ("Subscribe", Subscribe),
        ];
        pick(value, "method", &choices, "Connect, Publish, Subscribe")
    }
}

impl TryFrom<String> for StoreMethod {
    type Error = UnknownName;
    fn try_from(value: String) -> Result<Self, UnknownName> {
        use StoreMethod::*;
        let choices = [("Read", Read), ("Write", Write), ("ReadWrite", ReadWrite)];
        pick(value, "method", &choices, "Read, Write, ReadWrite")
    }
}

impl TryFrom<String> for KeyType {
    type Error = UnknownName;
    fn try_from(value: String) -> Result<Self, UnknownName> {
        use KeyType::*;
        let choices = [("Pattern", Pattern), ("String", String), ("Binary", Binary)];
        pick(value, "keyType", &choices, "Pattern, String, Binary")
    }
}

/// The format of a rules file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// The format a file name says: `.json` is JSON, anything else YAML (which also
    /// reads most JSON).
    pub fn from_name(name: &str) -> Format {
        if name.to_ascii_lowercase().ends_with(".json") {
            Format::Json
        } else {
            Format::Yaml
        }
    }
}

/// A rules file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("expected a list of rules, or an object with rules, authorizationPolicies or spec")]
    Shape,
}

/// Every shape a rules document may take, as one object (the list form is read apart).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    rules: Option<Vec<Rule>>,
    authorization_policies: Option<Policies>,
    spec: Option<Spec>,
    /// `authorizationPolicies.cache`: the AIO broker's decision cache; nothing to set.
    #[serde(rename = "cache")]
    _cache: Option<serde::de::IgnoredAny>,
    #[serde(rename = "apiVersion")]
    _api_version: Option<serde::de::IgnoredAny>,
    #[serde(rename = "kind")]
    _kind: Option<serde::de::IgnoredAny>,
    #[serde(rename = "metadata")]
    _metadata: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Policies {
    #[serde(default)]
    rules: Vec<Rule>,
    #[serde(rename = "cache")]
    _cache: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    authorization_policies: Policies,
}

impl Document {
    fn rules(self) -> Result<Vec<Rule>, ParseError> {
        match (self.rules, self.authorization_policies, self.spec) {
            (Some(rules), None, None) => Ok(rules),
            (None, Some(p), None)
            | (
                None,
                None,
                Some(Spec {
                    authorization_policies: p,
                }),
            ) => Ok(p.rules),
            _ => Err(ParseError::Shape),
        }
    }
}

/// Reads the rules of a rules file's text.
pub fn parse(text: &str, format: Format) -> Result<Vec<Rule>, ParseError> {
    match format {
        Format::Json => match serde_json::from_str::<serde_json::Value>(text)? {
            serde_json::Value::Array(_) => Ok(serde_json::from_str(text)?),
            serde_json::Value::Object(_) => serde_json::from_str::<Document>(text)?.rules(),
            _ => Err(ParseError::Shape),
        },
        Format::Yaml => match serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)? {
            serde_yaml_ng::Value::Sequence(_) => Ok(serde_yaml_ng::from_str(text)?),
            serde_yaml_ng::Value::Mapping(_) => serde_yaml_ng::from_str::<Document>(text)?.rules(),
            // An empty file: no rules.
            serde_yaml_ng::Value::Null => Ok(Vec::new()),
            _ => Err(ParseError::Shape),
        },
    }
}
