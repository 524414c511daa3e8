//! Time as the engine sees it: nanoseconds since the Unix epoch, never going backwards.
//!
//! Limit algorithms never read a clock themselves; they take `now` as an argument
//! (docs/semantics.md §1.1: the clock is injected). A [`Clock`] is what the edges (the keyed
//! limiter, later the engine and the HTTP service) use to produce that argument.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::MAX_EXACT;

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

/// Wall-clock time that never goes backwards.
///
/// Reading the wall clock and clamping it with a shared `max(last seen, wall)`
/// atomic would make every decision on every thread write one cache line. Instead
/// this clock is the wall time at a sync point plus the monotonic time elapsed
/// since (`CLOCK_MONOTONIC`, which NTP slews at the same rate as the wall clock,
/// so the two stay together): monotone by construction, and a read writes nothing.
/// Every [`RESYNC`] of monotonic time one reader compares with the wall clock
/// again and moves the offset *forward* if the wall clock has stepped ahead (a VM
/// resumed, a manual correction). If the wall clock steps back, the offset stays:
/// time keeps running at its real pace instead of jumping back — the engine never
/// sees time go backwards (docs/semantics.md §1.1).
#[derive(Debug)]
pub struct SystemClock {
    /// Wall time minus monotonic time, in ns, as last synced. Only grows.
    offset: AtomicU64,
    /// Monotonic time at the last sync with the wall clock.
    synced: AtomicU64,
}

#[cfg(target_arch = "x86_64")]
mod tsc;

/// The process's TSC mapping, if the CPU's counter is invariant (see [`tsc`]).
#[cfg(target_arch = "x86_64")]
static TSC: std::sync::OnceLock<Option<tsc::Tsc>> = std::sync::OnceLock::new();

/// `CLOCK_MONOTONIC` in ns: from the CPU's counter where it is invariant
/// ([`tsc`]: 9.5 ns a read where the vDSO takes 23.2), else from the kernel.
/// Read directly rather than through `std::time::Instant`, whose `Duration`
/// arithmetic costs as much again as the read itself on the decision path.
#[inline]
fn monotonic_now() -> Nanos {
    #[cfg(target_arch = "x86_64")]
    if let Some(t) = TSC.get_or_init(tsc::Tsc::detect) {
        return t.now();
    }
    kernel_monotonic()
}

/// `CLOCK_MONOTONIC` from the kernel (the vDSO).
fn kernel_monotonic() -> Nanos {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is supported on
    // every Linux, so the call cannot fail (and on failure `ts` stays zero).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Measures the counter's rate again, for [`monotonic_now`] to follow the
/// kernel's clock (which NTP slews).
fn recalibrate() {
    #[cfg(target_arch = "x86_64")]
    if let Some(Some(t)) = TSC.get() {
        t.recalibrate();
    }
}

/// How often [`SystemClock`] re-reads the wall clock to follow forward steps.
pub const RESYNC: Nanos = 250 * MS;

fn wall_now() -> Nanos {
    // A system clock set before 1970 reads as the epoch; saturating keeps this
    // path free of panics.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl SystemClock {
    /// A clock that starts at the current wall-clock time.
    pub fn new() -> Self {
        let mono = monotonic_now();
        SystemClock {
            offset: AtomicU64::new(wall_now().saturating_sub(mono)),
            synced: AtomicU64::new(mono),
        }
    }

    #[cold]
    fn resync(&self, mono: Nanos) -> Nanos {
        self.synced.store(mono, Ordering::Relaxed);
        recalibrate();
        let wanted = wall_now().saturating_sub(mono);
        // Relaxed: the offset is one value read on its own; fetch_max keeps it
        // from ever decreasing even when two threads resync at once.
        let offset = self.offset.fetch_max(wanted, Ordering::Relaxed).max(wanted);
        offset.saturating_add(mono)
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Nanos {
        let mono = monotonic_now();
        if mono.saturating_sub(self.synced.load(Ordering::Relaxed)) >= RESYNC {
            return self.resync(mono);
        }
        self.offset.load(Ordering::Relaxed).saturating_add(mono)
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

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> Nanos {
        (**self).now()
    }
}

/// A reported duration in nanoseconds (`reset_after`, `retry_after`): wider
/// than [`Nanos`], because a rate item's burst·T reaches 2^113 ns (a burst of
/// 2^53 − 1 at one per 10 000 days), and such figures must stay exact up to
/// the 2^53 − 1 ms they are reported with.
pub type Span = u128;

/// Converts nanoseconds to whole milliseconds, rounding up, as every reported
/// `*_ms` figure is (docs/semantics.md §1.5), saturating at 2^53 − 1 so it stays exact in JSON.
pub fn ceil_ms(ns: impl Into<Span>) -> u64 {
    let ms = ns.into().div_ceil(Span::from(MS));
    u64::try_from(ms).unwrap_or(u64::MAX).min(MAX_EXACT)
}

/// Converts nanoseconds to whole seconds, rounding up (for `Retry-After` and the
/// `RateLimit` header fields), saturating as [`ceil_ms`] does.
pub fn ceil_secs(ns: impl Into<Span>) -> u64 {
    let s = ns.into().div_ceil(Span::from(SECOND));
    u64::try_from(s).unwrap_or(u64::MAX).min(MAX_EXACT)
}

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
        let mut last = c.now();
        // Across several resyncs: never back, and within a second of the wall clock.
        let until = std::time::Instant::now() + std::time::Duration::from_millis(600);
        while std::time::Instant::now() < until {
            let t = c.now();
            assert!(t >= last);
            last = t;
        }
        let wall = wall_now();
        assert!(last.abs_diff(wall) < SECOND, "clock {last} vs wall {wall}");
    }

    #[test]
    fn system_clock_is_monotone_across_threads() {
        let c = SystemClock::new();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut last = 0;
                    for _ in 0..200_000 {
                        let t = c.now();
                        assert!(t >= last);
                        last = t;
                    }
                });
            }
        });
    }

    #[test]
    fn rounding_up_to_reported_units() {
        assert_eq!(ceil_ms(0u64), 0);
        assert_eq!(ceil_ms(1u64), 1);
        assert_eq!(ceil_ms(MS), 1);
        assert_eq!(ceil_ms(MS + 1), 2);
        assert_eq!(ceil_secs(1u64), 1);
        assert_eq!(ceil_ms(u64::MAX), 18_446_744_073_710);
        // Past 64 bits of ns, exact up to 2^53 − 1 ms, then saturated.
        let max = Span::from(MAX_EXACT);
        assert_eq!(ceil_ms(max * Span::from(MS)), MAX_EXACT);
        assert_eq!(ceil_ms((max - 1) * Span::from(MS) + 1), MAX_EXACT);
        assert_eq!(ceil_ms((max - 1) * Span::from(MS)), MAX_EXACT - 1);
        assert_eq!(ceil_ms(max * Span::from(MS) + 1), MAX_EXACT);
        assert_eq!(ceil_ms(Span::MAX), MAX_EXACT);
        assert_eq!(ceil_secs(Span::MAX), MAX_EXACT);
    }
}
