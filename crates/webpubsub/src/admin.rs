//! What an operator's dashboard reads and does through the service object (not the
//! REST API, which needs a token per hub): the hubs, a page of one hub's groups and
//! connections, and a text message to a group.

use std::sync::PoisonError;

use crate::hub::admin::{Selection, Target};
use crate::hub::view::smallest;
pub use crate::hub::view::{ConnectionSummary, GroupSummary, HubView, ViewFrom};
use crate::protocol::Payload;
use crate::WebPubSub;

/// A hub and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSummary {
    pub name: String,
    pub connections: usize,
}

impl WebPubSub {
    /// At most `limit` hubs (the first by name after `after`) with their connection
    /// counts, and how many hubs there are. A hub exists once a client or the REST API
    /// used it.
    pub fn hubs(&self, after: Option<&str>, limit: usize) -> (Vec<HubSummary>, usize) {
        let (names, total, hubs) = {
            let hubs = self
                .inner
                .hubs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let names = smallest(hubs.keys(), after, limit);
            let picked: Vec<_> = names.iter().filter_map(|n| hubs.get(n).cloned()).collect();
            (names, hubs.len(), picked)
        };
        let summaries = names
            .into_iter()
            .zip(hubs)
            .map(|(name, hub)| HubSummary {
                name,
                connections: hub.session_count(),
            })
            .collect();
        (summaries, total)
    }

    /// A page of the hub's groups and connections (see [`HubView`]); `None` if no
    /// such hub exists (looking does not create it).
    pub fn hub_view(&self, name: &str, from: ViewFrom<'_>, limit: usize) -> Option<HubView> {
        self.existing_hub(name).map(|hub| hub.view(from, limit))
    }

    /// Sends `text` to the members of `group` of `hub`, as the REST API's group send
    /// with `text/plain` does; returns how many connections it reached (0 when the hub
    /// does not exist).
    pub fn send_text_to_group(&self, hub: &str, group: &str, text: String) -> usize {
        let Some(hub) = self.existing_hub(hub) else {
            return 0;
        };
        hub.send(
            Target::Group(group),
            &Selection::default(),
            &Payload::Text(text),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::{Config, ViewFrom, WebPubSub};

    #[test]
    fn hubs_are_listed_by_name_up_to_the_limit_and_never_created_by_looking() {
        let wps = WebPubSub::new(Config::default());
        for name in ["Zeta", "alpha", "mid"] {
            wps.hub(name);
        }
        let (hubs, total) = wps.hubs(None, 2);
        let names: Vec<_> = hubs.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["alpha", "mid"]);
        assert_eq!(total, 3);
        let (rest, _) = wps.hubs(Some("mid"), 2);
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].name, "zeta");
        let from = ViewFrom::default();
        assert!(wps.hub_view("nohub", from, 10).is_none());
        assert_eq!(wps.send_text_to_group("nohub", "g", "hi".into()), 0);
        assert_eq!(wps.hubs(None, 10).1, 3);
        assert_eq!(wps.hub_view("ZETA", from, 10).unwrap().connection_count, 0);
    }
}
