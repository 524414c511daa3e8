//! `CLOCK_MONOTONIC` read from the CPU's time-stamp counter.
//!
//! Reading `CLOCK_MONOTONIC` through the vDSO measured 23.2 ns a call on this
//! project's machine (AMD EPYC under KVM, `tsc` clocksource), `rdtsc` 9.5 ns:
//! on an in-process limiter's hot key, whose whole denial costs under 30 ns,
//! the clock was half of it. So where the TSC is invariant (it ticks at one
//! rate on every core, in every power state), monotonic time is computed from
//! it: ns = base_ns + (ticks − base_ticks) · mult / 2^32.
//!
//! The mapping follows `CLOCK_MONOTONIC` (which NTP slews): every time the
//! caller recalibrates ([`Tsc::recalibrate`], every 250 ms of
//! [`super::SystemClock`]), the tick rate is measured again over the interval
//! since the last calibration, and the rate of the next interval is nudged
//! to close the gap between the mapping and `CLOCK_MONOTONIC` within a
//! second, never by more than 1 000 ppm; a gap over 1 ms behind is closed at
//! once (a VM paused). The new mapping starts where the old one stands at
//! the instant it is published, so time never steps back (the pure steps:
//! [`next_calibration`], tested).
//!
//! Readers take the mapping under a seqlock (loads only) and read the counter
//! inside it with a plain `rdtsc` (9.5 ns; `rdtscp` or `lfence; rdtsc`, which
//! wait for the loads before them, measured 18.7 ns): the CPU may read the
//! counter a few ns before the mapping, and a tick before the mapping's base
//! reads as its base, so no reader sees time before a mapping it used.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use super::{Nanos, kernel_monotonic as monotonic_ns};

/// A mapping from ticks to monotonic ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Calibration {
    pub ticks: u64,
    pub ns: Nanos,
    /// ns per tick, times 2^32.
    pub mult: u64,
}

impl Calibration {
    /// The ns the mapping gives at `ticks` (its base ns before its base).
    #[inline(always)]
    pub fn at(&self, ticks: u64) -> Nanos {
        let d = u128::from(ticks.saturating_sub(self.ticks)) * u128::from(self.mult);
        self.ns
            .saturating_add(u64::try_from(d >> 32).unwrap_or(u64::MAX))
    }
}

/// How far (in ns) the mapping may be behind `CLOCK_MONOTONIC` before it
/// steps forward instead of catching up.
const STEP_AFTER: i128 = 1_000_000;
/// The gap is closed over this long (ns).
const CATCH_UP: i128 = 1_000_000_000;
/// The most the rate is nudged, in parts per million.
const MAX_NUDGE_PPM: i128 = 1_000;
/// The shortest interval a rate is measured over (ns).
const MIN_INTERVAL: Nanos = 200_000_000;

/// The next mapping, from the last true pair (`prev_ticks`, `prev_mono`),
/// the current one (`ticks`, `mono`: the counter and `CLOCK_MONOTONIC` read
/// together), and the mapping in use (`cur`). `None` if the counter did not
/// move forward (keep the mapping).
pub(crate) fn next_calibration(
    cur: Calibration,
    prev_ticks: u64,
    prev_mono: Nanos,
    ticks: u64,
    mono: Nanos,
) -> Option<Calibration> {
    let dt = ticks.checked_sub(prev_ticks).filter(|&d| d > 0)?;
    let dm = mono.checked_sub(prev_mono)?;
    // The measured rate over the interval.
    let rate = (u128::from(dm) << 32) / u128::from(dt);
    let mapped = cur.at(ticks);
    let gap = i128::from(mono) - i128::from(mapped);
    let (ns, nudge) = if gap > STEP_AFTER {
        (mono, 0)
    } else {
        let ppm = (gap * 1_000_000 / CATCH_UP).clamp(-MAX_NUDGE_PPM, MAX_NUDGE_PPM);
        (mapped, ppm)
    };
    let rate = i128::try_from(rate).ok()?;
    let mult = rate + rate * nudge / 1_000_000;
    Some(Calibration {
        ticks,
        ns,
        mult: u64::try_from(mult.max(1)).ok()?,
    })
}

/// The counter (`rdtsc`).
#[inline(always)]
fn ticks() -> u64 {
    // SAFETY: `rdtsc` has no memory effects; every x86_64 CPU has it.
    unsafe { std::arch::x86_64::_rdtsc() }
}

/// The counter and `CLOCK_MONOTONIC` read together: the clock between two
/// counter reads, paired with their midpoint.
fn pair() -> (u64, Nanos) {
    let t0 = ticks();
    let m = monotonic_ns();
    let t1 = ticks();
    (t0 + (t1.saturating_sub(t0)) / 2, m)
}

/// The process's TSC mapping (see the module documentation).
pub(crate) struct Tsc {
    seq: AtomicU64,
    ticks: AtomicU64,
    ns: AtomicU64,
    mult: AtomicU64,
    /// The last true pair, for the rate over the next interval; written by
    /// the one recalibrating (`busy`).
    prev_ticks: AtomicU64,
    prev_mono: AtomicU64,
    busy: AtomicBool,
}

impl Tsc {
    /// A mapping if the CPU's counter is invariant (CPUID 0x8000_0007, EDX
    /// bit 8) and the kernel uses it too (its clocksource is `tsc`: a VM
    /// whose counter the hypervisor does not keep steady is on another
    /// one); `None` otherwise, and monotonic time comes from the kernel.
    pub fn detect() -> Option<Tsc> {
        // CPUID is available on every x86_64 CPU.
        let leaf = std::arch::x86_64::__cpuid(0x8000_0000);
        if leaf.eax < 0x8000_0007 {
            return None;
        }
        let inv = std::arch::x86_64::__cpuid(0x8000_0007);
        if inv.edx & (1 << 8) == 0 {
            return None;
        }
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .ok()?;
        if source.trim() != "tsc" {
            return None;
        }
        // A first rate over 2 ms (25 ppm off at worst, for a read jitter of
        // 50 ns); the first recalibrations correct it.
        let (t0, m0) = pair();
        let deadline = m0 + 2_000_000;
        let mut n = 0;
        while monotonic_ns() < deadline && n < 10_000_000 {
            n += 1;
        }
        let (t1, m1) = pair();
        let dt = t1.checked_sub(t0).filter(|&d| d > 0)?;
        let mult = u64::try_from((u128::from(m1.checked_sub(m0)?) << 32) / u128::from(dt)).ok()?;
        Some(Tsc {
            seq: AtomicU64::new(0),
            ticks: AtomicU64::new(t1),
            ns: AtomicU64::new(m1),
            mult: AtomicU64::new(mult),
            prev_ticks: AtomicU64::new(t1),
            prev_mono: AtomicU64::new(m1),
            busy: AtomicBool::new(false),
        })
    }

    /// Monotonic time in ns.
    #[inline(always)]
    pub fn now(&self) -> Nanos {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            let c = Calibration {
                ticks: self.ticks.load(Ordering::Relaxed),
                ns: self.ns.load(Ordering::Relaxed),
                mult: self.mult.load(Ordering::Relaxed),
            };
            let t = ticks();
            fence(Ordering::Acquire);
            if s1 & 1 == 0 && self.seq.load(Ordering::Relaxed) == s1 {
                return c.at(t);
            }
            std::hint::spin_loop();
        }
    }

    /// Measures the rate again and publishes the next mapping; a no-op when
    /// another thread is at it.
    #[cold]
    pub fn recalibrate(&self) {
        if self.busy.swap(true, Ordering::Acquire) {
            return;
        }
        let (t, m) = pair();
        let cur = Calibration {
            ticks: self.ticks.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
            mult: self.mult.load(Ordering::Relaxed),
        };
        let prev = (
            self.prev_ticks.load(Ordering::Relaxed),
            self.prev_mono.load(Ordering::Relaxed),
        );
        // Rates measured over short intervals are noisy (50 ns of read
        // jitter over 1 ms is 50 ppm): several clocks asking at once wait.
        let due = m.saturating_sub(prev.1) >= MIN_INTERVAL;
        if let Some(next) = next_calibration(cur, prev.0, prev.1, t, m).filter(|_| due) {
            // Based where the mapping in use stands as it is replaced, so no
            // reader sees time step back (a reader of the old mapping read a
            // tick before this one).
            let now = ticks();
            let base = Calibration {
                ticks: now,
                ns: cur.at(now).max(next.at(now)),
                mult: next.mult,
            };
            let s = self.seq.load(Ordering::Relaxed);
            self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
            fence(Ordering::Release);
            self.ticks.store(base.ticks, Ordering::Relaxed);
            self.ns.store(base.ns, Ordering::Relaxed);
            self.mult.store(base.mult, Ordering::Relaxed);
            self.seq.store(s.wrapping_add(2), Ordering::Release);
            self.prev_ticks.store(t, Ordering::Relaxed);
            self.prev_mono.store(m, Ordering::Relaxed);
        }
        self.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GHZ_MULT: u64 = 1 << 32; // 1 ns a tick

    /// A counter running `ppm` fast against the monotonic clock, recalibrated
    /// every 250 ms: the mapping stays monotone and within a few µs of the
    /// clock once caught up, from a start 30 µs behind or ahead.
    fn follows(ppm: i64, start_gap: i64) -> u64 {
        let mut c = Calibration {
            ticks: 0,
            ns: (1_000_000_000i64 + start_gap) as u64,
            mult: GHZ_MULT,
        };
        let mono_at = |ticks: u64| -> u64 {
            // ticks run (1 + ppm) times as fast as ns.
            1_000_000_000 + (i128::from(ticks) * 1_000_000 / (1_000_000 + i128::from(ppm))) as u64
        };
        let (mut pt, mut pm) = (0u64, mono_at(0));
        let mut last = c.at(0);
        let mut worst_late = 0u64;
        for step in 1..=400u64 {
            let t = step * 250_000_000;
            // Monotone through the interval, at both ends of the switch.
            let before = c.at(t);
            assert!(before >= last, "step {step}");
            let m = mono_at(t);
            let next = next_calibration(c, pt, pm, t, m).unwrap();
            let after = Calibration {
                ticks: t,
                ns: next.ns.max(before),
                mult: next.mult,
            };
            assert!(after.at(t) >= before, "step {step}");
            last = after.at(t);
            c = after;
            (pt, pm) = (t, m);
            if step > 40 {
                worst_late = worst_late.max(m.abs_diff(c.at(t)));
            }
        }
        worst_late
    }

    #[test]
    fn the_mapping_follows_the_monotonic_clock() {
        for ppm in [-500, -20, 0, 20, 500] {
            for gap in [-30_000, 0, 30_000] {
                let off = follows(ppm, gap);
                assert!(off < 5_000, "ppm {ppm} gap {gap}: {off} ns off");
            }
        }
    }

    #[test]
    fn a_gap_over_a_millisecond_behind_is_closed_at_once() {
        let c = Calibration {
            ticks: 0,
            ns: 1_000,
            mult: GHZ_MULT,
        };
        let next = next_calibration(c, 0, 1_000, 1_000_000, 6_001_000).unwrap();
        assert_eq!(next.ns, 6_001_000);
        // Ahead: never back, only slower.
        let next = next_calibration(c, 0, 1_000, 1_000_000, 501_000).unwrap();
        assert_eq!(next.ns, 1_001_000);
        assert!(next.mult < GHZ_MULT / 2);
    }

    #[test]
    fn the_process_counter_reads_near_the_kernel_clock() {
        let Some(tsc) = Tsc::detect() else {
            return;
        };
        let mut last = tsc.now();
        for _ in 0..1_000 {
            let k = monotonic_ns();
            let t = tsc.now();
            assert!(t >= last);
            // 25 ppm over a few ms of a test, plus read jitter.
            assert!(t.abs_diff(k) < 200_000, "{t} vs {k}");
            last = t;
        }
        tsc.recalibrate();
        assert!(tsc.now() >= last);
    }
}
