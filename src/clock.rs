//! Time as the engine sees it: nanoseconds since the Unix epoch, never going backwards.
//!
//! Limit algorithms never read a clock themselves; they take `now` as an argument
//! (DESIGN §6: "the clock is injected"). A [`Clock`] is what the edges (the keyed
//! limiter, later the engine and the HTTP service) use to produce that argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Nanoseconds since the Unix epoch. `u64` reaches the year 2554, and every limit
/// computes with it exactly.
pub type Nanos = u64;

/// One millisecond in nanoseconds.
pub const MS: Nanos = 1_000_000;
/// One second in nanoseconds.
pub const SECOND: Nanos = 1_000_000_000;

/// A source of the current time.
///
/// Implementations must be monotone: two calls on the same clock never return a
/// smaller value the second time. Limit state depends on this (a GCRA theoretical
/// arrival time compared with an earlier `now` would refund capacity that was
/// never earned).
pub trait Clock: Send + Sync {
    /// The current time in nanoseconds since the Unix epoch.
    fn now(&self) -> Nanos;
}

/// Wall-clock time that never goes backwards: `max(last seen, wall clock)`.
///
/// The wall clock can step back (NTP corrections, a VM resumed from a snapshot);
/// DESIGN §2 requires the engine's clock to hold still instead. The last value
/// handed out lives in an atomic, so the clock is shared by all threads without a
/// lock, and one `fetch_max` both records and clamps.
#[derive(Debug, Default)]
pub struct SystemClock {
    /// The largest time this clock has returned so far.
    last: AtomicU64,
}

impl SystemClock {
    /// A clock that starts at the current wall-clock time.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        // A system clock set before 1970 is treated as the epoch; saturating keeps
        // this path free of panics.
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        // Relaxed is enough: the value is a single counter with no other data
        // published through it, and fetch_max is atomic on its own.
        let prev = self.last.fetch_max(wall, Ordering::Relaxed);
        prev.max(wall)
    }
}

/// A clock that moves only when told to: for tests, replay and simulation.
///
/// Setting it to an earlier time is ignored, so it keeps the same guarantee as
/// [`SystemClock`].
#[derive(Debug, Default)]
pub struct ManualClock {
    /// The current time.
    now: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Nanos) -> Self {
        Self {
            now: AtomicU64::new(start),
        }
    }

    /// Moves the clock to `t`, or leaves it where it is if `t` is earlier.
    /// Returns the time the clock now shows.
    pub fn set(&self, t: Nanos) -> Nanos {
        let prev = self.now.fetch_max(t, Ordering::Relaxed);
        prev.max(t)
    }

    /// Moves the clock forward by `d` (saturating at the end of `u64`).
    pub fn advance(&self, d: Nanos) -> Nanos {
        let mut cur = self.now.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_add(d);
            match self
                .now
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(actual) => cur = actual,
            }
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::Relaxed)
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// Converts nanoseconds to whole milliseconds, rounding up, as every reported
/// `*_ms` figure is (DESIGN §2.6), saturating at 2^53 − 1 so it stays exact in JSON.
pub fn ceil_ms(ns: Nanos) -> u64 {
    ns.div_ceil(MS).min(MAX_REPORTED)
}

/// Converts nanoseconds to whole seconds, rounding up (for `Retry-After` and the
/// `RateLimit` header fields).
pub fn ceil_secs(ns: Nanos) -> u64 {
    ns.div_ceil(SECOND).min(MAX_REPORTED)
}

/// The largest figure freqcap reports: 2^53 − 1, the largest integer a JSON reader
/// holding numbers as doubles represents exactly.
pub const MAX_REPORTED: u64 = (1 << 53) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_never_goes_back() {
        let c = ManualClock::new(100);
        assert_eq!(c.set(50), 100);
        assert_eq!(c.now(), 100);
        assert_eq!(c.advance(5), 105);
        assert_eq!(c.set(200), 200);
    }

    #[test]
    fn system_clock_is_monotone_and_near_wall_time() {
        let c = SystemClock::new();
        let a = c.now();
        let b = c.now();
        assert!(b >= a);
        // Later than 2020-01-01: the clock reads real time, not zero.
        assert!(a > 1_577_836_800 * SECOND);
    }

    #[test]
    fn rounding_up_to_reported_units() {
        assert_eq!(ceil_ms(0), 0);
        assert_eq!(ceil_ms(1), 1);
        assert_eq!(ceil_ms(MS), 1);
        assert_eq!(ceil_ms(MS + 1), 2);
        assert_eq!(ceil_secs(1), 1);
        assert_eq!(ceil_ms(u64::MAX), 18_446_744_073_710);
    }
}
