//! The sessions a client's PUBLISH found past their high-water mark, which its
//! connection waits for (publisher back-pressure, see `connection/pressure.rs`).

use std::sync::Arc;

use smallvec::SmallVec;

use crate::session::Session;

/// The connected sessions past their high-water mark that a client's QoS 1/2 PUBLISH
/// was routed to: its connection stops reading until they drain (see
/// `connection/pressure.rs`). The publisher's own session is never one: it waits for
/// no one but the same connection, which could then not read the acknowledgements
/// that drain it.
#[derive(Debug)]
pub(crate) struct Blockers<'a> {
    own: &'a Arc<Session>,
    pub pressed: SmallVec<[Arc<Session>; 2]>,
}

impl<'a> Blockers<'a> {
    /// None yet, for a client whose session is `own`.
    pub fn new(own: &'a Arc<Session>) -> Blockers<'a> {
        Blockers {
            own,
            pressed: SmallVec::new(),
        }
    }

    /// `session` got a QoS 1/2 copy: noted if it is pressed.
    pub(super) fn note(&mut self, session: &Arc<Session>) {
        if session.is_pressed()
            && !Arc::ptr_eq(session, self.own)
            && !self.pressed.iter().any(|s| Arc::ptr_eq(s, session))
        {
            self.pressed.push(session.clone());
        }
    }
}
