//! Pacing levers (docs/pacing.md, "Levers"): a controller a budget's state
//! keeps when its campaign asks for `pacing_levers` or its pacing is
//! `throttle`. Once a minute it compares the spend of the minute that ended
//! with that minute's target and moves two levers:
//!
//! - the **pass probability** p, as LinkedIn's pacing does (Agarwal et al.,
//!   KDD 2014): ×1.1 when spend was below target, ×0.9 above, between 0.1 %
//!   and 1; a period starts at 10 % ("slow start"). `throttle` pacing lets a
//!   request pass with probability p;
//! - the **bid multiplier** 1/(1 + μ), μ a dual variable moved by the
//!   relative error, as in Balseiro and Gur's adaptive pacing (Management
//!   Science 65(9), 2019): μ += 0.1·(spend/target − 1), between 0 and 9, so
//!   the multiplier stays within [0.1, 1].
//!
//! A minute's target is what is left of the amount times the minute's share
//! of the weighted time left to the *finish*: the period's end, or for
//! `throttle` 11/12 of the way through ("fast finish": 22:00 of a day), as
//! LinkedIn aims to finish early because forecasts err. The weighted time
//! is the budget's own: real time, or its profile's.
//!
//! Everything is a function of the stored state and the time, stepped at the
//! first write of each minute (as an adaptive plan is made at the first write
//! of its hour): spend only ever changes by a write, so all of it since the
//! last step was spent in that step's minute, and none in the minutes
//! between. Deterministic on a virtual clock, draws included.

use crate::clock::{Nanos, SECOND};

use super::{Budget, BudgetState, Pacing};

/// How often the controller steps: every minute, as LinkedIn's.
pub const STEP: Nanos = 60 * SECOND;
/// One, in millionths.
const ONE: u64 = 1_000_000;
/// The pass probability a period starts with: 10 % ("slow start").
pub const SLOW_START: u32 = 100_000;
/// The least pass probability: 0.1 %, so a throttled campaign still sees
/// some traffic and its controller can tell when to open again.
const PASS_MIN: u64 = 1_000;
/// The largest μ: a bid multiplier of 1/(1 + 9) = 0.1 at the least.
const DUAL_MAX: i64 = 9_000_000;
/// The most steps one read or write takes. Minutes in which nothing moves
/// are skipped an hour at a time, and with nothing spent both levers open
/// fully within 100 steps (×1.1 from 0.001 to 1 is 73; μ falls by 0.1 a
/// step from at most 9), so a month of hours (744) and those fit; a
/// controller with more to make up starts from where it is.
const MAX_STEPS: usize = 1_000;

/// The levers as of one instant, for a screen's answer, in millionths
/// (exact, so answers compare equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levers {
    /// The share of requests to let through: 1 000 (0.1 %) to 1 000 000.
    pub pass: u32,
    /// The factor to scale bids by: 100 000 (0.1) to 1 000 000.
    pub multiplier: u32,
}

impl Levers {
    /// The pass probability, 0.001 to 1.
    pub fn pass_probability(&self) -> f64 {
        f64::from(self.pass) / ONE as f64
    }

    /// The bid multiplier, 0.1 to 1.
    pub fn bid_multiplier(&self) -> f64 {
        f64::from(self.multiplier) / ONE as f64
    }

    /// The tighter of two: each lever's least (a chain of several budgets
    /// with levers).
    pub fn min(self, o: Levers) -> Levers {
        Levers {
            pass: self.pass.min(o.pass),
            multiplier: self.multiplier.min(o.multiplier),
        }
    }
}

/// The start of the controller's minute holding `now`, in the period that
/// starts at `start`.
pub(crate) fn step_of(start: Nanos, now: Nanos) -> Nanos {
    start + now.saturating_sub(start) / STEP * STEP
}

/// The next minute at which the controller steps, after `now`.
pub(crate) fn next_step(start: Nanos, now: Nanos) -> Nanos {
    step_of(start, now) + STEP
}

/// A 64-bit mix (splitmix64's finaliser): equal inputs give equal draws,
/// near inputs unrelated ones.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d1_049b_133d_11eb);
    x ^ (x >> 31)
}

impl Budget {
    /// Where the controller's target line reaches the whole amount.
    fn finish(&self, start: Nanos, end: Nanos) -> Nanos {
        match self.pacing {
            // Fast finish: 11/12 of the period (22:00 of a day).
            Pacing::Throttle(_) => start + (end - start) / 12 * 11,
            _ => end,
        }
    }

    /// Weighted time F(t), and F of the finish; `None` when the budget has
    /// no line (asap): every minute's target is then all that is left.
    fn weighted(&self, start: Nanos, end: Nanos) -> Option<impl Fn(Nanos) -> u128> {
        let pr = self.progress(start, end)?;
        Some(move |t: Nanos| pr.fraction(t).0)
    }

    /// Steps the controller of `cur` (the current period's state) to the
    /// minute of `now`.
    pub(super) fn step_levers(&self, cur: &mut BudgetState, now: Nanos) {
        let minute = step_of(cur.start, now);
        let fresh = cur.tick == 0 || cur.tick < cur.start;
        if !fresh && cur.tick >= minute {
            return;
        }
        let fin = self.finish(cur.start, cur.end);
        let f = self.weighted(cur.start, cur.end);
        // The target for the minute [t, t + STEP) with `base` spent at t:
        // (numerator, denominator).
        let target = |t: Nanos, base: u64| -> (u128, u128) {
            let rem = u128::from(self.amount.saturating_sub(base));
            let Some(f) = &f else { return (rem, 1) };
            if t >= fin {
                return (rem, 1);
            }
            let (a, z) = (f(t), f(fin));
            match z - a {
                0 => (rem, 1),
                left => (rem * (f((t + STEP).min(fin)) - a), left),
            }
        };
        if fresh {
            // A period's first step, or a state read back without its
            // controller (a restart): the slow start, unless spend is
            // already behind the line (a node restarted mid-period would
            // otherwise throttle a late campaign to 10 % for 25 minutes).
            let behind = now - cur.start >= STEP && {
                let line = match &f {
                    None => u128::from(self.amount),
                    Some(f) => match f(fin) {
                        0 => u128::from(self.amount),
                        z => (u128::from(self.amount) * f(now.min(fin))).div_ceil(z),
                    },
                };
                u128::from(cur.spent) < line
            };
            cur.pass = if behind { ONE as u32 } else { SLOW_START };
            cur.dual = 0;
            cur.tick = minute;
            cur.tick_spent = cur.spent;
            return;
        }
        let (mut pass, mut dual) = (u64::from(cur.pass), i64::from(cur.dual));
        let mut t = cur.tick;
        let mut base = cur.tick_spent;
        // All spend since the last step was in its minute (nothing wrote since).
        let mut z = cur.spent.saturating_sub(cur.tick_spent);
        for _ in 0..MAX_STEPS {
            if t >= minute {
                break;
            }
            let (num, den) = target(t, base);
            if z == 0 && num == 0 {
                // Nothing spent and nothing due: no lever moves. With
                // nothing left to spend none moves again (a budget spent,
                // read by every denied request till the period ends); in an
                // hour a profile weighs 0, none moves before it ends. Stepped
                // one minute at a time, such a stretch cost every read that
                // kept nothing (throttled, denied) up to a day of steps.
                if base >= self.amount {
                    break;
                }
                t = step_of(cur.start, self.hours.bounds(t).1.max(t + STEP));
                continue;
            }
            let spent = u128::from(z) * den;
            if spent < num {
                pass = (pass * 11).div_ceil(10).min(ONE);
            } else if spent > num {
                pass = (pass * 9 / 10).max(PASS_MIN);
            }
            // μ += 0.1·(spend/target − 1), the ratio in millionths and at
            // most 10 (a minute's target of nothing, overspent: 10).
            let ratio = match num {
                0 if z == 0 => ONE as i64,
                0 => 10 * ONE as i64,
                num => (spent * u128::from(ONE) / num).min(u128::from(10 * ONE)) as i64,
            };
            dual = (dual + (ratio - ONE as i64) / 10).clamp(0, DUAL_MAX);
            base = base.saturating_add(z);
            z = 0;
            t += STEP;
            // With nothing spent from here on, both levers only open:
            // once wide open, the steps left change nothing.
            if pass == ONE && dual == 0 {
                break;
            }
        }
        cur.pass = pass as u32;
        cur.dual = dual as u32;
        cur.tick = minute;
        cur.tick_spent = cur.spent;
    }

    /// The line spend is paced along at `t` in the period `[start, end)`:
    /// the cap, or for `throttle` (whose cap is the whole amount) the line
    /// its controller aims at, reaching the amount at the fast finish.
    pub fn line(&self, start: Nanos, end: Nanos, t: Nanos) -> u64 {
        if !self.throttles() {
            return self.cap(start, end, t);
        }
        let fin = self.finish(start, end);
        match self.weighted(start, end) {
            Some(f) if f(fin) > 0 => {
                let paced = (u128::from(self.amount) * f(t.min(fin))).div_ceil(f(fin));
                paced as u64
            }
            _ => self.amount,
        }
    }

    /// Whether `n` more fits at `now`: within the cap and, for `throttle`
    /// pacing, through the draw.
    pub fn allows(&self, st: &BudgetState, now: Nanos, n: u64) -> bool {
        let cur = self.current(st, now);
        self.fits_current(&cur, now, n) && (!self.throttles() || self.draw_passes(&cur, now, n))
    }

    /// Whether `n` more fits under the cap at `now`, without the draw (a
    /// shared store's node draws with the fleet's controller instead).
    pub fn fits(&self, st: &BudgetState, now: Nanos, n: u64) -> bool {
        self.fits_current(&self.current(st, now), now, n)
    }

    fn fits_current(&self, cur: &BudgetState, now: Nanos, n: u64) -> bool {
        let v = self.view_of_current(cur, now);
        v.spent.saturating_add(v.pending).saturating_add(n) <= v.cap
    }

    /// The levers of state `st` as of `now`.
    pub fn levers(&self, st: &BudgetState, now: Nanos) -> Levers {
        self.levers_of_current(&self.current(st, now))
    }

    /// The levers of a state already brought to its instant.
    pub fn levers_of_current(&self, cur: &BudgetState) -> Levers {
        let (pass, dual) = match cur.tick {
            0 => (u64::from(SLOW_START), 0),
            _ => (u64::from(cur.pass), u64::from(cur.dual)),
        };
        Levers {
            pass: pass as u32,
            // ≤ 10^6 · 10^6 / 10^6.
            multiplier: (ONE * ONE / (ONE + dual)) as u32,
        }
    }

    /// Whether a request of `n` at `now` passes `throttle` pacing's draw,
    /// with state `cur` (as of `now`): a draw below the pass probability,
    /// from a hash of the instant, the spend and pending, and `n`, so the
    /// same sequence of requests on a virtual clock is decided the same way.
    pub fn draw_passes(&self, cur: &BudgetState, now: Nanos, n: u64) -> bool {
        let key = now
            ^ cur.spent.wrapping_add(cur.pending).rotate_left(32)
            ^ cur.start.rotate_left(17)
            ^ n.rotate_left(48);
        mix(key) % ONE < u64::from(cur.pass)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::calendar::{Calendar, CalendarUnit};
    use jiff::tz::TimeZone;

    const H: Nanos = 3_600 * SECOND;
    const DAY0: Nanos = 20_000 * 24 * H;

    fn budget(amount: u64, pacing: Pacing) -> Budget {
        Budget::new(
            amount,
            Calendar::new(CalendarUnit::Day, TimeZone::UTC),
            pacing,
            0,
        )
        .with_levers()
    }

    /// Commits `n` at `now`, as the engine's immediate path does.
    fn spend(b: &Budget, st: &mut BudgetState, now: Nanos, n: u64) {
        *st = b.current(st, now);
        st.spent += n;
    }

    #[test]
    fn a_period_starts_slow_and_opens_while_behind() {
        let b = budget(14_400, Pacing::Even);
        let st = b.current(&BudgetState::default(), DAY0);
        assert_eq!(b.levers(&st, DAY0).pass, SLOW_START);
        assert_eq!(b.levers(&st, DAY0).multiplier, 1_000_000);
        // Five minutes with nothing spent: five steps up, ×1.1 each,
        // rounded up in millionths.
        let mut p = u64::from(SLOW_START);
        for _ in 0..5 {
            p = (p * 11).div_ceil(10);
        }
        assert_eq!(u64::from(b.levers(&st, DAY0 + 5 * STEP).pass), p);
        // A read keeps nothing: the state is as it was.
        assert_eq!(st.tick, DAY0);
    }

    #[test]
    fn spend_above_target_closes_both_levers() {
        // 14 400 a day is 10 a minute; 50 in the first minute is 5× over.
        let b = budget(14_400, Pacing::Even);
        let mut st = b.current(&BudgetState::default(), DAY0);
        spend(&b, &mut st, DAY0 + SECOND, 50);
        let l = b.levers(&st, DAY0 + STEP);
        assert_eq!(l.pass, SLOW_START * 9 / 10);
        // μ = 0.1·(50/10 − 1) = 0.4: a multiplier of 1/1.4.
        assert_eq!(l.multiplier, 714_285);
        // The next minute's target is 14 350 / 1 439 ≈ 9.97: 9 is below it,
        // and the pass probability rises again.
        let mut st = b.current(&st, DAY0 + STEP);
        let before = b.levers(&st, DAY0 + STEP);
        spend(&b, &mut st, DAY0 + STEP + SECOND, 9);
        let after = b.levers(&st, DAY0 + 2 * STEP);
        assert!(after.pass > before.pass, "{before:?} → {after:?}");
    }

    #[test]
    fn a_state_without_its_controller_mid_period_opens_if_behind() {
        // A restart at 12:00 with a quarter of the day's budget spent: behind
        // the even line (half), so the controller starts wide open.
        let b = budget(1000, Pacing::Even);
        let st = BudgetState {
            start: DAY0,
            end: DAY0 + 24 * H,
            spent: 250,
            ..BudgetState::default()
        };
        assert_eq!(b.levers(&st, DAY0 + 12 * H).pass, 1_000_000);
        // Ahead of it (600 of 1000 by noon): the slow start.
        let ahead = BudgetState { spent: 600, ..st };
        assert_eq!(b.levers(&ahead, DAY0 + 12 * H).pass, SLOW_START);
    }

    #[test]
    fn throttle_finishes_at_eleven_twelfths() {
        let b = budget(1000, Pacing::Throttle(None));
        assert_eq!(b.finish(DAY0, DAY0 + 24 * H), DAY0 + 22 * H);
        // Its cap is the whole amount at once.
        assert_eq!(b.view(&BudgetState::default(), DAY0).cap, 1000);
        // At 22:00 with 100 left, every minute's target is all of it.
        let mut st = b.current(&BudgetState::default(), DAY0);
        spend(&b, &mut st, DAY0 + 22 * H - 2 * STEP, 900);
        let l = b.levers(&st, DAY0 + 22 * H + 5 * STEP);
        assert!(l.pass > b.levers(&st, DAY0 + 22 * H - STEP).pass);
    }

    #[test]
    fn the_draw_is_deterministic_and_passes_its_share() {
        let b = budget(u64::MAX >> 12, Pacing::Throttle(None));
        let mut st = b.current(&BudgetState::default(), DAY0);
        st.pass = 300_000;
        let mut passed = 0u32;
        for i in 0..100_000u64 {
            let now = DAY0 + i * 7_919;
            let a = b.draw_passes(&st, now, 1);
            assert_eq!(a, b.draw_passes(&st, now, 1));
            passed += u32::from(a);
        }
        // 30 % of 100 000, within 1 % of it (the draws are fixed: this
        // count is the same on every run).
        assert!((29_000..=31_000).contains(&passed), "{passed}");
        st.pass = 0;
        assert!(!b.draw_passes(&st, DAY0, 1));
    }

    #[test]
    fn hours_of_zero_weight_and_a_spent_budget_move_nothing() {
        // Traffic only from 18:00: before it every minute's target is 0,
        // and with nothing spent the levers stay at the slow start.
        let mut w = [0u64; 24];
        w[18..].fill(1000);
        let b = budget(600, Pacing::Throttle(Some(Box::new(w))));
        let st = b.current(&BudgetState::default(), DAY0);
        assert_eq!(b.levers(&st, DAY0 + 17 * H).pass, SLOW_START);
        // From 18:00 the targets are positive: nothing spent, they open.
        assert!(b.levers(&st, DAY0 + 18 * H + 5 * STEP).pass > SLOW_START);
        // All spent by 19:00: the levers stay as that minute left them.
        let mut st = b.current(&st, DAY0 + 18 * H + 30 * STEP);
        spend(&b, &mut st, DAY0 + 18 * H + 30 * STEP, 600);
        let after = b.levers(&st, DAY0 + 18 * H + 31 * STEP);
        assert_eq!(b.levers(&st, DAY0 + 23 * H), after);
    }

    #[test]
    fn a_quiet_stretch_is_stepped_in_bounded_work() {
        // A month's budget idle for three weeks: the steps stop once both
        // levers are wide open.
        let b = Budget::new(
            1_000_000,
            Calendar::new(CalendarUnit::Month, TimeZone::UTC),
            Pacing::Throttle(None),
            0,
        );
        let start = b.calendar.bounds(DAY0).0;
        let st = b.current(&BudgetState::default(), start);
        let l = b.levers(&st, start + 21 * 24 * H);
        assert_eq!((l.pass, l.multiplier), (1_000_000, 1_000_000));
    }
}
