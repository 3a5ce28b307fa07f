//! One cross-thread wake-up per runtime thread and commit, however many tasks wait.
//!
//! The committer completes a whole group of tickets at once. If every waiting task were
//! registered with the committer's own `Notify`, completing a group of 64 would wake 64
//! tasks from the committer thread, and each such wake-up of a task on a tokio runtime
//! thread writes to that runtime's eventfd; on a shared core each write can also switch
//! to the woken runtime thread and back. Measured on the durable state store benchmark
//! (64 clients, `--sync always`, one core): dozens of eventfd writes after every fsync.
//!
//! So waiters register with a relay of their own thread instead: one task per
//! (store, thread) that waits on the committer's `Notify` and, woken, wakes the local
//! waiters from inside their runtime (a plain local schedule). The committer then wakes
//! one task per thread that has waiters.
//!
//! No wake-up is lost: the relay registers for the next progress *before* it wakes the
//! local waiters, and a waiter registers with the relay before it checks progress. A
//! change published while the relay was between two registrations happened before the
//! relay woke the local waiters, who re-check and see it.
//!
//! A relay ends when the store's committer has stopped (closed or failed) or its store is
//! gone; outside a tokio runtime, waiters wait on the committer's `Notify` directly.

use std::cell::RefCell;
use std::pin::pin;
use std::sync::{Arc, Weak};

use tokio::sync::Notify;

use crate::shared::Shared;

thread_local! {
    /// This thread's relays, by store.
    static RELAYS: RefCell<Vec<(Weak<Shared>, Arc<Notify>)>> = const { RefCell::new(Vec::new()) };
}

/// The `Notify` the calling task waits on for `shared`'s progress: this thread's relay,
/// started on first use. `None` outside a tokio runtime.
pub(crate) fn local(shared: &Arc<Shared>) -> Option<Arc<Notify>> {
    RELAYS.with(|relays| {
        let mut relays = relays.borrow_mut();
        // Every durable request's wait comes here: finding the relay is the fast path.
        if let Some((_, notify)) = relays.iter().find(|(store, notify)| {
            store.as_ptr() == Arc::as_ptr(shared) && Arc::strong_count(notify) > 1
        }) {
            return Some(notify.clone());
        }
        let handle = tokio::runtime::Handle::try_current().ok()?;
        relays.retain(|(store, notify)| store.strong_count() > 0 && Arc::strong_count(notify) > 1);
        let notify = Arc::new(Notify::new());
        relays.push((Arc::downgrade(shared), notify.clone()));
        handle.spawn(relay(Arc::downgrade(shared), notify.clone()));
        Some(notify)
    })
}

/// The relay task: forwards every progress of the store to this thread's waiters.
async fn relay(store: Weak<Shared>, waiters: Arc<Notify>) {
    loop {
        let Some(shared) = store.upgrade() else {
            waiters.notify_waiters();
            return;
        };
        let mut progress = pin!(shared.progress().notified());
        progress.as_mut().enable();
        waiters.notify_waiters();
        if shared.stopped() {
            return;
        }
        progress.await;
    }
}
