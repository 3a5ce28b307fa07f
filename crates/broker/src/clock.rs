//! The broker's clock: what "now" is for message expiry, and when keep-alive, will
//! delay and session expiry timers fire.
//!
//! [`Clock::system`] is tokio's time and costs nothing over it. A [`ManualClock`] runs
//! with real time and can be moved ahead by hand, so a test of a 60 s session expiry
//! advances it 61 s instead of sleeping. It keeps running with real time (rather than
//! standing still) so that everything the test does not move, sockets and the timeouts
//! of the test's own waits, behaves as usual; its timers are tokio timers on the real
//! deadline that rearm whenever the clock is moved.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::time::Sleep;

/// The broker's time. Cheap to clone; the default is the system clock.
#[derive(Debug, Clone, Default)]
pub struct Clock(Option<Arc<watch::Sender<Duration>>>);

/// A clock a test moves ahead by hand (see the module docs); [`ManualClock::clock`]
/// is what the broker is given.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<watch::Sender<Duration>>);

impl Clock {
    /// The system's time.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// Now, on this clock.
    pub fn now(&self) -> Instant {
        Instant::now() + self.offset()
    }

    fn offset(&self) -> Duration {
        self.0.as_ref().map_or(Duration::ZERO, |tx| *tx.borrow())
    }

    /// Resolves once this clock reaches `deadline`.
    pub async fn sleep_until(&self, deadline: Instant) {
        Timer::new(self.clone(), deadline).await;
    }

    /// Resolves once `duration` has passed on this clock.
    pub async fn sleep(&self, duration: Duration) {
        self.sleep_until(self.now() + duration).await;
    }
}

impl ManualClock {
    /// A clock at real time until it is moved.
    pub fn new() -> ManualClock {
        ManualClock(Arc::new(watch::Sender::new(Duration::ZERO)))
    }

    /// The clock to give the broker.
    pub fn clock(&self) -> Clock {
        Clock(Some(self.0.clone()))
    }

    /// Moves the clock ahead by `by`: timers whose deadline it passes fire.
    pub fn advance(&self, by: Duration) {
        self.0.send_modify(|offset| *offset += by);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

/// A timer on a [`Clock`], to poll from a `select!` loop and move with
/// [`Timer::reset`] (as tokio's `Sleep`, which it is on the system clock).
pub(crate) struct Timer {
    clock: Clock,
    deadline: Instant,
    sleep: Pin<Box<Sleep>>,
    /// On a manual clock: resolves when the clock is moved.
    moved: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer")
            .field("clock", &self.clock)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl Timer {
    pub fn new(clock: Clock, deadline: Instant) -> Timer {
        let sleep = Box::pin(tokio::time::sleep_until(deadline.into()));
        let mut timer = Timer {
            clock,
            deadline,
            sleep,
            moved: None,
        };
        timer.arm();
        timer
    }

    /// When it fires.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Fires at `deadline` instead.
    pub fn reset(&mut self, deadline: Instant) {
        self.deadline = deadline;
        self.arm();
    }

    /// Sets the tokio timer to the real time at which this clock reaches the deadline
    /// and, on a manual clock, watches for the next move (read first, so a move made
    /// after the offset is read is never missed).
    fn arm(&mut self) {
        let Some(tx) = &self.clock.0 else {
            self.sleep.as_mut().reset(self.deadline.into());
            return;
        };
        let mut rx = tx.subscribe();
        let offset = *rx.borrow_and_update();
        let real = self
            .deadline
            .checked_sub(offset)
            .unwrap_or_else(Instant::now);
        self.sleep.as_mut().reset(real.into());
        self.moved = Some(Box::pin(async move {
            // An error: the clock is gone, and it can no longer move.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }));
    }

    /// Ready once the clock reaches the deadline.
    pub fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while let Some(moved) = &mut self.moved {
            if moved.as_mut().poll(cx).is_pending() {
                break;
            }
            self.arm();
        }
        self.sleep.as_mut().poll(cx)
    }
}

impl Future for Timer {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().poll_elapsed(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_fires_timers_it_is_moved_past() {
        let manual = ManualClock::new();
        let clock = manual.clock();
        let start = clock.now();
        let timer = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep(Duration::from_secs(3600)).await }
        });
        tokio::task::yield_now().await;
        manual.advance(Duration::from_secs(1800));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!timer.is_finished(), "half way: still waiting");
        manual.advance(Duration::from_secs(1800));
        tokio::time::timeout(Duration::from_secs(5), timer)
            .await
            .expect("the hour passed on the clock")
            .unwrap();
        assert!(clock.now() >= start + Duration::from_secs(3600));
    }

    #[tokio::test]
    async fn the_system_clock_is_real_time() {
        let clock = Clock::system();
        let before = Instant::now();
        clock.sleep(Duration::from_millis(20)).await;
        assert!(before.elapsed() >= Duration::from_millis(20));
        assert!(clock.now() >= before + Duration::from_millis(20));
    }
}
