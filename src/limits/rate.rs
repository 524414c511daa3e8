//! `rate` and `gap`: GCRA, the token bucket seen as a meter (DESIGN §2.1).
//!
//! The emission interval T = per / rate is a rational number of nanoseconds. To keep
//! it exact, time is measured here in *scaled units* of 1/q ns, where T = p/q is
//! `per/rate` in lowest terms: then T is the integer p, every product is an integer,
//! and a rate of 3 per second admits exactly 3 per second forever. For the common
//! rates (`1000/s`, `100/m`) q is 1 and scaled units are plain nanoseconds.
//!
//! Bounds: p ≤ 2^60 (durations are at most 10 000 days), q < 2^53, so scaled times
//! (now·q < 2^117) and spans (burst·p < 2^113) fit in `u128` with room to add.

use crate::clock::Nanos;

/// A compiled `rate` (or `gap`) item: everything a decision needs, precomputed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rate {
    /// Numerator of T = p/q ns in lowest terms.
    p: u64,
    /// Denominator of T; scaled time is `ns × q`.
    q: u64,
    /// The most units that pass at once after idling.
    burst: u64,
    /// burst·T in scaled units: how far TAT may run ahead of now.
    tau: u128,
}

/// Per-key state: the theoretical arrival time (TAT), exact.
///
/// Stored as whole nanoseconds plus a remainder in 1/q ns rather than one `u128`,
/// because `u128` is 16-byte aligned and would pad every record that holds one.
/// 16 bytes. All zeros is the "empty" state: a TAT in the distant past.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RateState {
    /// floor(TAT) in ns since the epoch.
    pub tat_ns: u64,
    /// TAT − floor(TAT), in units of 1/q ns (< q).
    pub tat_rem: u64,
}

/// What a pending debit on a rate item must remember to be released exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatePending {
    /// Units debited.
    pub n: u64,
    /// TAT right after the debit, in scaled units (DESIGN §2.1 `tat_r`).
    pub tat_r: u128,
}

/// Outcome of probing a rate item, before anything is applied.
#[derive(Debug, Clone, Copy)]
pub struct RateProbe {
    pub allowed: bool,
    /// The TAT the debit would produce (scaled), whether or not it is allowed.
    new_tat: u128,
}

/// a / b, dividing in 64 bits when a fits (the usual case): a 128-bit division is
/// a library call several times slower than the hardware's 64-bit one.
fn div(a: u128, b: u64) -> u128 {
    match u64::try_from(a) {
        Ok(a) => u128::from(a / b),
        Err(_) => a / u128::from(b),
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Rate {
    /// `rate` units per `per_ns` nanoseconds with the given burst. Callers
    /// (the definition validator) guarantee 1 ≤ rate, burst < 2^53 and
    /// 1 ≤ per_ns ≤ 10 000 days.
    pub fn new(rate: u64, per_ns: Nanos, burst: u64) -> Self {
        let g = gcd(per_ns, rate);
        let (p, q) = (per_ns / g, rate / g);
        Rate {
            p,
            q,
            burst,
            tau: u128::from(burst) * u128::from(p),
        }
    }

    /// Whether T is a whole number of ns (q = 1, as for `1000/s` or `100/h`):
    /// every TAT is then whole ns and [`RateState::tat_rem`] stays 0, so a
    /// record may keep `tat_ns` alone (8 bytes instead of 16).
    pub fn whole_ns(&self) -> bool {
        self.q == 1
    }

    /// The item's `limit` figure: its burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Time to refill the whole burst, burst·T, in ns rounded up (the `w` of the
    /// `RateLimit-Policy` header).
    pub fn refill_ns(&self) -> Nanos {
        self.unscale_ceil(self.tau)
    }

    fn scale(&self, ns: Nanos) -> u128 {
        u128::from(ns) * u128::from(self.q)
    }

    /// Scaled units to ns, rounded up, saturating.
    fn unscale_ceil(&self, s: u128) -> Nanos {
        let ns = if self.q == 1 {
            s
        } else {
            s.div_ceil(u128::from(self.q))
        };
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn tat(&self, st: &RateState) -> u128 {
        self.scale(st.tat_ns) + u128::from(st.tat_rem)
    }

    fn set_tat(&self, st: &mut RateState, tat: u128) {
        if self.q == 1 {
            // Whole nanoseconds: no division (the common case, e.g. 1000/s).
            st.tat_ns = u64::try_from(tat).unwrap_or(u64::MAX);
            st.tat_rem = 0;
            return;
        }
        let q = u128::from(self.q);
        // Saturate instead of wrapping: a TAT past the year 2554 can only come from
        // absurd commits, and saturating keeps such a key denied rather than free.
        let ns = u64::try_from(tat / q).unwrap_or(u64::MAX);
        st.tat_ns = ns;
        st.tat_rem = if ns == u64::MAX { 0 } else { (tat % q) as u64 };
    }

    /// Decides whether `n` units fit at `now`, changing nothing.
    pub fn probe(&self, st: &RateState, now: Nanos, n: u64) -> RateProbe {
        let now_s = self.scale(now);
        let base = self.tat(st).max(now_s);
        let new_tat = base + u128::from(n) * u128::from(self.p);
        RateProbe {
            allowed: new_tat - now_s <= self.tau,
            new_tat,
        }
    }

    /// `retry_after` of a denied probe: the earliest time the same request could
    /// pass, or `None` if it never can (n > burst).
    pub fn retry_after(&self, probe: &RateProbe, now: Nanos, n: u64) -> Option<Nanos> {
        if n > self.burst {
            return None;
        }
        let wait = probe.new_tat.saturating_sub(self.tau + self.scale(now));
        Some(self.unscale_ceil(wait))
    }

    /// Applies a probed debit (allowed, or delayed to its future slot) and returns
    /// what a later release needs.
    pub fn apply(&self, st: &mut RateState, probe: &RateProbe, n: u64) -> RatePending {
        self.set_tat(st, probe.new_tat);
        RatePending {
            n,
            tat_r: probe.new_tat,
        }
    }

    /// `remaining` and `reset_after` for the state as it is at `now`.
    pub fn figures(&self, st: &RateState, now: Nanos) -> (u64, Nanos) {
        let now_s = self.scale(now);
        let tat = self.tat(st).max(now_s);
        let ahead = tat - now_s;
        let remaining = if ahead >= self.tau {
            0
        } else {
            // < burst, so it fits in u64.
            div(self.tau - ahead, self.p) as u64
        };
        (remaining, self.unscale_ceil(ahead))
    }

    /// Undoes a pending debit of `n` units as of `now` (DESIGN §2.1): refund only
    /// the part of the debit that time has not already paid back, and never leave
    /// the TAT before now, so a release never creates capacity the reservation did
    /// not take.
    pub fn release(&self, st: &mut RateState, pending: &RatePending, n: u64, now: Nanos) {
        let now_s = self.scale(now);
        let unpaid = pending.tat_r.saturating_sub(now_s);
        let d = (u128::from(n) * u128::from(self.p)).min(unpaid);
        let tat = self.tat(st).saturating_sub(d).max(now_s);
        self.set_tat(st, tat);
    }

    /// Charges `extra` more units than were reserved (a commit with a higher final
    /// cost): the impression happened, so TAT advances from max(TAT, now) even past
    /// the burst.
    pub fn charge_extra(&self, st: &mut RateState, extra: u64, now: Nanos) {
        let base = self.tat(st).max(self.scale(now));
        self.set_tat(st, base + u128::from(extra) * u128::from(self.p));
    }

    /// The first instant at which this state is back to full capacity.
    pub fn idle_at(&self, st: &RateState) -> Nanos {
        self.unscale_ceil(self.tat(st))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;

    #[test]
    fn three_per_second_is_exact() {
        let r = Rate::new(3, SECOND, 3);
        assert_eq!((r.p, r.q), (1_000_000_000, 3));
        let mut st = RateState::default();
        let t0 = 1_000 * SECOND;
        // Over 1000 seconds at the maximal admissible pace, exactly 3 + 3000 pass.
        let mut admitted = 0u64;
        // Poll every 1/7 s: no poll lands on 1/3 s boundaries except whole seconds.
        let step = SECOND / 7;
        let mut now = t0;
        while now <= t0 + 1_000 * SECOND {
            loop {
                let p = r.probe(&st, now, 1);
                if !p.allowed {
                    break;
                }
                r.apply(&mut st, &p, 1);
                admitted += 1;
            }
            now += step;
        }
        // 7 polls per second: the last poll is at t0 + 7000 steps = t0 + 999.999...s.
        let last = t0 + 7_000 * step;
        let elapsed_thirds = (u128::from(last - t0) * 3 / u128::from(SECOND)) as u64;
        assert_eq!(admitted, 3 + elapsed_thirds);
    }

    #[test]
    fn release_never_gives_back_what_time_already_paid() {
        let r = Rate::new(1, SECOND, 5);
        let mut st = RateState::default();
        let now = 100 * SECOND;
        let p = r.probe(&st, now, 2);
        let pend = r.apply(&mut st, &p, 2);
        assert_eq!(r.figures(&st, now).0, 3);
        // 1.5 s later one unit came back by time; releasing refunds only the rest.
        let later = now + 3 * SECOND / 2;
        r.release(&mut st, &pend, 2, later);
        assert_eq!(r.figures(&st, later), (5, 0));
    }
}
