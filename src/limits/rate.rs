//! `rate` and `gap`: GCRA, the token bucket seen as a meter (docs/semantics.md §2.1).
//!
//! The emission interval T = per / rate is a rational number of nanoseconds. To keep
//! it exact, time is measured here in *scaled units* of 1/q ns, where T = p/q is
//! `per/rate` in lowest terms: then T is the integer p, every product is an integer,
//! and a rate of 3 per second admits exactly 3 per second forever. For the common
//! rates (`1000/s`, `100/m`) q is 1 and scaled units are plain nanoseconds.
//!
//! Bounds: p ≤ 2^60 (durations are at most 10 000 days), q < 2^53, so scaled times
//! (now·q < 2^117) and spans (burst·p < 2^113) fit in `u128` with room to add.
//! The TAT itself is kept exact as a scaled `u128` up to [`MAX_TAT`]: it runs far
//! past 2^64 ns (the year 2554) as soon as burst·T does, e.g. a burst of 2^53 − 1
//! at 1 per day. Only commits charging far beyond the burst take it further, and
//! there every figure is saturated already (see [`MAX_TAT`]).

use crate::clock::{Nanos, Span};

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
/// Two 64-bit words rather than one `u128`, because `u128` is 16-byte aligned
/// and would pad every record that holds one. 16 bytes, in one of two forms:
///
/// - *scaled* (every TAT this build sets): TAT·q, the TAT in 1/q ns, as a
///   127-bit integer: `lo` its low 64 bits, `hi` the rest with [`SCALED`] set.
///   It holds any TAT up to [`MAX_TAT`], far past 2^64 ns.
/// - *whole ns plus remainder* (`hi` < 2^63): floor(TAT) in ns in `lo` and the
///   rest, in 1/q ns (< q < 2^53), in `hi`. Records of format 1
///   ([`crate::store::codec`]) hold this form, which needs no q to read, and
///   so does a TAT given in ns ([`RateState::from_ns`]).
///
/// All zeros is the "empty" state: a TAT in the distant past.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RateState {
    lo: u64,
    hi: u64,
}

/// The flag of [`RateState`]'s scaled form, in `hi`. A remainder is below
/// q < 2^53, so the other form never has it.
const SCALED: u64 = 1 << 63;

/// The largest TAT kept, in scaled units: 2^127 − 1, where a [`RateState`]'s
/// scaled form ends. A TAT that far ahead (only commits charging past the burst
/// take it there) is at least (2^127 − 2^117)/2^53 ns > 2^73 ns ahead of any
/// `now`, more than the largest reported figure (2^53 − 1 ms), and the largest
/// refund a release can make (burst·T < 2^113) leaves it so: every answer is
/// the one the exact TAT would give.
pub const MAX_TAT: u128 = (1 << 127) - 1;

/// The two forms of a [`RateState`], for storing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateForm {
    /// TAT·q.
    Scaled(u128),
    /// floor(TAT) in ns and the rest in 1/q ns.
    WholeNs { ns: u64, rem: u64 },
}

impl RateState {
    /// A TAT of `ns` nanoseconds since the epoch, for any q.
    pub fn from_ns(ns: Nanos) -> Self {
        RateState { lo: ns, hi: 0 }
    }

    /// A TAT stored as whole ns plus a remainder in 1/q ns (format 1).
    pub fn from_whole_ns(ns: Nanos, rem: u64) -> Self {
        // A remainder is below 2^53; a corrupt one must not pass for the
        // other form.
        RateState {
            lo: ns,
            hi: rem & !SCALED,
        }
    }

    /// A TAT of `tat` scaled units (1/q ns), at most [`MAX_TAT`].
    pub fn from_scaled(tat: u128) -> Self {
        let tat = tat.min(MAX_TAT);
        RateState {
            lo: tat as u64,
            hi: SCALED | (tat >> 64) as u64,
        }
    }

    /// The form this state is in.
    pub fn form(&self) -> RateForm {
        if self.hi & SCALED != 0 {
            RateForm::Scaled((u128::from(self.hi & !SCALED) << 64) | u128::from(self.lo))
        } else {
            RateForm::WholeNs {
                ns: self.lo,
                rem: self.hi,
            }
        }
    }

    /// The TAT in ns of a rate whose T is whole ns (q = 1, [`Rate::whole_ns`]),
    /// saturating at `u64::MAX`.
    pub fn unit_ns(&self) -> Nanos {
        match self.form() {
            RateForm::Scaled(tat) => u64::try_from(tat).unwrap_or(u64::MAX),
            RateForm::WholeNs { ns, .. } => ns,
        }
    }
}

/// What a pending debit on a rate item must remember to be released exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RatePending {
    /// Units debited.
    pub n: u64,
    /// TAT right after the debit, in scaled units (docs/semantics.md §2.1 `tat_r`).
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

    /// The same line with another burst (a priority class's ceiling,
    /// [`super::priority`]): T is unchanged, so a TAT means the same to both.
    pub fn with_burst(&self, burst: u64) -> Rate {
        Rate {
            burst,
            tau: u128::from(burst) * u128::from(self.p),
            ..*self
        }
    }

    /// Whether T is a whole number of ns (q = 1, as for `1000/s` or `100/h`):
    /// every TAT is then whole ns, so a record may keep it in one `u64`
    /// ([`RateState::from_ns`], [`RateState::unit_ns`]; 8 bytes instead of 16)
    /// while it stays below 2^64 ns.
    pub fn whole_ns(&self) -> bool {
        self.q == 1
    }

    /// The item's `limit` figure: its burst.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The line's slope in lowest terms: `q` units every `p` ns (T = p/q).
    /// A shared store leases a campaign-scope rate as this line
    /// (`crate::engine::leases`).
    pub fn slope(&self) -> (u64, u64) {
        (self.q, self.p)
    }

    /// Time to refill the whole burst, burst·T, in ns rounded up (the `w` of the
    /// `RateLimit-Policy` header).
    pub fn refill_ns(&self) -> Span {
        self.span_ceil(self.tau)
    }

    fn scale(&self, ns: Nanos) -> u128 {
        u128::from(ns) * u128::from(self.q)
    }

    /// A scaled span in ns, rounded up: exact, the quotient is below 2^113.
    fn span_ceil(&self, s: u128) -> Span {
        if self.q == 1 {
            s
        } else {
            s.div_ceil(u128::from(self.q))
        }
    }

    fn tat(&self, st: &RateState) -> u128 {
        match st.form() {
            RateForm::Scaled(tat) => tat,
            RateForm::WholeNs { ns, rem } => self.scale(ns) + u128::from(rem),
        }
    }

    fn set_tat(&self, st: &mut RateState, tat: u128) {
        // Kept as is, no division: every TAT a decision can make is below
        // MAX_TAT, and one a commit pushes past it is clamped there (see MAX_TAT).
        *st = RateState::from_scaled(tat);
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
    pub fn retry_after(&self, probe: &RateProbe, now: Nanos, n: u64) -> Option<Span> {
        if n > self.burst {
            return None;
        }
        let wait = probe.new_tat.saturating_sub(self.tau + self.scale(now));
        Some(self.span_ceil(wait))
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
    pub fn figures(&self, st: &RateState, now: Nanos) -> (u64, Span) {
        let now_s = self.scale(now);
        let tat = self.tat(st).max(now_s);
        let ahead = tat - now_s;
        let remaining = if ahead >= self.tau {
            0
        } else {
            // < burst, so it fits in u64.
            div(self.tau - ahead, self.p) as u64
        };
        (remaining, self.span_ceil(ahead))
    }

    /// Undoes a pending debit of `n` units as of `now` (docs/semantics.md §2.1): refund only
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

    /// Gives back `n` units used earlier (a refund): the TAT goes back by
    /// their time, never before `now`, so a credit is at most a full burst.
    pub fn credit(&self, st: &mut RateState, n: u64, now: Nanos) {
        let tat = self
            .tat(st)
            .saturating_sub(u128::from(n) * u128::from(self.p))
            .max(self.scale(now));
        self.set_tat(st, tat);
    }

    /// Charges `extra` more units than were reserved (a commit with a higher final
    /// cost): the impression happened, so TAT advances from max(TAT, now) even past
    /// the burst.
    pub fn charge_extra(&self, st: &mut RateState, extra: u64, now: Nanos) {
        let base = self.tat(st).max(self.scale(now));
        self.set_tat(st, base + u128::from(extra) * u128::from(self.p));
    }

    /// The first instant at which this state is back to full capacity;
    /// `u64::MAX` (never, as far as a clock can tell) past the year 2554.
    pub fn idle_at(&self, st: &RateState) -> Nanos {
        u64::try_from(self.span_ceil(self.tat(st))).unwrap_or(u64::MAX)
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

    #[test]
    fn both_forms_of_a_state_read_the_same_tat() {
        // 3 per second: q = 3; a TAT of 10 s + ⅔ ns is 30·10^9 + 2 in 1/3 ns.
        let r = Rate::new(3, SECOND, 3);
        let tat = u128::from(30 * SECOND + 2);
        let whole = RateState::from_whole_ns((tat / 3) as u64, (tat % 3) as u64);
        let new = RateState::from_scaled(tat);
        assert_ne!(whole, new);
        assert_eq!(r.tat(&whole), tat);
        assert_eq!(r.tat(&new), tat);
        assert_eq!(new.form(), RateForm::Scaled(tat));
        let now = 10 * SECOND;
        assert_eq!(r.figures(&whole, now), r.figures(&new, now));
        // Far past 2^64 ns, exactly: 2^100 + 1 scaled units.
        let far = (1u128 << 100) + 1;
        assert_eq!(r.tat(&RateState::from_scaled(far)), far);
        assert_eq!(r.tat(&RateState::from_scaled(u128::MAX)), MAX_TAT);
        // The empty state is all zeros in either reading.
        assert_eq!(r.tat(&RateState::default()), 0);
    }
}
