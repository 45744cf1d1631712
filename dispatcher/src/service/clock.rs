//! The service's time source, injected so that tests can move time by hand.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Time elapsed since the service started, monotonic. The service adds it to the last time its
/// journal holds, so that the dispatcher's clock continues across restarts: downtime does not
/// count against leases or heartbeats.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn elapsed(&self) -> Duration;
}

/// The real clock: [`Instant`] since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told to (tests, simulations). Starts at zero.
#[derive(Debug, Default)]
pub struct ManualClock {
    millis: AtomicU64,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `by` (whole milliseconds).
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        // fetch_update with saturation: a clock never wraps back to the past.
        let _ = self
            .millis
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                Some(now.saturating_add(ms))
            });
    }
}

impl Clock for ManualClock {
    fn elapsed(&self) -> Duration {
        Duration::from_millis(self.millis.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_forward_when_told() {
        let clock = ManualClock::new();
        assert_eq!(clock.elapsed(), Duration::ZERO);
        clock.advance(Duration::from_millis(250));
        clock.advance(Duration::from_micros(999));
        assert_eq!(clock.elapsed(), Duration::from_millis(250));
        clock.advance(Duration::MAX);
        assert_eq!(clock.elapsed(), Duration::from_millis(u64::MAX));
    }
}
