//! Whether a connection may do what it asks: the built-in protections first (they hold
//! with or without rules), then the authorization rules through the connection's
//! grants (see `crate::authz`). Every refusal is counted and logged, rate-limited.

use std::sync::atomic::{AtomicU64, Ordering};

use statehub_authz::{builtin, Principal};

use super::Conn;
use crate::ratelimit::LogLimit;
use crate::service::ClientInfo;
use crate::topic;

/// The principal rules see for a connection: the one it authenticated as.
pub(super) fn principal(info: &ClientInfo) -> Principal<'_> {
    let p = &info.principal;
    Principal {
        client_id: &p.client_id,
        username: p.username.as_deref(),
        attributes: &p.attributes,
    }
}

impl Conn {
    /// Why a PUBLISH (or the will) on `topic` is refused, if it is.
    pub(super) fn publish_denied(&mut self, topic: &str) -> Option<&'static str> {
        if let Err(e) = builtin::check_publish(&self.info.client_id, topic) {
            return Some(self.denied("PUBLISH", topic, protected_text(e)));
        }
        let access = self.grants.current(&self.broker, &principal(&self.info))?;
        if access.may_publish(topic) {
            return None;
        }
        Some(self.denied("PUBLISH", topic, "no rule grants Publish on the topic"))
    }

    /// Why a SUBSCRIBE to `filter` is refused, if it is.
    pub(super) fn subscribe_denied(&mut self, filter: &str) -> Option<&'static str> {
        if let Err(e) = builtin::check_subscribe(&self.info.client_id, filter) {
            return Some(self.denied("SUBSCRIBE", filter, protected_text(e)));
        }
        let access = self.grants.current(&self.broker, &principal(&self.info))?;
        if access.may_subscribe(filter) {
            return None;
        }
        Some(self.denied(
            "SUBSCRIBE",
            filter,
            "no rule grants Subscribe on a filter that covers it",
        ))
    }

    /// Brings the grants a built-in service sees ([`ClientInfo::access`]) up to date.
    pub(super) fn refresh_service_access(&mut self) {
        let access = self.grants.current(&self.broker, &principal(&self.info));
        if !same(access, self.info.access.as_ref()) {
            self.info.access = access.cloned();
        }
    }

    /// Counts and logs one refusal; returns its reason.
    fn denied(&self, what: &'static str, topic: &str, reason: &'static str) -> &'static str {
        static LOG: LogLimit = LogLimit::per_secs(10);
        let metrics = self.broker.metrics();
        let counter: &AtomicU64 = match what {
            "PUBLISH" => &metrics.publishes_denied,
            _ => &metrics.subscriptions_denied,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if let Some(left_out) = LOG.allow() {
            tracing::info!(
                client = %self.info.client_id,
                topic = topic::for_log(topic),
                left_out,
                "{what} not authorized: {reason}"
            );
        }
        reason
    }
}

fn same<T>(a: Option<&std::sync::Arc<T>>, b: Option<&std::sync::Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

fn protected_text(e: builtin::Protected) -> &'static str {
    match e {
        builtin::Protected::DollarTopic => "only the server publishes on $ topics",
        builtin::Protected::Notification => "state store notifications come from the server only",
        builtin::Protected::OtherClient => {
            "the topic is another client's state store responses or notifications"
        }
    }
}
