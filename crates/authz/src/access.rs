//! What one principal may do: its grants with every placeholder filled in, compiled once
//! (at CONNECT, or when the rules change) and asked on every operation.

use std::collections::HashSet;

use statehub_state_store::glob::Pattern;
use statehub_state_store::{Authorizer, Operation};

use crate::topic;

/// A principal's grants. The default grants nothing.
#[derive(Debug, Default)]
pub struct Access {
    pub(crate) connect: bool,
    pub(crate) publish: Topics,
    pub(crate) subscribe: Topics,
    pub(crate) read: Keys,
    pub(crate) write: Keys,
}

impl Access {
    /// Whether the principal may connect.
    pub fn may_connect(&self) -> bool {
        self.connect
    }

    /// Whether the principal may publish on `topic` (a Topic Name).
    pub fn may_publish(&self, topic: &str) -> bool {
        self.publish.allows(topic)
    }

    /// Whether the principal may subscribe to `filter`: only if one granted filter covers
    /// it entirely, so that the subscription (and the retained messages it brings) can
    /// never deliver a topic outside the grants. `$share/{group}/{filter}` is allowed when
    /// a grant covers it as written or covers its `filter`.
    pub fn may_subscribe(&self, filter: &str) -> bool {
        if self.subscribe.covers(filter) {
            return true;
        }
        match topic::split_shared(filter) {
            (Some(_), inner) => self.subscribe.covers(inner),
            (None, _) => false,
        }
    }

    /// Whether the principal may read `key` (GET, KEYNOTIFY, see it in a SCAN).
    pub fn may_read(&self, key: &[u8]) -> bool {
        self.read.allows(key)
    }

    /// Whether the principal may write `key` (SET, DEL, VDEL).
    pub fn may_write(&self, key: &[u8]) -> bool {
        self.write.allows(key)
    }

    /// The grants, for people to read (`statehub check-config`).
    pub fn describe(&self) -> Description {
        Description {
            connect: self.connect,
            publish: self.publish.list(),
            subscribe: self.subscribe.list(),
            read: self.read.list(),
            write: self.write.list(),
        }
    }
}

/// The state store asks the requester's grants about each key.
impl Authorizer for Access {
    fn authorize(&self, _client_id: &str, key: &[u8], op: Operation) -> bool {
        match op {
            Operation::Get | Operation::KeyNotify | Operation::Scan => self.may_read(key),
            Operation::Set | Operation::Delete => self.may_write(key),
        }
    }
}

/// A principal's grants as text: topic filters, and state store keys (`glob:`, `exact:`
/// with the key's text, or `base64:` for a key that is not UTF-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    pub connect: bool,
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    pub read: Vec<String>,
    pub write: Vec<String>,
}

/// Granted topic filters. Filters without wildcards are looked up in a set, so a
/// principal with many exact topics pays one hash per PUBLISH.
#[derive(Debug, Default)]
pub(crate) struct Topics {
    exact: HashSet<String>,
    wildcard: Vec<String>,
}

impl Topics {
    pub(crate) fn new(filters: Vec<String>) -> Topics {
        let mut topics = Topics::default();
        for f in filters {
            if topic::has_wildcard(&f) {
                if !topics.wildcard.contains(&f) {
                    topics.wildcard.push(f);
                }
            } else {
                topics.exact.insert(f);
            }
        }
        topics
    }

    fn allows(&self, name: &str) -> bool {
        self.exact.contains(name) || self.wildcard.iter().any(|f| topic::matches(f, name))
    }

    fn covers(&self, filter: &str) -> bool {
        if !topic::has_wildcard(filter) {
            return self.allows(filter);
        }
        self.wildcard.iter().any(|g| topic::covers(g, filter))
    }

    fn list(&self) -> Vec<String> {
        let mut all: Vec<String> = self.exact.iter().chain(&self.wildcard).cloned().collect();
        all.sort();
        all
    }
}

/// One granted key or pattern.
#[derive(Debug)]
pub(crate) enum KeyMatch {
    Exact(Vec<u8>),
    Glob(String, Pattern),
}

impl KeyMatch {
    pub(crate) fn glob(text: String) -> KeyMatch {
        let pattern = Pattern::compile(text.as_bytes());
        KeyMatch::Glob(text, pattern)
    }
}

/// Granted keys: exact ones in a set, patterns tried in turn.
#[derive(Debug, Default)]
pub(crate) struct Keys {
    exact: HashSet<Vec<u8>>,
    patterns: Vec<(String, Pattern)>,
}

impl Keys {
    pub(crate) fn new(grants: Vec<KeyMatch>) -> Keys {
        let mut keys = Keys::default();
        for grant in grants {
            match grant {
                KeyMatch::Exact(key) => {
                    keys.exact.insert(key);
                }
                KeyMatch::Glob(text, _) if !text.contains(['*', '?', '[']) => {
                    keys.exact.insert(text.into_bytes());
                }
                KeyMatch::Glob(text, pattern) => {
                    if !keys.patterns.iter().any(|(t, _)| *t == text) {
                        keys.patterns.push((text, pattern));
                    }
                }
            }
        }
        keys
    }

    fn allows(&self, key: &[u8]) -> bool {
        self.exact.contains(key) || self.patterns.iter().any(|(_, p)| p.is_match(key))
    }

    fn list(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .exact
            .iter()
            .map(|k| match std::str::from_utf8(k) {
                Ok(text) => format!("exact: {text}"),
                Err(_) => {
                    use base64::Engine as _;
                    format!(
                        "base64: {}",
                        base64::engine::general_purpose::STANDARD.encode(k)
                    )
                }
            })
            .chain(self.patterns.iter().map(|(t, _)| format!("glob: {t}")))
            .collect();
        all.sort();
        all
    }
}
