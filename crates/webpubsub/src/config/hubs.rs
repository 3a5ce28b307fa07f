//! A hub's upstream settings, as the service's hub settings have them: an ordered list
//! of event handlers, each a URL template (`{hub}`, `{event}` placeholders), the user
//! events it takes (`*`, a comma-separated list, or none) and the system events it
//! takes (`connect`, `connected`, `disconnected`). The first handler that takes an
//! event gets it. `allow_anonymous` lets clients connect without an access token (the
//! `connect` handler then decides who they are).

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

/// What a path segment keeps unescaped: RFC 3986's unreserved characters.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A system event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SystemEvent {
    /// Blocking, before the WebSocket is accepted.
    Connect,
    /// After the connection is established; fire-and-forget.
    Connected,
    /// After the connection (session) ended; fire-and-forget.
    Disconnected,
}

impl SystemEvent {
    /// The event name (`ce-eventName`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Connected => "connected",
            Self::Disconnected => "disconnected",
        }
    }
}

/// Which event a handler is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// A system event.
    System(SystemEvent),
    /// A user event (`event` messages; `message` for raw clients' frames).
    User(&'a str),
}

impl Event<'_> {
    /// The event name (`ce-eventName`, `{event}`).
    pub fn name(&self) -> &str {
        match self {
            Self::System(s) => s.name(),
            Self::User(u) => u,
        }
    }
}

/// One upstream event handler.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventHandler {
    /// `http(s)://…` with optional `{hub}` and `{event}` placeholders.
    pub url_template: String,
    /// `*` for every user event, `a,b` for some, empty for none.
    pub user_event_pattern: String,
    /// The system events it takes.
    pub system_events: Vec<SystemEvent>,
}

impl EventHandler {
    /// Does this handler take `event`?
    pub fn takes(&self, event: &Event<'_>) -> bool {
        match event {
            Event::System(s) => self.system_events.contains(s),
            Event::User(name) => self
                .user_event_pattern
                .split(',')
                .map(str::trim)
                .any(|p| p == "*" || (!p.is_empty() && p == *name)),
        }
    }

    /// The URL for `event` of `hub`. Both are percent-encoded: an event name comes from
    /// a client and must not reach another path (`../admin`) or the query.
    pub fn url(&self, hub: &str, event: &Event<'_>) -> String {
        let hub = utf8_percent_encode(hub, SEGMENT).to_string();
        let event = utf8_percent_encode(event.name(), SEGMENT).to_string();
        self.url_template
            .replace("{hub}", &hub)
            .replace("{event}", &event)
    }
}

/// A hub's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HubSettings {
    /// Handlers, first match wins.
    pub event_handlers: Vec<EventHandler>,
    /// Accept clients without an access token.
    pub allow_anonymous: bool,
}

impl HubSettings {
    /// The handler of `event`, if any.
    pub fn handler(&self, event: &Event<'_>) -> Option<&EventHandler> {
        self.event_handlers.iter().find(|h| h.takes(event))
    }

    /// Does any handler take `event`?
    pub fn takes(&self, event: &Event<'_>) -> bool {
        self.handler(event).is_some()
    }

    /// URL templates must be absolute http(s) URLs.
    pub fn validate(&self) -> Result<(), String> {
        for h in &self.event_handlers {
            let t = h.url_template.to_ascii_lowercase();
            if !(t.starts_with("http://") || t.starts_with("https://")) {
                return Err(format!(
                    "url_template {:?} must start with http:// or https://",
                    h.url_template
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler(pattern: &str, system: &[SystemEvent]) -> EventHandler {
        EventHandler {
            url_template: "http://up/{hub}/{event}".into(),
            user_event_pattern: pattern.into(),
            system_events: system.to_vec(),
        }
    }

    #[test]
    fn matching_and_templates() {
        let s = HubSettings {
            event_handlers: vec![
                handler("a, b", &[SystemEvent::Connect]),
                handler("*", &[SystemEvent::Disconnected]),
            ],
            allow_anonymous: false,
        };
        let url = |e: Event<'_>| s.handler(&e).map(|h| h.url("chat", &e));
        assert_eq!(url(Event::User("b")).as_deref(), Some("http://up/chat/b"));
        assert_eq!(
            url(Event::User("zzz")).as_deref(),
            Some("http://up/chat/zzz")
        );
        assert_eq!(
            url(Event::System(SystemEvent::Connect)).as_deref(),
            Some("http://up/chat/connect")
        );
        assert_eq!(url(Event::System(SystemEvent::Connected)), None);
        assert_eq!(
            url(Event::User("../admin?x=1 y")).as_deref(),
            Some("http://up/chat/..%2Fadmin%3Fx%3D1%20y"),
            "client-chosen names stay in their path segment"
        );
        assert!(!handler("", &[]).takes(&Event::User("x")));
        assert!(!handler("a,,b", &[]).takes(&Event::User("")));
        assert!(s.validate().is_ok());
        let bad = HubSettings {
            event_handlers: vec![EventHandler {
                url_template: "ftp://x".into(),
                ..EventHandler::default()
            }],
            allow_anonymous: false,
        };
        assert!(bad.validate().is_err());
    }
}
