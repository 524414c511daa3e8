//! `budget`: spend paced through a calendar period (docs/semantics.md §2.3).
//!
//! cap(now) = min(amount, ceil(amount·f(now)) + allowance), where f is the share of
//! the period that has elapsed: of real time (`even`), of the traffic profile's
//! weighted time (`profile`), or 1 (`asap`). f is kept as an exact fraction
//! F(now)/F(end) of integers: F is Σ weight × nanoseconds over the local-hour
//! segments of the period. The validator caps weights at 1000.000 (10^6
//! thousandths, < 2^20) and a period is at most a month and an hour (< 2^52 ns), so
//! F < 2^72 and amount·F < 2^125 (amount < 2^53) fit in `u128`: both even and
//! profile pacing are exact to the nanosecond.
//!
//! `adaptive` re-plans once per local hour (a *slice*). The plan's *anchor* a is
//! the slice's start (or the period's, if later); b is the committed spend when
//! the slice is first touched (nothing is written in a slice before its plan,
//! so that is the spend at a), or the previous plan's line at a if that is
//! lower, so that running ahead by the allowance does not add up from hour to
//! hour. It spreads
//! what is left, amount − b, over the rest of the period's weighted time:
//! cap(t) = min(amount, allowance + b + ceil((amount − b)·(F(t) − F(a)) /
//! (F(end) − F(a)))). Spend that did not happen in a quiet hour is not banked as
//! credit (even pacing would let it go in one burst when traffic returns); it is
//! shared out over the hours left. A campaign that starts late in the period
//! gets its whole amount spread over what remains of it. F is the flat (real
//! time) or profile-weighted time above, so the arithmetic is the same and as
//! exact: amount·(F(t) − F(a)) + (k − 1)·(F(end) − F(a)) < 2^126.

use std::sync::{Arc, RwLock};

use crate::clock::Nanos;
use crate::limits::calendar::{Calendar, CalendarUnit, local_hour};
use crate::limits::priority::{Share, WHOLE, scaled};
use crate::limits::schedule::Schedule;

pub mod levers;
pub use levers::Levers;

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
    /// What is left, spread over the rest of the period's weighted time,
    /// re-planned every local hour; `None` weighs every hour alike.
    Adaptive(Option<Box<[u64; 24]>>),
    /// No line: the whole amount is the cap, and each request passes with
    /// the pass probability a per-minute controller keeps (see [`levers`]);
    /// its target is traffic-shaped by the profile when there is one.
    Throttle(Option<Box<[u64; 24]>>),
}

/// The most slices a retry looks ahead through: a month and a day of hours.
const MAX_SLICES: usize = 32 * 24;

/// How far a flight's day may catch up: its line rises at most this many
/// times the flight's even share (Kevel and AdButler smooth a flight's
/// delivery; an uncapped catch-up would spend a week's shortfall in one
/// burst when traffic returns).
pub const FLIGHT_CATCH_UP: u64 = 2;

/// The longest flight a budget may count over: a quarter. Its weighted time
/// F stays below 2^73 (92 days < 2^53 ns, weights < 2^20), so the pacing
/// arithmetic (amount·F, the catch-up's comparison) fits in `u128`.
pub const MAX_FLIGHT_NS: Nanos = 92 * 86_400 * 1_000_000_000;

/// A compiled budget item.
#[derive(Debug)]
pub struct Budget {
    pub amount: u64,
    pub calendar: Calendar,
    pub pacing: Pacing,
    /// floor(amount × tolerance in basis points / 10 000).
    pub allowance: u64,
    /// Local hours in the period's zone: the slices adaptive pacing re-plans
    /// at (a flight's even or profile pacing: local days).
    hours: Calendar,
    /// A flight's even or profile pacing: a slice's line rises at most this
    /// many times the flight's even share (docs/semantics.md §6.7, "catch-up").
    catch_up: Option<u64>,
    /// `goal: impressions`: each commit counts 1 unit, whatever its cost.
    impressions: bool,
    /// Its campaign's schedule: pacing spreads the period's line over the
    /// scheduled time only (docs/semantics.md §6.8), off-hours weighing 0.
    open: Option<Arc<Schedule>>,
    /// The profile of the most recently used period: computing one walks every
    /// local hour of the period through the time-zone database, so it is done once
    /// per period, not per decision. A lock, not per-decision work, because all
    /// keys of an item share the period. Poisoning is ignored: the cache only
    /// ever holds a complete table or nothing.
    profile_cache: RwLock<Option<Arc<Profile>>>,
    /// Whether the state keeps the pacing levers' controller (a campaign's
    /// `pacing_levers`, or `throttle` pacing, which decides with it).
    levers: bool,
    /// The share of the cap a priority class sees, in millionths
    /// ([`super::priority`]); [`WHOLE`] for the budget as defined. The cap is
    /// scaled, not the amount, so an adaptive plan (made from the amount and
    /// the spend) is the same for every class.
    share: Share,
}

impl Clone for Budget {
    fn clone(&self) -> Self {
        Budget {
            share: self.share,
            levers: self.levers,
            hours: self.hours.clone(),
            catch_up: self.catch_up,
            impressions: self.impressions,
            open: self.open.clone(),
            ..Budget::new(
                self.amount,
                self.calendar.clone(),
                self.pacing.clone(),
                self.allowance,
            )
        }
    }
}

impl PartialEq for Budget {
    fn eq(&self, o: &Self) -> bool {
        (
            self.amount,
            &self.calendar,
            &self.pacing,
            self.allowance,
            self.share,
            self.levers,
            self.catch_up,
            &self.hours,
            self.impressions,
            &self.open,
        ) == (
            o.amount,
            &o.calendar,
            &o.pacing,
            o.allowance,
            o.share,
            o.levers,
            o.catch_up,
            &o.hours,
            o.impressions,
            &o.open,
        )
    }
}

/// State of a budget: the current period and what is spent and pending in it.
/// 72 bytes, boxed in [`super::ItemState`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetState {
    pub start: Nanos,
    pub end: Nanos,
    /// Committed spend in `[start, end)`.
    pub spent: u64,
    /// Spend held by open reservations made in this period.
    pub pending: u64,
    /// Adaptive pacing only: when the current plan was made (0: none yet).
    /// Not stored on disk: after a restart or an eviction the plan is made
    /// again from the spend then, as at any slice boundary.
    pub anchor: Nanos,
    /// Adaptive pacing only: committed spend when the plan was made.
    pub base: u64,
    /// Levers only ([`levers`]): the minute the controller last stepped
    /// to (0: not in this period). Not stored on disk, as an adaptive plan.
    pub tick: Nanos,
    /// Levers only: committed spend at `tick`.
    pub tick_spent: u64,
    /// Levers only: the pass probability, in millionths.
    pub pass: u32,
    /// Levers only: the dual variable μ in millionths; the bid multiplier
    /// is 1/(1 + μ).
    pub dual: u32,
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

/// Even pacing over a schedule: every hour weighs the same.
const EVEN_HOURS: [u64; 24] = [1; 24];

impl Profile {
    /// The weighted time of `[start, end)`: each local hour's weight, or 0
    /// where `open` (a schedule) is closed.
    fn build(
        cal: &Calendar,
        weights: &[u64; 24],
        open: Option<&Schedule>,
        start: Nanos,
        end: Nanos,
    ) -> Profile {
        let hours = Calendar::new(CalendarUnit::Hour, cal.tz.clone());
        let spans = open.map(|s| s.open_spans(start, end));
        let mut segments = Vec::new();
        let mut f = 0u128;
        let mut t = start;
        while t < end {
            let w = weights[local_hour(&cal.tz, t)];
            let hour_end = hours.bounds(t).1.clamp(t + 1, end);
            // Within the hour, cut where the schedule opens or closes.
            let (w, next) = match &spans {
                None => (w, hour_end),
                Some(spans) => {
                    let i = spans.partition_point(|&(_, b)| b <= t);
                    match spans.get(i) {
                        Some(&(a, b)) if a <= t => (w, b.min(hour_end)),
                        Some(&(a, _)) => (0, a.min(hour_end)),
                        None => (0, hour_end),
                    }
                }
            };
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
            hours: Calendar::new(CalendarUnit::Hour, calendar.tz.clone()),
            calendar,
            pacing,
            allowance,
            profile_cache: RwLock::new(None),
            share: WHOLE,
            levers: false,
            catch_up: None,
            impressions: false,
            open: None,
        }
    }

    /// Its pacing as a definition names it: `asap`, `even`, `profile`,
    /// `adaptive`, `adaptive+profile`, `throttle` or `throttle+profile`. A
    /// flight's even or profile pacing, re-planned each day as adaptive
    /// pacing is, keeps its name.
    pub fn pacing_name(&self) -> &'static str {
        match &self.pacing {
            Pacing::Adaptive(None) if self.catches_up() => "even",
            Pacing::Adaptive(Some(_)) if self.catches_up() => "profile",
            Pacing::Asap => "asap",
            Pacing::Even => "even",
            Pacing::Profile(_) => "profile",
            Pacing::Adaptive(None) => "adaptive",
            Pacing::Adaptive(Some(_)) => "adaptive+profile",
            Pacing::Throttle(None) => "throttle",
            Pacing::Throttle(Some(_)) => "throttle+profile",
        }
    }

    /// Whether it is paced over a schedule's open time ([`Budget::within`]).
    pub fn within_schedule(&self) -> bool {
        self.open.is_some()
    }

    /// This budget paced over `schedule`'s open time only: its line rises
    /// in scheduled hours and stands still off them (docs/semantics.md
    /// §6.8). `asap` is unchanged.
    pub fn within(mut self, schedule: Arc<Schedule>) -> Budget {
        self.open = Some(schedule);
        self
    }

    /// This budget counting commits, 1 each, rather than their cost
    /// (`"goal": "impressions"`).
    pub fn counting_impressions(mut self) -> Budget {
        self.impressions = true;
        self
    }

    /// Whether each commit counts 1 unit, whatever its cost.
    pub fn counts_impressions(&self) -> bool {
        self.impressions
    }

    /// Whether its days catch up at most [`FLIGHT_CATCH_UP`]× (an `even` or
    /// `profile` budget per flight, re-planned daily as `adaptive`).
    pub fn catches_up(&self) -> bool {
        self.catch_up.is_some()
    }

    /// This budget over a flight `[start, end)` (docs/semantics.md §6.7):
    /// one period, the flight, in the budget's zone. `even` and `profile`
    /// pacing spread what is left over the flight's time left, re-planned
    /// each local day, a day's line at most [`FLIGHT_CATCH_UP`] times the
    /// even share; `adaptive` re-plans each local hour, as over a calendar
    /// period; `asap` allows the whole amount from the start. `throttle`
    /// (a pass probability per calendar period) is refused.
    pub fn over_flight(self, start: Nanos, end: Nanos) -> Result<Budget, &'static str> {
        let tz = self.calendar.tz.clone();
        let (pacing, daily) = match self.pacing.clone() {
            Pacing::Asap => (Pacing::Asap, false),
            Pacing::Even => (Pacing::Adaptive(None), true),
            Pacing::Profile(w) => (Pacing::Adaptive(Some(w)), true),
            Pacing::Adaptive(w) => (Pacing::Adaptive(w), false),
            Pacing::Throttle(_) => {
                return Err(
                    "throttle pacing is per calendar period; a budget per flight \
                            paces even, profile, adaptive or asap",
                );
            }
        };
        let mut b = Budget::new(
            self.amount,
            Calendar::fixed(start, end, tz.clone()),
            pacing,
            self.allowance,
        );
        if daily {
            b.hours = Calendar::new(CalendarUnit::Day, tz);
            b.catch_up = Some(FLIGHT_CATCH_UP);
        }
        b.levers = self.levers;
        b.share = self.share;
        b.impressions = self.impressions;
        b.open = self.open;
        Ok(b)
    }

    /// This budget with the pacing levers' controller kept in its state
    /// (always so for `throttle` pacing).
    pub fn with_levers(mut self) -> Budget {
        self.levers = true;
        self
    }

    /// Whether its state keeps the levers' controller.
    pub fn has_levers(&self) -> bool {
        self.levers || matches!(self.pacing, Pacing::Throttle(_))
    }

    /// Whether this budget decides with the pass probability (`throttle`).
    pub fn throttles(&self) -> bool {
        matches!(self.pacing, Pacing::Throttle(_))
    }

    /// This budget as a priority class with `share` sees it: the same
    /// period, pacing and spend, every cap scaled to ⌈share × cap⌉.
    pub fn with_share(&self, share: Share) -> Budget {
        Budget {
            share,
            ..self.clone()
        }
    }

    /// The `limit` figure: the amount, or a class's share of it.
    pub fn limit(&self) -> u64 {
        scaled(self.amount, self.share)
    }

    /// The whole budget's cap at which this class's cap reaches `need`:
    /// ⌈cap·s⌉ ≥ need ⇔ cap ≥ ⌊(need − 1)/s⌋ + 1 (s in millionths). `need`
    /// itself for the budget as defined.
    fn unscaled(&self, need: u64) -> u64 {
        if self.share == WHOLE || need == 0 {
            return need;
        }
        let whole = u128::from(need - 1) * u128::from(WHOLE) / u128::from(self.share) + 1;
        u64::try_from(whole).unwrap_or(u64::MAX)
    }

    /// The state as of `now`: the stored period, or a fresh one if it has ended.
    /// A `now` before the stored period counts in it (per record, time never goes
    /// back); a fresh state has `end` 0 and never matches. Adaptive pacing makes
    /// a new plan here when the state has none or its slice has ended, so every
    /// step (probe, apply, commit, release) sees the same plan.
    pub fn current(&self, st: &BudgetState, now: Nanos) -> BudgetState {
        // A period of an earlier definition (another period or time zone,
        // docs/semantics.md §5.3) keeps its spend and holds in the carried
        // bounds; its plan is made anew.
        // As a window's (`Window::current_counter`): looked at while in
        // progress (its bounds are cached), or, ended, if its length is not
        // this calendar's.
        let look = st.spent.saturating_add(st.pending) > 0
            && (now < st.end || !self.calendar.plausible(st.start, st.end));
        let bounds = look.then(|| self.calendar.bounds(st.start));
        let carried = if let Some(bounds) = bounds.filter(|b| *b != (st.start, st.end)) {
            let (start, end) = super::window::carried((st.start, st.end), bounds);
            Some(BudgetState {
                start,
                end,
                spent: st.spent,
                pending: st.pending,
                ..BudgetState::default()
            })
        } else {
            None
        };
        let st = carried.as_ref().unwrap_or(st);
        // A flight has one period: past its end, what it counted stays.
        let flown = self.calendar.fixed_period() == Some((st.start, st.end));
        let mut cur = if now < st.end || flown {
            *st
        } else {
            let (start, end) = self.calendar.bounds(now);
            BudgetState {
                start,
                end,
                ..BudgetState::default()
            }
        };
        if matches!(self.pacing, Pacing::Adaptive(_))
            && (cur.anchor < cur.start || now >= self.slice_end(cur.anchor, cur.end))
        {
            // The plan is anchored at the start of the local hour, not at
            // the instant of the first request in it: reads (a peek, a
            // denied request) then see the same plan a write keeps, and a
            // request later in the hour sees the line grown since. Anchored
            // at its own instant, every request of an hour without a write
            // saw the line at its base and, with no allowance, was denied
            // until something else wrote (docs/semantics.md §2.3).
            let at = self.hours.bounds(now).0.max(cur.start);
            // Spend ahead of the old plan's line (by at most the allowance) is
            // not taken as the new base: the new plan starts from the line, so
            // the allowance does not add up from one hour to the next. Spend
            // behind it is the base: the shortfall is shared out.
            cur.base = if cur.anchor < cur.start {
                cur.spent
            } else {
                cur.spent
                    .min(self.plan_line(&cur, cur.anchor, cur.base, at))
            };
            cur.anchor = at;
        }
        if self.has_levers() {
            self.step_levers(&mut cur, now);
        }
        cur
    }

    /// Whether this budget re-plans every slice (`adaptive`).
    pub fn adaptive(&self) -> bool {
        matches!(self.pacing, Pacing::Adaptive(_))
    }

    /// The anchor of the adaptive plan for `now` in the period starting at
    /// `start`: the start of its local hour, or of the period if later.
    pub fn slice_anchor(&self, start: Nanos, now: Nanos) -> Nanos {
        self.hours.bounds(now).0.max(start)
    }

    /// cap(t) under the adaptive plan (`anchor`, `base`) of the period
    /// `[start, end)`: a plan made elsewhere (a cluster's, from the fleet's
    /// spend; `crate::engine::leases`).
    pub fn plan_cap(&self, start: Nanos, end: Nanos, anchor: Nanos, base: u64, t: Nanos) -> u64 {
        let period = BudgetState {
            start,
            end,
            anchor,
            base,
            ..BudgetState::default()
        };
        self.adaptive_cap(&period, t)
    }

    /// The line (no allowance) at `t` of the adaptive plan (`anchor`,
    /// `base`) of the period `[start, end)`.
    pub fn plan_line_at(
        &self,
        start: Nanos,
        end: Nanos,
        anchor: Nanos,
        base: u64,
        t: Nanos,
    ) -> u64 {
        let period = BudgetState {
            start,
            end,
            ..BudgetState::default()
        };
        self.plan_line(&period, anchor, base, t)
    }

    /// The end of the adaptive slice that starts at `anchor`: the end of its
    /// local hour, or of the period if sooner.
    fn slice_end(&self, anchor: Nanos, end: Nanos) -> Nanos {
        self.hours.bounds(anchor).1.min(end)
    }

    pub fn view(&self, st: &BudgetState, now: Nanos) -> BudgetView {
        self.view_of_current(&self.current(st, now), now)
    }

    /// [`Budget::view`] of a state already brought to `now`.
    fn view_of_current(&self, cur: &BudgetState, now: Nanos) -> BudgetView {
        let cap = match self.pacing {
            Pacing::Adaptive(_) => self.adaptive_cap(cur, now),
            _ => self.cap(cur.start, cur.end, now),
        };
        BudgetView {
            period: (cur.start, cur.end),
            cap: scaled(cap, self.share),
            spent: cur.spent,
            pending: cur.pending,
        }
    }

    /// cap(now) of an adaptive budget under the plan of `cur` (see the module
    /// documentation).
    fn adaptive_cap(&self, cur: &BudgetState, now: Nanos) -> u64 {
        self.plan_line(cur, cur.anchor, cur.base, now)
            .saturating_add(self.allowance)
            .min(self.amount)
    }

    /// The line of the adaptive plan made at `anchor` with spend `base`, at
    /// `t` (no allowance): base + ceil((amount − base)·(F(t) − F(a))/(F(end) −
    /// F(a))). When no weighted time is left (a profile whose remaining hours
    /// weigh nothing), the line is the whole amount.
    fn plan_line(&self, period: &BudgetState, anchor: Nanos, base: u64, t: Nanos) -> u64 {
        let Some(pr) = self.progress(period.start, period.end) else {
            return self.amount;
        };
        let (fa, den) = pr.fraction(anchor);
        let (ft, _) = pr.fraction(t.max(anchor));
        let left = den - fa;
        if left == 0 {
            return self.amount;
        }
        let (rest, left) = self.slope(base, left, den);
        // ≤ rest because ft − fa ≤ left (and, capped, below the uncapped).
        let paced = (rest * (ft - fa)).div_ceil(left) as u64;
        base.saturating_add(paced).min(self.amount)
    }

    /// The slope of a plan spreading what is left after `base` over the
    /// weighted time `left` of `den`, as (units, time): what is left over
    /// the time left, or for a flight's catch-up, when steeper than
    /// [`FLIGHT_CATCH_UP`] times the even share, that (amount·c over den).
    fn slope(&self, base: u64, left: u128, den: u128) -> (u128, u128) {
        let rest = u128::from(self.amount.saturating_sub(base));
        match self.catch_up {
            Some(c) => {
                let most = u128::from(self.amount) * u128::from(c);
                if rest * den > most * left {
                    (most, den)
                } else {
                    (rest, left)
                }
            }
            None => (rest, left),
        }
    }

    /// The first instant in `[anchor, slice_end)` at which the adaptive plan
    /// made at `anchor` with spend `base` lets the cap reach `need`.
    fn plan_reaches(
        &self,
        pr: &Progress,
        (start, end): (Nanos, Nanos),
        anchor: Nanos,
        base: u64,
        need: u64,
    ) -> Option<Nanos> {
        if need > self.amount {
            return None;
        }
        let k = need.saturating_sub(self.allowance).saturating_sub(base);
        if k == 0 {
            return Some(anchor);
        }
        let (fa, den) = pr.fraction(anchor);
        let left = den - fa;
        if left == 0 {
            return Some(anchor);
        }
        let (rest, left) = self.slope(base, left, den);
        if rest == 0 {
            return None;
        }
        // base + ceil(rest·(F(t) − fa)/left) ≥ base + k ⇔ rest·F(t) > (k − 1)·left + rest·fa.
        let t = pr.first_above(rest, u128::from(k - 1) * left + rest * fa)?;
        let t = t.max(anchor);
        (t < self.slice_end(anchor, end) && t >= start).then_some(t)
    }

    /// When an adaptive cap reaches `need` within `[start, end)` if nothing else
    /// happens: under the plan at `anchor`, or else under the plans made at the
    /// following slice boundaries, each from `spent` (or the line before it,
    /// if lower, as [`Budget::current`] makes them).
    fn adaptive_reaches(
        &self,
        (start, end): (Nanos, Nanos),
        mut anchor: Nanos,
        mut base: u64,
        spent: u64,
        need: u64,
    ) -> Option<Nanos> {
        let pr = self.progress(start, end)?;
        let period = BudgetState {
            start,
            end,
            ..BudgetState::default()
        };
        for _ in 0..MAX_SLICES {
            if let Some(t) = self.plan_reaches(&pr, (start, end), anchor, base, need) {
                return Some(t);
            }
            let next = self.slice_end(anchor, end);
            if next >= end {
                return None;
            }
            base = spent.min(self.plan_line(&period, anchor, base, next));
            anchor = next;
        }
        None
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
        let p = Arc::new(Profile::build(
            &self.calendar,
            weights,
            self.open.as_deref(),
            start,
            end,
        ));
        *self
            .profile_cache
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Some(p.clone());
        p
    }

    /// f(t) = num/den for `t` in `[start, end]`; `None` for asap (f = 1).
    /// A profile whose weights are all zero over this period (a DST day that
    /// skips the only weighted hour) falls back to even pacing.
    /// A budget paced over a schedule weighs its open time only: even
    /// pacing is then a profile of equal hours, off-hours weighing 0. A
    /// period with no open time at all (a weekend of a weekday schedule,
    /// when nothing is eligible anyway) paces even.
    fn progress(&self, start: Nanos, end: Nanos) -> Option<Progress> {
        let weights = match &self.pacing {
            Pacing::Asap => return None,
            Pacing::Even | Pacing::Adaptive(None) | Pacing::Throttle(None) => {
                if self.open.is_none() {
                    return Some(Progress::Even { start, end });
                }
                &EVEN_HOURS
            }
            Pacing::Profile(w) | Pacing::Adaptive(Some(w)) | Pacing::Throttle(Some(w)) => &**w,
        };
        let p = self.profile(weights, start, end);
        if p.total == 0 {
            Some(Progress::Even { start, end })
        } else {
            Some(Progress::Profile(p))
        }
    }

    /// The weighted time of the period `[start, end)` that paces it, as
    /// (segment start, weight) in order from `start`: a profile's local
    /// hours, or one segment of weight 1 (even time); `None` for asap. A
    /// cluster's lease function integrates them at Redis's time
    /// (src/cluster/functions.lua, `fc_lease_v2` rules 3 and 4).
    pub fn segments(&self, start: Nanos, end: Nanos) -> Option<Vec<(Nanos, u64)>> {
        Some(match self.progress(start, end)? {
            Progress::Even { .. } => vec![(start, 1)],
            Progress::Profile(p) => p.segments.iter().map(|&(s, _, w)| (s, w)).collect(),
        })
    }

    /// cap(now) for the period `[start, end)`.
    pub fn cap(&self, start: Nanos, end: Nanos, now: Nanos) -> u64 {
        if self.throttles() {
            // A throttle paces by its pass probability: the cap is the
            // whole amount, as asap's.
            return self.amount;
        }
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
        let t = pr.first_above(
            u128::from(self.amount),
            u128::from(k - 1) * pr.fraction(end).1,
        )?;
        (t < end).then_some(t)
    }

    /// retry_after of a denied request of `n` (docs/semantics.md §2.3): when this
    /// period's cap reaches spent + pending + n; else when the next period's cap
    /// reaches n; never if n > amount.
    pub fn retry(&self, st: &BudgetState, now: Nanos, n: u64) -> Option<Nanos> {
        let cur = self.current(st, now);
        let need = cur.spent.saturating_add(cur.pending).saturating_add(n);
        // A class sees a scaled cap: wait for the whole cap its need takes.
        let (need, n) = (self.unscaled(need), self.unscaled(n));
        if let Pacing::Adaptive(_) = self.pacing {
            return self.adaptive_retry(&cur, now, n, need);
        }
        if self.throttles() && need <= self.amount {
            // Throttled, with budget left: the pass probability is
            // re-planned at the next minute (docs/pacing.md, "Levers").
            return Some(levers::next_step(cur.start, now) - now);
        }
        if let Some(t) = self.cap_reaches(cur.start, cur.end, need) {
            return Some(t.max(now) - now);
        }
        if n > self.amount {
            return None;
        }
        let (ns, ne) = self.calendar.period_after(cur.end)?;
        let t = match self.throttles() {
            true => ns,
            false => self.cap_reaches(ns, ne, n).unwrap_or(ns),
        };
        Some(t - now)
    }

    fn adaptive_retry(&self, cur: &BudgetState, now: Nanos, n: u64, need: u64) -> Option<Nanos> {
        let period = (cur.start, cur.end);
        if let Some(t) = self.adaptive_reaches(period, cur.anchor, cur.base, cur.spent, need) {
            return Some(t.max(now) - now);
        }
        if n > self.amount {
            return None;
        }
        // The next period starts empty, with a plan made at its first instant.
        let (ns, ne) = self.calendar.period_after(cur.end)?;
        let t = self.adaptive_reaches((ns, ne), ns, 0, 0, n).unwrap_or(ns);
        Some(t - now)
    }

    pub fn idle_at(&self, st: &BudgetState) -> Nanos {
        if st.spent + st.pending > 0 {
            st.end
        } else if matches!(self.pacing, Pacing::Adaptive(_)) && st.anchor > 0 {
            // Until its slice ends, an adaptive plan made with nothing spent
            // still answers differently from one made later.
            self.slice_end(st.anchor, st.end)
        } else {
            0
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

    /// The first instant t with amount·num(t) > target.
    fn first_above(&self, amount: u128, target: u128) -> Option<Nanos> {
        match self {
            Progress::Even { start, .. } => {
                // amount·(t − start) > target ⇔ t − start ≥ floor(target / amount) + 1.
                let d = target / amount + 1;
                u64::try_from(u128::from(*start) + d).ok()
            }
            Progress::Profile(p) => {
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
    fn a_budget_within_a_schedule_paces_over_its_open_hours_only() {
        // Day 20 000 since the epoch is a Friday: the schedule opens
        // 09:00-17:00 on Fridays.
        let sched = Arc::new(Schedule::new(TimeZone::UTC, &[(vec![4], 9 * 60, 17 * 60)]));
        let day = 20_000 * 24 * H;
        let (s, e) = (day, day + 24 * H);
        let even = day_budget(800, Pacing::Even, 0).within(sched.clone());
        // Nothing before the hours open; 100 an hour in them; all of it by
        // the close, where it stays.
        assert_eq!(even.cap(s, e, day + 9 * H), 0);
        assert_eq!(even.cap(s, e, day + 13 * H), 400);
        assert_eq!(even.cap(s, e, day + 17 * H), 800);
        assert_eq!(even.cap(s, e, day + 20 * H), 800);
        // A retry waits for the hours to open.
        let st = BudgetState {
            start: s,
            end: e,
            ..BudgetState::default()
        };
        assert_eq!(even.retry(&st, day + 2 * H, 1), Some(7 * H + 1));
        // A profile weighs open hours only: 3 for the afternoon's four.
        let mut w = [1u64; 24];
        for h in w.iter_mut().skip(13) {
            *h = 3;
        }
        let profile = day_budget(800, Pacing::Profile(Box::new(w)), 0).within(sched.clone());
        // Open weight 4·1 + 4·3 = 16: 200 by 13:00.
        assert_eq!(profile.cap(s, e, day + 13 * H), 200);
        assert_eq!(profile.cap(s, e, day + 17 * H), 800);
        // A day the schedule never opens paces even (nothing is eligible).
        let saturday = (s + 24 * H, e + 24 * H);
        assert_eq!(even.cap(saturday.0, saturday.1, saturday.0 + 12 * H), 400);
        // asap is unchanged.
        let asap = day_budget(800, Pacing::Asap, 0).within(sched);
        assert_eq!(asap.cap(s, e, day), 800);
    }

    #[test]
    fn retry_is_when_the_line_reaches_need() {
        let b = day_budget(2400, Pacing::Even, 0);
        let day = 20_000 * 24 * H;
        let st = BudgetState {
            start: day,
            end: day + 24 * H,
            spent: 100,
            ..BudgetState::default()
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
            ..BudgetState::default()
        };
        // cap reaches 1 just after 12:00 (1000·f > 0 at the first nanosecond).
        assert_eq!(b.retry(&st, day + 2 * H, 1), Some(10 * H + 1));
    }
}

#[cfg(test)]
mod adaptive_tests {
    use super::*;
    use crate::clock::SECOND;
    use jiff::tz::TimeZone;

    const H: Nanos = 3_600 * SECOND;
    const DAY0: Nanos = 20_000 * 24 * H;

    fn adaptive(amount: u64, weights: Option<[u64; 24]>, allowance: u64) -> Budget {
        Budget::new(
            amount,
            Calendar::new(CalendarUnit::Day, TimeZone::UTC),
            Pacing::Adaptive(weights.map(Box::new)),
            allowance,
        )
    }

    /// Applies a committed spend of `n` at `now`, as the engine's immediate path does.
    fn spend(b: &Budget, st: &mut BudgetState, now: Nanos, n: u64) {
        *st = b.current(st, now);
        st.spent += n;
    }

    #[test]
    fn untouched_budget_plans_from_its_first_use() {
        // A budget first used at 12:00 spreads all 2400 over the 12 hours left:
        // 200 an hour instead of even pacing's 1200 at once.
        let b = adaptive(2400, None, 0);
        let st = BudgetState::default();
        let now = DAY0 + 12 * H;
        assert_eq!(b.view(&st, now).cap, 0);
        let mut st = b.current(&st, now);
        assert_eq!((st.anchor, st.base), (now, 0));
        assert_eq!(b.view(&st, now + H / 2).cap, 100);
        spend(&b, &mut st, now + H / 2, 100);
        assert_eq!(b.view(&st, now + H - 1).cap, 200);
        // At 13:00 a new plan: 2300 left over 11 hours → ceil(2300/11) by 14:00.
        assert_eq!(b.view(&st, now + H).cap, 100);
        st = b.current(&st, now + H);
        assert_eq!((st.anchor, st.base), (now + H, 100));
        assert_eq!(b.view(&st, now + 2 * H - 1).cap, 100 + 210); // ceil(2300·(3600e9−1)/39600e9)
    }

    /// Requests of an hour in which nothing has written a plan yet: each is
    /// judged under the plan anchored at the hour's start, so a request at
    /// 12:30 sees half an hour of line even with no allowance (anchored at
    /// its own instant, every such request saw a cap of `base` and, denied,
    /// kept no plan: the budget never spent).
    #[test]
    fn a_plan_is_anchored_at_its_hour_so_reads_see_the_line() {
        let b = adaptive(2400, None, 0);
        let st = BudgetState::default();
        let at = DAY0 + 12 * H + H / 2;
        // 2400 over the 12 hours from 12:00: 100 by 12:30.
        assert_eq!(b.view(&st, at).cap, 100);
        assert_eq!(b.view(&st, at + 1).cap, 101);
        // A write at 12:30 keeps the same plan the reads saw.
        let kept = b.current(&st, at);
        assert_eq!((kept.anchor, kept.base), (DAY0 + 12 * H, 0));
        assert_eq!(b.view(&kept, at).cap, 100);
    }

    #[test]
    fn a_quiet_hour_is_shared_out_not_banked() {
        // Nothing spent from 00:00 to 06:00 (the plan was made at 00:00).
        let b = adaptive(2400, None, 0);
        let mut st = b.current(&BudgetState::default(), DAY0);
        assert_eq!(b.view(&st, DAY0 + H - 1).cap, 100); // the 00:00 slice's line
        st = b.current(&st, DAY0 + 6 * H);
        // Even pacing would allow 600 now; adaptive re-plans 2400 over 18 h.
        assert_eq!(b.view(&st, DAY0 + 6 * H).cap, 0);
        assert_eq!(b.view(&st, DAY0 + 7 * H - 1).cap, 134); // ceil(2400/18 − ε)
        spend(&b, &mut st, DAY0 + 7 * H - 1, 133);
        // The 07:00 plan: 2267 left over 17 h.
        st = b.current(&st, DAY0 + 7 * H);
        assert_eq!(b.view(&st, DAY0 + 8 * H - 1).cap, 133 + 134); // ceil(2267/17 − ε)
    }

    #[test]
    fn allowance_and_the_last_instant() {
        let b = adaptive(1000, None, 10);
        let mut st = b.current(&BudgetState::default(), DAY0 + 23 * H);
        assert_eq!(b.view(&st, DAY0 + 23 * H).cap, 10);
        spend(&b, &mut st, DAY0 + 23 * H, 10);
        assert_eq!(b.view(&st, DAY0 + 24 * H - 1).cap, 1000);
    }

    #[test]
    fn profile_weights_the_time_left() {
        // Traffic only from 18:00 to 22:00: at 18:00 the plan gives each of the
        // four hours a quarter of what is left, whatever the hour of the plan.
        let mut w = [0u64; 24];
        w[18..22].fill(1000);
        let b = adaptive(4000, Some(w), 0);
        let st = b.current(&BudgetState::default(), DAY0 + 9 * H);
        assert_eq!(b.view(&st, DAY0 + 10 * H - 1).cap, 0);
        let mut st = b.current(&st, DAY0 + 18 * H);
        assert_eq!(b.view(&st, DAY0 + 18 * H + H / 2).cap, 500);
        spend(&b, &mut st, DAY0 + 18 * H + H / 2, 500);
        // 19:00: 3500 left over 3 weighted hours.
        st = b.current(&st, DAY0 + 19 * H);
        assert_eq!(b.view(&st, DAY0 + 20 * H - 1).cap, 500 + 1167); // ceil(3500·(3600e9−1)/10800e9)
        // After 22:00 no weighted time is left: the rest is available.
        st = b.current(&st, DAY0 + 22 * H);
        assert_eq!(b.view(&st, DAY0 + 22 * H).cap, 4000);
    }

    #[test]
    fn retry_within_the_slice_and_beyond() {
        let b = adaptive(2400, None, 0);
        let st = b.current(&BudgetState::default(), DAY0);
        // The cap is rounded up: it reaches 1 one nanosecond into the plan.
        assert_eq!(b.retry(&st, DAY0, 1), Some(1));
        // 150 at once fits in no hour's plan while each gives 2400/(hours left)
        // < 150 (rounded up, the cap passes 149 only once the line does): the
        // 08:00 plan, 150 an hour, reaches 150 at 08:00 + 149·16h/2400 + 1 ns.
        assert_eq!(
            b.retry(&st, DAY0, 150),
            Some(8 * H + 149 * 16 * H / 2400 + 1)
        );
        // More than the amount: never.
        assert_eq!(b.retry(&st, DAY0, 2401), None);
        // All spent: tomorrow's plan, made at midnight, reaches 1 at once.
        let mut full = st;
        full.spent = 2400;
        assert_eq!(b.retry(&full, DAY0 + 10 * H, 1), Some(14 * H + 1));
    }

    #[test]
    fn the_allowance_does_not_add_up_over_the_hours() {
        // Spending the whole cap every hour keeps within the allowance of the
        // even line: each new plan starts from the old line, not the spend.
        let b = adaptive(2400, None, 100);
        let mut st = BudgetState::default();
        for h in 0..24 {
            let end = DAY0 + (h + 1) * H - 1;
            st = b.current(&st, DAY0 + h * H);
            let cap = b.view(&st, end).cap;
            let more = cap - st.spent;
            spend(&b, &mut st, end, more);
            assert!(st.spent <= 100 * (h + 1) + 100, "hour {h}: {}", st.spent);
        }
        assert_eq!(st.spent, 2400);
    }

    #[test]
    fn idle_only_after_its_slice() {
        let b = adaptive(2400, None, 0);
        let st = b.current(&BudgetState::default(), DAY0 + 5 * H + 7);
        assert_eq!(b.idle_at(&st), DAY0 + 6 * H);
        assert_eq!(b.idle_at(&BudgetState::default()), 0);
    }

    #[test]
    fn dst_day_plans_over_its_own_hours() {
        // New York, 2026-03-08: 23 hours. A plan at the day's start spreads the
        // amount over 23 real hours.
        let tz = TimeZone::get("America/New_York").unwrap();
        let b = Budget::new(
            2300,
            Calendar::new(CalendarUnit::Day, tz),
            Pacing::Adaptive(None),
            0,
        );
        let start = "2026-03-08T05:00:00Z"
            .parse::<jiff::Timestamp>()
            .unwrap()
            .as_nanosecond() as Nanos;
        let st = b.current(&BudgetState::default(), start);
        assert_eq!((st.start, st.end - st.start), (start, 23 * H));
        assert_eq!(b.view(&st, start + H - 1).cap, 100); // ceil(2300·(1 h − 1 ns)/23 h)
    }
}
