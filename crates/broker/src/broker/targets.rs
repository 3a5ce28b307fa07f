//! Who gets a copy of a routed message: the matching subscriptions merged per client
//! (overlapping subscriptions), each shared group's pick, the QoS and retain flag of
//! each copy.

use std::collections::hash_map::Entry;
use std::sync::Arc;

use foldhash::HashMap;
use smallvec::SmallVec;

use super::{Broker, Targets};
use crate::config::Overlap;
use crate::fabric::SharedPicks;
use crate::message::{Delivery, Message, SharedVia};
use crate::session_store::Gate;
use crate::trie::Matches;

impl Broker {
    /// The copy of `msg` each matching subscription gets (see [`Broker::route`]).
    pub(super) fn targets<'t>(
        &self,
        matches: &Matches<'t>,
        msg: &Arc<Message>,
        gate: Option<&Arc<Gate>>,
        picks: Option<&SharedPicks>,
    ) -> Targets<'t> {
        let mut targets: Targets<'t> = SmallVec::with_capacity(matches.plain.len());
        let recipient = msg.recipient.as_deref();
        let merge = self.inner.config.overlapping_subscriptions == Overlap::Single;
        // Where each client's delivery is, to merge its overlapping matches: looked up
        // by hash, since a broadcast topic matches thousands of clients and a scan of
        // the targets so far would make one publish quadratic in its subscribers.
        let mut index: HashMap<&'t str, usize> = HashMap::default();
        for (client, entry) in &matches.plain {
            if entry.options.no_local && msg.publisher.as_deref() == Some(*client) {
                continue;
            }
            if recipient.is_some_and(|r| r != *client) {
                continue;
            }
            let qos = msg.qos.min(entry.options.qos);
            let retain = entry.options.retain_as_published && msg.retain;
            let existing = if !merge {
                None
            } else if matches.plain.len() <= 8 {
                targets
                    .iter_mut()
                    .find(|(e, _)| e.session.client_id() == *client)
            } else {
                match index.entry(*client) {
                    Entry::Occupied(at) => targets.get_mut(*at.get()),
                    Entry::Vacant(slot) => {
                        slot.insert(targets.len());
                        None
                    }
                }
            };
            if let Some((_, d)) = existing {
                d.qos = d.qos.max(qos);
                d.retain |= retain;
                d.subscription_ids.extend(entry.identifier);
                continue;
            }
            let ids = entry.identifier.into_iter().collect();
            let d = Delivery {
                gate: gate.cloned(),
                ..Delivery::new(msg.clone(), qos, retain, ids)
            };
            targets.push((entry, d));
        }
        // A message for one recipient never goes through a shared group: a member
        // picked would as likely be another client.
        let groups = if recipient.is_some() {
            &[][..]
        } else {
            &matches.shared[..]
        };
        for group in groups {
            if picks.is_some_and(|p| !p.here(&group.filter, &group.name)) {
                continue;
            }
            // A member past its high-water mark is passed over for one with room.
            if let Some(entry) = group.pick(None) {
                let qos = msg.qos.min(entry.options.qos);
                let retain = entry.options.retain_as_published && msg.retain;
                let ids = entry.identifier.into_iter().collect();
                let d = Delivery {
                    shared: Some(SharedVia {
                        filter: group.filter.as_ref().into(),
                        group: group.name.as_ref().into(),
                    }),
                    gate: gate.cloned(),
                    ..Delivery::new(msg.clone(), qos, retain, ids)
                };
                targets.push((entry, d));
            }
        }
        targets
    }
}
