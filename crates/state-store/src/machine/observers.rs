//! Who observes which key (KEYNOTIFY), indexed both ways so a disconnect is cheap.
//!
//! Observations are session state, not data: they are never persisted and vanish when
//! the client disconnects. Observers of a key are kept sorted so notification effects
//! come out in a deterministic order.

use std::collections::{BTreeSet, HashMap, HashSet};

use bytes::Bytes;

#[derive(Debug, Default)]
pub(super) struct Observers {
    by_key: HashMap<Bytes, BTreeSet<String>>,
    by_client: HashMap<String, HashSet<Bytes>>,
}

impl Observers {
    /// Starts (or keeps) `client` observing `key`.
    pub(super) fn add(&mut self, client: &str, key: Bytes) {
        self.by_key
            .entry(key.clone())
            .or_default()
            .insert(client.to_owned());
        self.by_client
            .entry(client.to_owned())
            .or_default()
            .insert(key);
    }

    /// Whether `client` observes `key`.
    pub(super) fn contains(&self, client: &str, key: &[u8]) -> bool {
        self.by_client
            .get(client)
            .is_some_and(|keys| keys.contains(key))
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

    /// Drops every observation of `client`.
    pub(super) fn drop_client(&mut self, client: &str) {
        for key in self.by_client.remove(client).unwrap_or_default() {
            if let Some(clients) = self.by_key.get_mut(&key) {
                clients.remove(client);
                if clients.is_empty() {
                    self.by_key.remove(&key);
                }
            }
        }
    }

    /// The observers of `key`, sorted.
    pub(super) fn of(&self, key: &[u8]) -> impl Iterator<Item = &String> {
        self.by_key.get(key).into_iter().flatten()
    }
}
