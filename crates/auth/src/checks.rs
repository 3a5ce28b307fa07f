//! Where credentials are checked: password hashes (PBKDF2, 10,000 rounds by default)
//! and token signatures run on tokio's blocking pool, which grows to 512 threads.
//! Unbounded, a burst of CONNECTs with passwords (one address may open thousands
//! before `connect_rate_per_address` applies) would put hundreds of hashing threads
//! beside the few that serve every connection, and starve them. So at most one
//! check per core runs at once; the others wait their turn (each CONNECT still within
//! its deadline, the pending-connection limits bounding how many wait), and open
//! connections keep their share of the CPU.

use std::sync::OnceLock;

use tokio::sync::Semaphore;

/// A bound on credential checks running at once.
#[derive(Debug)]
pub struct Checks {
    running: Semaphore,
}

impl Checks {
    /// At most `n` checks at once (at least one).
    pub fn new(n: usize) -> Checks {
        Checks {
            running: Semaphore::new(n.max(1)),
        }
    }

    /// The process's bound: one check per core.
    pub fn shared() -> &'static Checks {
        static SHARED: OnceLock<Checks> = OnceLock::new();
        SHARED.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Checks::new(cores)
        })
    }

    /// Runs `check` on a blocking thread once a slot is free; `None` if it panicked.
    pub async fn run<T: Send + 'static>(
        &self,
        check: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let _slot = self.running.acquire().await.ok()?;
        tokio::task::spawn_blocking(check).await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_checks_run_at_once_than_the_bound() {
        let checks = Arc::new(Checks::new(2));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (checks, running, most) = (checks.clone(), running.clone(), most.clone());
                tokio::spawn(async move {
                    checks
                        .run(move || {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            // Long enough for unbounded checks to overlap.
                            std::thread::sleep(Duration::from_millis(50));
                            running.fetch_sub(1, Ordering::SeqCst);
                        })
                        .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Some(()));
        }
        let most = most.load(Ordering::SeqCst);
        assert!((1..=2).contains(&most), "{most} checks ran at once");
    }
}
