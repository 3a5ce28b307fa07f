//! Rules checked and compiled once, when they load: every topic, key and pattern is
//! validated then (a bad rule is an error naming it, never a silent "matches nothing"),
//! and a principal's [`Access`] is derived from the compiled form without parsing.

use base64::Engine as _;
use statehub_state_store::glob::Pattern;

use crate::access::{Access, Keys, Topics};
use crate::rules::{BrokerMethod, BrokerResource, KeyType, Rule, StateStoreResource, StoreMethod};
use crate::template::{Template, TemplateError};
use crate::{topic, Principal};

/// Compiled rules. Empty rules allow everything (see the crate docs).
#[derive(Debug, Default)]
pub struct Policy {
    rules: Vec<Compiled>,
}

/// A rule that cannot be used, and which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rule {} ({what}): {error}", index + 1)]
pub struct PolicyError {
    /// The rule's position in the list, from 0.
    pub index: usize,
    /// The field at fault.
    pub what: String,
    pub error: RuleError,
}

/// What is wrong with a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("a rule must name principals (clientIds, usernames or attributes); use clientIds: [\"*\"] for everyone")]
    NoPrincipals,
    #[error("an attribute set must not be empty")]
    EmptyAttributes,
    #[error("Connect takes clientIds, not topics")]
    ConnectTopics,
    #[error("{0:?} takes topics, not clientIds")]
    ClientIdsOn(BrokerMethod),
    #[error("{0:?} needs at least one topic")]
    NoTopics(BrokerMethod),
    #[error("no keys")]
    NoKeys,
    #[error("{0:?}: {1}")]
    Topic(String, &'static str),
    #[error("{0:?}: {1}")]
    Template(String, TemplateError),
    #[error("{0:?} is not base64: {1}")]
    Base64(String, String),
}

#[derive(Debug)]
struct Compiled {
    client_ids: Vec<Pattern>,
    usernames: Vec<Pattern>,
    attributes: Vec<Vec<(String, String)>>,
    /// The client id patterns of each `Connect` resource; an empty list allows any.
    connect: Vec<Vec<Template>>,
    publish: Vec<Template>,
    subscribe: Vec<Template>,
    read: Vec<KeyGrant>,
    write: Vec<KeyGrant>,
}

#[derive(Debug, Clone)]
enum KeyGrant {
    Pattern(Template),
    Exact(Vec<u8>),
}

impl Policy {
    /// Checks and compiles `rules`.
    pub fn compile(rules: &[Rule]) -> Result<Policy, PolicyError> {
        let rules = rules
            .iter()
            .enumerate()
            .map(|(index, rule)| {
                compile_rule(rule).map_err(|(what, error)| PolicyError { index, what, error })
            })
            .collect::<Result<_, _>>()?;
        Ok(Policy { rules })
    }

    /// Whether there are no rules (everything is allowed).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// What `who` may do: the union of the grants of every rule that matches it.
    pub fn access(&self, who: &Principal<'_>) -> Access {
        let mut access = Access::default();
        let mut publish = Vec::new();
        let mut subscribe = Vec::new();
        let mut read = Vec::new();
        let mut write = Vec::new();
        for rule in self.rules.iter().filter(|r| r.matches(who)) {
            access.connect |= rule.connect.iter().any(|ids| may_connect(ids, who));
            publish.extend(rule.publish.iter().filter_map(|t| t.render_topic(who)));
            subscribe.extend(rule.subscribe.iter().filter_map(|t| t.render_topic(who)));
            read.extend(rule.read.iter().filter_map(|k| k.render(who)));
            write.extend(rule.write.iter().filter_map(|k| k.render(who)));
        }
        access.publish = Topics::new(publish);
        access.subscribe = Topics::new(subscribe);
        access.read = Keys::new(read);
        access.write = Keys::new(write);
        access
    }
}

fn may_connect(ids: &[Template], who: &Principal<'_>) -> bool {
    ids.is_empty()
        || ids.iter().any(|t| {
            t.render_glob(who)
                .is_some_and(|g| Pattern::compile(g.as_bytes()).is_match(who.client_id.as_bytes()))
        })
}

impl Compiled {
    fn matches(&self, who: &Principal<'_>) -> bool {
        let id = who.client_id.as_bytes();
        self.client_ids.iter().any(|p| p.is_match(id))
            || who
                .username
                .is_some_and(|u| self.usernames.iter().any(|p| p.is_match(u.as_bytes())))
            || self.attributes.iter().any(|set| {
                set.iter()
                    .all(|(k, v)| who.attributes.get(k).is_some_and(|have| have == v))
            })
    }
}

impl KeyGrant {
    fn render(&self, who: &Principal<'_>) -> Option<crate::access::KeyMatch> {
        match self {
            KeyGrant::Exact(key) => Some(crate::access::KeyMatch::Exact(key.clone())),
            KeyGrant::Pattern(t) => t.render_glob(who).map(crate::access::KeyMatch::glob),
        }
    }
}

type Fault = (String, RuleError);

fn compile_rule(rule: &Rule) -> Result<Compiled, Fault> {
    let p = &rule.principals;
    if p.client_ids.is_empty() && p.usernames.is_empty() && p.attributes.is_empty() {
        return Err(("principals".into(), RuleError::NoPrincipals));
    }
    if p.attributes.iter().any(|a| a.is_empty()) {
        return Err(("principals.attributes".into(), RuleError::EmptyAttributes));
    }
    let patterns = |what: &str, list: &[String]| -> Result<Vec<Pattern>, Fault> {
        list.iter()
            .map(|text| {
                let t = Template::parse(text).and_then(|t| t.check_none().map(|()| t));
                t.map(|_| Pattern::compile(text.as_bytes()))
                    .map_err(|e| (what.to_owned(), RuleError::Template(text.clone(), e)))
            })
            .collect()
    };
    let mut compiled = Compiled {
        client_ids: patterns("principals.clientIds", &p.client_ids)?,
        usernames: patterns("principals.usernames", &p.usernames)?,
        attributes: p
            .attributes
            .iter()
            .map(|set| set.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .collect(),
        connect: Vec::new(),
        publish: Vec::new(),
        subscribe: Vec::new(),
        read: Vec::new(),
        write: Vec::new(),
    };
    for (i, resource) in rule.broker_resources.iter().enumerate() {
        let what = format!("brokerResources[{i}]");
        add_broker(&mut compiled, resource).map_err(|e| (what, e))?;
    }
    for (i, resource) in rule.state_store_resources.iter().enumerate() {
        let what = format!("stateStoreResources[{i}]");
        add_store(&mut compiled, resource).map_err(|e| (what, e))?;
    }
    Ok(compiled)
}

fn add_broker(compiled: &mut Compiled, r: &BrokerResource) -> Result<(), RuleError> {
    if r.method == BrokerMethod::Connect {
        if !r.topics.is_empty() {
            return Err(RuleError::ConnectTopics);
        }
        let ids = r
            .client_ids
            .iter()
            .map(|text| {
                Template::parse(text)
                    .and_then(|t| t.check_glob().map(|()| t))
                    .map_err(|e| RuleError::Template(text.clone(), e))
            })
            .collect::<Result<_, _>>()?;
        compiled.connect.push(ids);
        return Ok(());
    }
    if !r.client_ids.is_empty() {
        return Err(RuleError::ClientIdsOn(r.method));
    }
    if r.topics.is_empty() {
        return Err(RuleError::NoTopics(r.method));
    }
    let topics = r
        .topics
        .iter()
        .map(|text| topic_template(text))
        .collect::<Result<Vec<_>, _>>()?;
    match r.method {
        BrokerMethod::Publish => compiled.publish.extend(topics),
        _ => compiled.subscribe.extend(topics),
    }
    Ok(())
}

fn topic_template(text: &str) -> Result<Template, RuleError> {
    let bad = |e| RuleError::Template(text.to_owned(), e);
    let t = Template::parse(text).map_err(bad)?;
    t.check_levels().map_err(bad)?;
    topic::check_filter(&t.with_stand_in("x")).map_err(|e| RuleError::Topic(text.to_owned(), e))?;
    Ok(t)
}

fn add_store(compiled: &mut Compiled, r: &StateStoreResource) -> Result<(), RuleError> {
    if r.keys.is_empty() {
        return Err(RuleError::NoKeys);
    }
    let keys = r
        .keys
        .iter()
        .map(|text| key_grant(r.key_type, text))
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(r.method, StoreMethod::Read | StoreMethod::ReadWrite) {
        compiled.read.extend(keys.iter().cloned());
    }
    if matches!(r.method, StoreMethod::Write | StoreMethod::ReadWrite) {
        compiled.write.extend(keys);
    }
    Ok(())
}

/// Placeholders apply to `Pattern` keys only, as in AIO; `String` and `Binary` keys are
/// exact bytes.
fn key_grant(kind: KeyType, text: &str) -> Result<KeyGrant, RuleError> {
    match kind {
        KeyType::Pattern => {
            let bad = |e| RuleError::Template(text.to_owned(), e);
            let t = Template::parse(text).map_err(bad)?;
            t.check_glob().map_err(bad)?;
            Ok(KeyGrant::Pattern(t))
        }
        KeyType::String => Ok(KeyGrant::Exact(text.as_bytes().to_vec())),
        KeyType::Binary => base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(KeyGrant::Exact)
            .map_err(|e| RuleError::Base64(text.to_owned(), e.to_string())),
    }
}
