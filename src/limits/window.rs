//! `window`: counters over fixed, calendar and rolling windows (docs/semantics.md §2.2).

use std::collections::VecDeque;

use crate::clock::Nanos;
use crate::limits::calendar::Calendar;

/// The largest `limit` an exact rolling window accepts, which bounds the
/// debits it keeps: every kept debit is at least one unit, so a window never
/// holds more entries than its limit, plus one when unchecked debits take it
/// past the limit (see `trim_log`): 16 bytes each, about 64 KiB per key.
pub const MAX_EXACT_ROLLING_LIMIT: u64 = 4096;

/// How a window item's windows are laid out.
#[derive(Debug, Clone, PartialEq)]
pub enum Layout {
    /// `[k·W, (k+1)·W)`, aligned to the Unix epoch.
    Fixed { w: Nanos },
    /// The calendar hour/day/week/month in a time zone.
    Calendar(Calendar),
    /// Exact sliding window `(now − W, now]`: one entry per debit.
    Rolling { w: Nanos },
    /// Two epoch-aligned buckets of length W, previous one weighted by overlap.
    Approximate { w: Nanos },
}

/// A compiled window item.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub limit: u64,
    pub layout: Layout,
}

/// The bounds a window or period of an earlier definition keeps its count
/// in (docs/semantics.md §5.3): `old`, its own bounds, widened to the
/// current definition's window containing its start, `new`. A longer
/// window takes the count in whole; a shorter one cannot tell when in the
/// old window the units were counted, so they stay counted until the old
/// window would have ended. Neither depends on when the state is read,
/// and a state so carried is carried the same again.
pub fn carried(old: (Nanos, Nanos), new: (Nanos, Nanos)) -> (Nanos, Nanos) {
    (new.0.min(old.0), new.1.max(old.1))
}

/// State of a fixed or calendar window: the current window and its count.
/// 24 bytes. Holding `end` saves a time-zone computation on every decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterState {
    pub start: Nanos,
    pub end: Nanos,
    /// Units debited in `[start, end)`, pending and committed.
    pub used: u64,
}

/// One debit in an exact rolling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debit {
    pub at: Nanos,
    pub cost: u64,
}

/// State of an exact rolling window: its debits, oldest first, and their sum.
/// 40 bytes plus 16 per kept debit (at most [`MAX_EXACT_ROLLING_LIMIT`]); boxed in
/// [`super::ItemState`] so other kinds do not pay for its size.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogState {
    pub debits: VecDeque<Debit>,
    /// Sum of `debits[].cost`, so `used` is O(1) after pruning.
    pub sum: u64,
}

/// State of an approximate rolling window. 24 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApproxState {
    /// Start of the current bucket (a multiple of W).
    pub cur_start: Nanos,
    /// Units in the previous bucket `[cur_start − W, cur_start)`.
    pub prev: u64,
    /// Units in the current bucket.
    pub cur: u64,
}

/// Figures of a window item at one instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowView {
    pub used: u64,
    pub reset_after: Nanos,
}

impl Window {
    /// The counter state as of `now`: the stored window if `now` is still in it,
    /// else an empty counter for the window containing `now`.
    ///
    /// A `now` before the stored window (a request that read the clock just before
    /// another one rolled the window, then took the lock after it) counts in the
    /// stored window: per record, time never goes back. A fresh state has `end`
    /// 0, so it never matches.
    ///
    /// A window of an earlier definition of the item (another length,
    /// alignment or time zone: its bounds are not this layout's) keeps its
    /// count in [`carried`] bounds (docs/semantics.md §5.3). Telling costs a
    /// comparison: a calendar layout's bounds of the window in progress are
    /// cached, and a window that has ended is looked at again only if its
    /// length is not this layout's (a change of alignment or time zone
    /// alone carries it no further than its own end, give or take a
    /// daylight saving hour).
    pub fn current_counter(&self, st: &CounterState, now: Nanos) -> CounterState {
        let look = st.used > 0
            && if now < st.end {
                true
            } else {
                !self.plausible(st.start, st.end)
            };
        let st = &match look.then(|| self.bounds(st.start)) {
            Some(b) if b != (st.start, st.end) => {
                let (start, end) = carried((st.start, st.end), b);
                CounterState { start, end, ..*st }
            }
            _ => *st,
        };
        if now < st.end {
            return *st;
        }
        let (start, end) = self.bounds(now);
        CounterState {
            start,
            end,
            used: 0,
        }
    }

    /// Whether `[start, end)` could be one of this layout's windows by its
    /// length alone.
    fn plausible(&self, start: Nanos, end: Nanos) -> bool {
        match &self.layout {
            Layout::Fixed { w } => end.saturating_sub(start) == *w && start.is_multiple_of(*w),
            Layout::Calendar(cal) => cal.plausible(start, end),
            _ => true,
        }
    }

    /// `[start, end)` of the fixed or calendar window containing `at`.
    fn bounds(&self, at: Nanos) -> (Nanos, Nanos) {
        match &self.layout {
            Layout::Fixed { w } => {
                let start = at / w * w;
                (start, start.saturating_add(*w))
            }
            Layout::Calendar(cal) => cal.bounds(at),
            // Counter states only belong to fixed and calendar layouts; treat any
            // other as a window that has always just started.
            _ => (at, at.saturating_add(1)),
        }
    }

    pub fn counter_view(&self, st: &CounterState, now: Nanos) -> WindowView {
        let cur = self.current_counter(st, now);
        WindowView {
            used: cur.used,
            reset_after: if cur.used == 0 { 0 } else { cur.end - now },
        }
    }

    /// Fixed/calendar retry: the window's end, or never if n > limit.
    pub fn counter_retry(&self, st: &CounterState, now: Nanos, n: u64) -> Option<Nanos> {
        (n <= self.limit).then(|| self.current_counter(st, now).end - now)
    }

    // ---- exact rolling ----

    fn rolling_w(&self) -> Nanos {
        match self.layout {
            Layout::Rolling { w } | Layout::Approximate { w } | Layout::Fixed { w } => w,
            Layout::Calendar(_) => 1,
        }
    }

    /// Drops debits that have left the window `(now − W, now]`.
    pub fn prune_log(&self, st: &mut LogState, now: Nanos) {
        let w = self.rolling_w();
        while let Some(d) = st.debits.front() {
            if d.at.saturating_add(w) > now {
                break;
            }
            st.sum -= d.cost;
            st.debits.pop_front();
        }
    }

    /// Units in the window at `now`, without changing the state.
    pub fn log_used(&self, st: &LogState, now: Nanos) -> u64 {
        let w = self.rolling_w();
        let expired: u64 = st
            .debits
            .iter()
            .take_while(|d| d.at.saturating_add(w) <= now)
            .map(|d| d.cost)
            .sum();
        st.sum - expired
    }

    pub fn log_view(&self, st: &LogState, now: Nanos) -> WindowView {
        let used = self.log_used(st, now);
        let reset_after = match st.debits.back() {
            Some(d) if used > 0 => (d.at + self.rolling_w()).saturating_sub(now),
            _ => 0,
        };
        WindowView { used, reset_after }
    }

    /// The earliest δ with used(now + δ) + n ≤ limit: walk the oldest debits until
    /// enough of them have left the window.
    pub fn log_retry(&self, st: &LogState, now: Nanos, n: u64) -> Option<Nanos> {
        if n > self.limit {
            return None;
        }
        let w = self.rolling_w();
        let excess = (self.log_used(st, now) + n).saturating_sub(self.limit);
        let mut freed = 0u64;
        for d in st.debits.iter().filter(|d| d.at.saturating_add(w) > now) {
            freed += d.cost;
            if freed >= excess {
                return Some(d.at + w - now);
            }
        }
        // Only reached when nothing needs to leave (the request fits now).
        Some(0)
    }

    /// Records a debit at `now` and returns the time it was recorded at. Debits at
    /// the same instant share one entry: releasing n from it is the same as
    /// removing a separate entry of n. A `now` before the newest debit is recorded
    /// at the newest debit's time, so the log stays ordered (per record, time never
    /// goes back).
    pub fn log_push(&self, st: &mut LogState, now: Nanos, n: u64) -> Nanos {
        self.prune_log(st, now);
        let at = st.debits.back().map_or(now, |d| d.at.max(now));
        if n == 0 {
            return at;
        }
        st.sum += n;
        match st.debits.back_mut() {
            Some(d) if d.at == at => d.cost += n,
            _ => {
                // Most keys of a large keyspace see one debit per window: start
                // with room for one entry, not the four VecDeque would take.
                if st.debits.capacity() == 0 {
                    st.debits.reserve_exact(1);
                }
                st.debits.push_back(Debit { at, cost: n })
            }
        }
        if st.debits.len() as u64 > self.limit.saturating_add(1) {
            trim_log(st, self.limit);
        }
        at
    }

    /// Adds `delta` (may be negative) to the debit made at `at`, if it is still in
    /// the window; a debit that has left the window is not touched.
    pub fn log_adjust(&self, st: &mut LogState, at: Nanos, delta: i128, now: Nanos) {
        self.prune_log(st, now);
        // Debits are ordered by time; binary search finds the one made at `at`.
        let Ok(i) = st.debits.binary_search_by_key(&at, |d| d.at) else {
            return;
        };
        let d = &mut st.debits[i];
        let new = (i128::from(d.cost) + delta).clamp(0, i128::from(u64::MAX)) as u64;
        st.sum = st.sum - d.cost + new;
        d.cost = new;
        if new == 0 {
            st.debits.remove(i);
        }
    }

    /// Takes `n` units off the newest debits still in the window (a
    /// refund), floored at none.
    pub fn log_credit(&self, st: &mut LogState, n: u64, now: Nanos) {
        self.prune_log(st, now);
        let mut left = n;
        while left > 0 {
            let Some(d) = st.debits.back_mut() else { break };
            let take = d.cost.min(left);
            d.cost -= take;
            st.sum -= take;
            left -= take;
            if d.cost == 0 {
                st.debits.pop_back();
            }
        }
    }

    // ---- approximate rolling ----

    /// The buckets as of `now`, shifted forward if `now` has left the current one.
    /// A `now` in a bucket before the stored one counts in the stored one (per
    /// record, time never goes back).
    pub fn current_approx(&self, st: &ApproxState, now: Nanos) -> ApproxState {
        let w = self.rolling_w();
        let start = now / w * w;
        if start <= st.cur_start {
            *st
        } else if start == st.cur_start.saturating_add(w) {
            ApproxState {
                cur_start: start,
                prev: st.cur,
                cur: 0,
            }
        } else {
            ApproxState {
                cur_start: start,
                prev: 0,
                cur: 0,
            }
        }
    }

    /// floor(prev·(W − (now − cur_start))/W + cur) for an already-current state.
    fn approx_estimate(&self, s: &ApproxState, now: Nanos) -> u64 {
        let w = u128::from(self.rolling_w());
        let left = w - u128::from(now.max(s.cur_start) - s.cur_start);
        let decayed = (u128::from(s.prev) * left / w) as u64;
        decayed.saturating_add(s.cur)
    }

    pub fn approx_view(&self, st: &ApproxState, now: Nanos) -> WindowView {
        let s = self.current_approx(st, now);
        let used = self.approx_estimate(&s, now);
        let w = self.rolling_w();
        let reset_after = if used == 0 {
            0
        } else if s.cur > 0 {
            s.cur_start + 2 * w - now
        } else {
            s.cur_start + w - now
        };
        WindowView { used, reset_after }
    }

    /// The earliest instant the decaying estimate plus n fits. The estimate only
    /// falls as time passes (within the current bucket the previous one's weight
    /// shrinks; after it, the current becomes the previous), so solve the linear
    /// inequality in the current bucket, then in the next.
    pub fn approx_retry(&self, st: &ApproxState, now: Nanos, n: u64) -> Option<Nanos> {
        if n > self.limit {
            return None;
        }
        let s = self.current_approx(st, now);
        let w = u128::from(self.rolling_w());
        // floor(est) + n ≤ limit  ⇔  est < limit − n + 1 =: room.
        let room = u128::from(self.limit - n) + 1;
        let cur = u128::from(s.cur);
        let end = u128::from(s.cur_start) + w;
        // Current bucket: cur + prev·(end − t)/W < room ⇔ prev·(end − t) < (room − cur)·W.
        if cur < room {
            let t = if s.prev == 0 {
                u128::from(now)
            } else {
                let x = (room - cur) * w;
                (end + 1).saturating_sub(x.div_ceil(u128::from(s.prev)))
            };
            let t = t.max(u128::from(now));
            if t < end {
                return Some((t - u128::from(now)) as Nanos);
            }
        }
        // Next bucket: cur·(end + W − t)/W < room, i.e. t > end + W − room·W/cur:
        // the least such integer is end + W − ⌈room·W/cur⌉ + 1. An empty current
        // bucket leaves nothing to decay: the next bucket starts at 0 and fits
        // from its first instant (the formula has no cur to divide by).
        let t = if cur == 0 {
            end
        } else {
            (end + w + 1).saturating_sub((room * w).div_ceil(cur))
        };
        let t = t.max(end).max(u128::from(now));
        Some((t - u128::from(now)) as Nanos)
    }

    /// Adds `delta` to the bucket that started at `bucket`, if it is still counted
    /// (current or previous); otherwise the debit has aged out and nothing changes.
    pub fn approx_adjust(&self, st: &mut ApproxState, bucket: Nanos, delta: i128, now: Nanos) {
        *st = self.current_approx(st, now);
        let w = self.rolling_w();
        let slot = if bucket == st.cur_start {
            &mut st.cur
        } else if bucket.saturating_add(w) == st.cur_start {
            &mut st.prev
        } else {
            return;
        };
        *slot = (i128::from(*slot) + delta).clamp(0, i128::from(u64::MAX)) as u64;
    }

    /// Takes `n` units off the current bucket, then the previous one (a
    /// refund), floored at none.
    pub fn approx_credit(&self, st: &mut ApproxState, n: u64, now: Nanos) {
        *st = self.current_approx(st, now);
        let from_cur = st.cur.min(n);
        st.cur -= from_cur;
        st.prev = st.prev.saturating_sub(n - from_cur);
    }
}

/// Keeps an exact rolling window at most `limit + 1` entries long when
/// debits that were not checked against it (impressions counted by `events`)
/// take its sum past the limit.
///
/// The newest entries whose costs exceed `limit` decide everything: while the
/// oldest of them is in the window the window is over its limit (nothing but
/// a peek fits), and once it leaves, every older entry has left too. So the
/// older entries are dropped: no decision, no retry time and no reset time
/// changes. What changes is `used` while the window is over its limit: it
/// counts the kept entries, at least `limit + 1`, not every unit (a release
/// of a dropped debit, no longer found by its time, changes nothing).
/// Folding them into the oldest kept entry instead would keep `used` right
/// for a moment but carry their units forward for as long as the flood lasts.
fn trim_log(st: &mut LogState, limit: u64) {
    let mut newest = 0u64;
    let Some(keep) = st.debits.iter().rposition(|d| {
        newest = newest.saturating_add(d.cost);
        newest > limit
    }) else {
        return;
    };
    let dropped: u64 = st.debits.drain(..keep).map(|d| d.cost).sum();
    st.sum -= dropped;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: Nanos = 1_000;

    fn rolling(limit: u64) -> Window {
        Window {
            limit,
            layout: Layout::Rolling { w: W },
        }
    }

    proptest! {
        /// Unchecked debits past the limit are trimmed, and no decision can
        /// tell: whether n fits and when it will, at any later instant, are
        /// those of a log that kept every debit.
        #[test]
        fn trimming_changes_no_decision(
            limit in 0u64..6,
            debits in prop::collection::vec((0u64..300, 1u64..4), 1..60),
            probes in prop::collection::vec(0u64..2_500, 1..20),
        ) {
            let w = rolling(limit);
            let mut trimmed = LogState::default();
            let mut kept = LogState::default();
            let mut now = 0;
            for (step, cost) in debits {
                now += step;
                w.log_push(&mut trimmed, now, cost);
                // The reference: every debit its own entry (pruned alike).
                w.prune_log(&mut kept, now);
                kept.debits.push_back(Debit { at: now, cost });
                kept.sum += cost;
                prop_assert!(trimmed.debits.len() as u64 <= limit + 1);
                // `used` is exact up to the limit, and over it while over.
                let (f, k) = (w.log_used(&trimmed, now), w.log_used(&kept, now));
                prop_assert!(f == k || (f > limit && f <= k), "used {} vs {}", f, k);
            }
            for p in probes {
                let t = now + p;
                for n in 0..=limit + 1 {
                    let fits = |st: &LogState| w.log_used(st, t) + n <= limit;
                    prop_assert_eq!(fits(&trimmed), fits(&kept), "n {} at {}", n, t);
                    prop_assert_eq!(w.log_retry(&trimmed, t, n), w.log_retry(&kept, t, n));
                }
                let reset = |st: &LogState| w.log_view(st, t).reset_after;
                prop_assert_eq!(reset(&trimmed), reset(&kept));
            }
        }
    }

    #[test]
    fn a_flood_of_unchecked_debits_stays_bounded() {
        let w = rolling(3);
        let mut st = LogState::default();
        for i in 0..10_000 {
            w.log_push(&mut st, i, 1);
        }
        // 3 per window of 1 000 ns, 1 000 debits in it: the newest four kept.
        assert_eq!(st.debits.len(), 4);
        assert_eq!(w.log_used(&st, 9_999), 4);
        // One more fits once all but the newest two have left: as if all
        // 1 000 were kept.
        assert_eq!(w.log_retry(&st, 9_999, 1), Some(9_997 + W - 9_999));
    }
}
