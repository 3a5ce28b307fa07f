//! Who observes which key (KEYNOTIFY), indexed both ways so a disconnect is cheap.
//!
//! Observations are session state, not data: they are never persisted and vanish when
//! the client disconnects. Observers of a key are kept sorted so notification effects
//! come out in a deterministic order. Each observation remembers the engine's change
//! feed position when it began (see [`crate::Engine::observe_key`]), so that a change fed
//! later but made earlier is not news to it.

use std::collections::BTreeMap;

use bytes::Bytes;
// Keys and client ids are chosen by clients: a hasher seeded per process and per map.
use foldhash::{HashMap, HashSet};

#[derive(Debug, Default)]
pub(super) struct Observers {
    by_key: HashMap<Bytes, BTreeMap<String, u64>>,
    by_client: HashMap<String, HashSet<Bytes>>,
    /// Observations in all (pairs of client and key), for the quotas.
    count: usize,
    /// Sum of the observed keys' lengths over all observations.
    key_bytes: u64,
}

impl Observers {
    /// Starts (or keeps) `client` observing `key`, for changes fed after `since`.
    pub(super) fn add(&mut self, client: &str, key: Bytes, since: u64) {
        let len = key.len() as u64;
        let added = self
            .by_client
            .entry(client.to_owned())
            .or_default()
            .insert(key.clone());
        if added {
            self.count += 1;
            self.key_bytes += len;
            self.by_key
                .entry(key)
                .or_default()
                .insert(client.to_owned(), since);
        }
    }

    /// Observations in all.
    pub(super) fn total(&self) -> usize {
        self.count
    }

    /// Sum of the observed keys' lengths over all observations.
    pub(super) fn total_key_bytes(&self) -> u64 {
        self.key_bytes
    }

    /// Whether `client` observes `key`.
    pub(super) fn contains(&self, client: &str, key: &[u8]) -> bool {
        self.by_client
            .get(client)
            .is_some_and(|keys| keys.contains(key))
    }

    /// Whether any client observes `key`.
    pub(super) fn is_observed(&self, key: &[u8]) -> bool {
        self.by_key.contains_key(key)
    }

    /// How many keys `client` observes.
    pub(super) fn count(&self, client: &str) -> usize {
        self.by_client.get(client).map_or(0, HashSet::len)
    }

    /// Stops `client` observing `key`; `false` if it was not.
    pub(super) fn remove(&mut self, client: &str, key: &[u8]) -> bool {
        let Some(keys) = self.by_client.get_mut(client) else {
            return false;
        };
        if !keys.remove(key) {
            return false;
        }
        self.count -= 1;
        self.key_bytes -= key.len() as u64;
        if keys.is_empty() {
            self.by_client.remove(client);
        }
        if let Some(clients) = self.by_key.get_mut(key) {
            clients.remove(client);
            if clients.is_empty() {
                self.by_key.remove(key);
            }
        }
        true
    }

    /// Drops every observation of `client`; returns the keys nobody observes any more.
    pub(super) fn drop_client(&mut self, client: &str) -> Vec<Bytes> {
        let mut unobserved = Vec::new();
        for key in self.by_client.remove(client).unwrap_or_default() {
            self.count -= 1;
            self.key_bytes -= key.len() as u64;
            if let Some(clients) = self.by_key.get_mut(&key) {
                clients.remove(client);
                if clients.is_empty() {
                    self.by_key.remove(&key);
                    unobserved.push(key);
                }
            }
        }
        unobserved
    }

    /// The observers of `key`, sorted, each with the feed position it observes after.
    pub(super) fn of(&self, key: &[u8]) -> impl Iterator<Item = (&String, u64)> {
        self.by_key
            .get(key)
            .into_iter()
            .flatten()
            .map(|(client, since)| (client, *since))
    }
}
