//! `budget`: spend paced through a calendar period (DESIGN §2.3).
//!
//! cap(now) = min(amount, ceil(amount·f(now)) + allowance), where f is the share of
//! the period that has elapsed: of real time (`even`), of the traffic profile's
//! weighted time (`profile`), or 1 (`asap`). f is kept as an exact fraction
//! F(now)/F(end) of integers: F is Σ weight × nanoseconds over the local-hour
//! segments of the period. The validator caps weights at 1000.000 (10^6
//! thousandths, < 2^20) and a period is at most a month and an hour (< 2^52 ns), so
//! F < 2^72 and amount·F < 2^125 (amount < 2^53) fit in `u128`: both even and
//! profile pacing are exact to the nanosecond.

use std::sync::{Arc, RwLock};

use crate::clock::Nanos;
use crate::limits::calendar::{Calendar, CalendarUnit, local_hour};

/// How spend is allowed to progress through the period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pacing {
    /// No pacing: the whole amount is available from the period's start.
    Asap,
    /// Proportional to real time elapsed.
    Even,
    /// Proportional to a traffic profile: 24 weights, one per local hour, in
    /// thousandths (validated: each ≤ 10^6, positive sum).
    Profile(Box<[u64; 24]>),
}

/// A compiled budget item.
#[derive(Debug)]
pub struct Budget {
    pub amount: u64,
    pub calendar: Calendar,
    pub pacing: Pacing,
    /// floor(amount × tolerance in basis points / 10 000).
    pub allowance: u64,
    /// The profile of the most recently used period: computing one walks every
    /// local hour of the period through the time-zone database, so it is done once
    /// per period, not per decision. A lock, not per-decision work, because all
    /// keys of an item share the period. Poisoning is ignored: the cache only
    /// ever holds a complete table or nothing.
    profile_cache: RwLock<Option<Arc<Profile>>>,
}

impl Clone for Budget {
    fn clone(&self) -> Self {
        Budget::new(
            self.amount,
            self.calendar.clone(),
            self.pacing.clone(),
            self.allowance,
        )
    }
}

impl PartialEq for Budget {
    fn eq(&self, o: &Self) -> bool {
        (self.amount, &self.calendar, &self.pacing, self.allowance)
            == (o.amount, &o.calendar, &o.pacing, o.allowance)
    }
}

/// State of a budget: the current period and what is spent and pending in it.
/// 32 bytes, boxed in [`super::ItemState`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetState {
    pub start: Nanos,
    pub end: Nanos,
    /// Committed spend in `[start, end)`.
    pub spent: u64,
    /// Spend held by open reservations made in this period.
    pub pending: u64,
}

/// Figures of a budget at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetView {
    pub period: (Nanos, Nanos),
    pub cap: u64,
    pub spent: u64,
    pub pending: u64,
}

impl BudgetView {
    pub fn remaining(&self) -> u64 {
        self.cap.saturating_sub(self.spent + self.pending)
    }
}

/// Cumulative weighted time over a period's local-hour segments.
#[derive(Debug)]
struct Profile {
    start: Nanos,
    end: Nanos,
    /// (segment start, F at segment start, weight), ordered by start.
    segments: Vec<(Nanos, u128, u64)>,
    /// F(end).
    total: u128,
}

impl Profile {
    fn build(cal: &Calendar, weights: &[u64; 24], start: Nanos, end: Nanos) -> Profile {
        let hours = Calendar::new(CalendarUnit::Hour, cal.tz.clone());
        let mut segments = Vec::new();
        let mut f = 0u128;
        let mut t = start;
        while t < end {
            let w = weights[local_hour(&cal.tz, t)];
            let next = hours.bounds(t).1.clamp(t + 1, end);
            segments.push((t, f, w));
            f += u128::from(w) * u128::from(next - t);
            t = next;
        }
        Profile {
            start,
            end,
            segments,
            total: f,
        }
    }

    /// F(t) for t in the period.
    fn at(&self, t: Nanos) -> u128 {
        let i = self
            .segments
            .partition_point(|s| s.0 <= t)
            .saturating_sub(1);
        match self.segments.get(i) {
            Some(&(s, f, w)) => f + u128::from(w) * u128::from(t - s),
            None => 0,
        }
    }
}

impl Budget {
    pub fn new(amount: u64, calendar: Calendar, pacing: Pacing, allowance: u64) -> Self {
        Budget {
            amount,
            calendar,
            pacing,
            allowance,
            profile_cache: RwLock::new(None),
        }
    }

    /// The state as of `now`: the stored period, or a fresh one if it has ended.
    /// A `now` before the stored period counts in it (per record, time never goes
    /// back); a fresh state has `end` 0 and never matches.
    pub fn current(&self, st: &BudgetState, now: Nanos) -> BudgetState {
        if now < st.end {
            return *st;
        }
        let (start, end) = self.calendar.bounds(now);
        BudgetState {
            start,
            end,
            spent: 0,
            pending: 0,
        }
    }

    pub fn view(&self, st: &BudgetState, now: Nanos) -> BudgetView {
        let cur = self.current(st, now);
        BudgetView {
            period: (cur.start, cur.end),
            cap: self.cap(cur.start, cur.end, now),
            spent: cur.spent,
            pending: cur.pending,
        }
    }

    fn profile(&self, weights: &[u64; 24], start: Nanos, end: Nanos) -> Arc<Profile> {
        let cached = self
            .profile_cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(p) = cached.filter(|p| p.start == start && p.end == end) {
            return p;
        }
        let p = Arc::new(Profile::build(&self.calendar, weights, start, end));
        *self
            .profile_cache
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(p.clone());
        p
    }

    /// f(t) = num/den for `t` in `[start, end]`; `None` for asap (f = 1).
    /// A profile whose weights are all zero over this period (a DST day that
    /// skips the only weighted hour) falls back to even pacing.
    fn progress(&self, start: Nanos, end: Nanos) -> Option<Progress> {
        match &self.pacing {
            Pacing::Asap => None,
            Pacing::Even => Some(Progress::Even { start, end }),
            Pacing::Profile(w) => {
                let p = self.profile(w, start, end);
                if p.total == 0 {
                    Some(Progress::Even { start, end })
                } else {
                    Some(Progress::Profile(p))
                }
            }
        }
    }

    /// cap(now) for the period `[start, end)`.
    pub fn cap(&self, start: Nanos, end: Nanos, now: Nanos) -> u64 {
        let Some(pr) = self.progress(start, end) else {
            return self.amount;
        };
        let (num, den) = pr.fraction(now);
        let paced = (u128::from(self.amount) * num).div_ceil(den);
        // paced ≤ amount because num ≤ den.
        (paced as u64)
            .saturating_add(self.allowance)
            .min(self.amount)
    }

    /// The first instant in `[start, end)` at which cap reaches `need`, if any.
    fn cap_reaches(&self, start: Nanos, end: Nanos, need: u64) -> Option<Nanos> {
        if need > self.amount {
            return None;
        }
        let Some(pr) = self.progress(start, end) else {
            return Some(start);
        };
        // ceil(amount·f) ≥ k ⇔ amount·num > (k − 1)·den.
        let k = need.saturating_sub(self.allowance);
        if k == 0 {
            return Some(start);
        }
        let t = pr.first_above(u128::from(self.amount), u128::from(k - 1))?;
        (t < end).then_some(t)
    }

    /// retry_after of a denied request of `n` (DESIGN §2.3 and §2.6): when this
    /// period's cap reaches spent + pending + n; else when the next period's cap
    /// reaches n; never if n > amount.
    pub fn retry(&self, st: &BudgetState, now: Nanos, n: u64) -> Option<Nanos> {
        let cur = self.current(st, now);
        let need = cur.spent.saturating_add(cur.pending).saturating_add(n);
        if let Some(t) = self.cap_reaches(cur.start, cur.end, need) {
            return Some(t.max(now) - now);
        }
        if n > self.amount {
            return None;
        }
        let (ns, ne) = self.calendar.bounds(cur.end);
        let t = self.cap_reaches(ns, ne, n).unwrap_or(ns);
        Some(t - now)
    }

    pub fn idle_at(&self, st: &BudgetState) -> Nanos {
        if st.spent + st.pending == 0 {
            0
        } else {
            st.end
        }
    }
}

enum Progress {
    Even { start: Nanos, end: Nanos },
    Profile(Arc<Profile>),
}

impl Progress {
    fn fraction(&self, t: Nanos) -> (u128, u128) {
        match self {
            Progress::Even { start, end } => {
                let t = t.clamp(*start, *end);
                (u128::from(t - start), u128::from(end - start).max(1))
            }
            Progress::Profile(p) => (p.at(t.clamp(p.start, p.end)), p.total),
        }
    }

    /// The first instant t with amount·num(t) > m·den.
    fn first_above(&self, amount: u128, m: u128) -> Option<Nanos> {
        match self {
            Progress::Even { start, end } => {
                // amount·(t − start) > m·L ⇔ t − start ≥ floor(m·L / amount) + 1.
                let len = u128::from(end - start);
                let d = m * len / amount + 1;
                u64::try_from(u128::from(*start) + d).ok()
            }
            Progress::Profile(p) => {
                let target = m * p.total;
                // First segment whose end value exceeds the target.
                let ends = |i: usize| {
                    p.segments
                        .get(i + 1)
                        .map_or(p.total, |s: &(Nanos, u128, u64)| s.1)
                };
                let i = (0..p.segments.len()).find(|&i| amount * ends(i) > target)?;
                let (s, f, w) = p.segments[i];
                // amount·(f + w·Δ) > target ⇔ Δ ≥ floor((target − amount·f)/(amount·w)) + 1.
                let x = target - amount * f;
                let d = x / (amount * u128::from(w)) + 1;
                u64::try_from(u128::from(s) + d).ok()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SECOND;
    use jiff::tz::TimeZone;

    const H: Nanos = 3_600 * SECOND;

    fn day_budget(amount: u64, pacing: Pacing, allowance: u64) -> Budget {
        Budget::new(
            amount,
            Calendar::new(CalendarUnit::Day, TimeZone::UTC),
            pacing,
            allowance,
        )
    }

    #[test]
    fn even_cap_follows_the_line() {
        let b = day_budget(2400, Pacing::Even, 24);
        let day = 20_000 * 24 * H;
        assert_eq!(b.cap(day, day + 24 * H, day), 24);
        assert_eq!(b.cap(day, day + 24 * H, day + 1), 25);
        assert_eq!(b.cap(day, day + 24 * H, day + 6 * H), 624);
        assert_eq!(b.cap(day, day + 24 * H, day + 24 * H), 2400);
    }

    #[test]
    fn retry_is_when_the_line_reaches_need() {
        let b = day_budget(2400, Pacing::Even, 0);
        let day = 20_000 * 24 * H;
        let st = BudgetState {
            start: day,
            end: day + 24 * H,
            spent: 100,
            pending: 0,
        };
        let now = day + H; // cap = 100
        // Need 101: ceil(2400·f) ≥ 101 ⇔ 2400·(t−s) > 100·L ⇔ t−s > L/24 = 1 h.
        assert_eq!(b.retry(&st, now, 1), Some(1));
        // Need more than the whole amount: next day's cap must reach n.
        assert_eq!(b.retry(&st, now, 2400), Some(23 * H + 86_364 * SECOND + 1));
        assert_eq!(b.retry(&st, now, 2401), None);
    }

    #[test]
    fn profile_weights_by_local_hour() {
        let mut w = [0u64; 24];
        w[12] = 1000; // all traffic between 12:00 and 13:00
        let b = day_budget(1000, Pacing::Profile(Box::new(w)), 0);
        let day = 20_000 * 24 * H;
        let end = day + 24 * H;
        assert_eq!(b.cap(day, end, day + 11 * H), 0);
        assert_eq!(b.cap(day, end, day + 12 * H + H / 2), 500);
        assert_eq!(b.cap(day, end, day + 13 * H), 1000);
        let st = BudgetState {
            start: day,
            end,
            spent: 0,
            pending: 0,
        };
        // cap reaches 1 just after 12:00 (1000·f > 0 at the first nanosecond).
        assert_eq!(b.retry(&st, day + 2 * H, 1), Some(10 * H + 1));
    }
}
