//! What a leased item looks like now: its period, this node's use in it,
//! and the total the fleet may be granted now (pure: no I/O).

use crate::clock::Nanos;
use crate::limits::budget::Budget;
use crate::limits::window::{Layout, Window};
use crate::limits::{Item, ItemState, Kind};

use super::*;

/// The [`LeaseView`] of a leasable item in state `st` with `pending` units
/// held on its counter, at `now`.
pub(crate) fn view(item: &Item, st: &ItemState, pending: u64, now: Nanos) -> Option<LeaseView> {
    match (item, st) {
        // A rolling window's debits are slots each held for the window's
        // length: what a node holds goes back as its debits age out.
        (
            Item::Window(
                w @ Window {
                    layout: Layout::Rolling { w: len } | Layout::Approximate { w: len },
                    ..
                },
            ),
            _,
        ) => {
            let used = match (&w.layout, st) {
                (Layout::Rolling { .. }, ItemState::Log(l)) => w.log_view(l, now).used,
                (Layout::Approximate { .. }, ItemState::Approx(a)) => w.approx_view(a, now).used,
                _ => 0,
            };
            Some(LeaseView {
                start: 0,
                end: Nanos::MAX,
                committed: 0,
                pending: used,
                total: w.limit,
                slots: true,
                until: now.saturating_add(*len),
                line: None,
            })
        }
        (Item::Window(w), _) => {
            let stored = match st {
                ItemState::Counter(c) => *c,
                _ => Default::default(),
            };
            let cur = w.current_counter(&stored, now);
            let (used, pending) = if cur.start == stored.start && cur.end == stored.end {
                (cur.used, pending.min(cur.used))
            } else {
                (0, 0)
            };
            Some(LeaseView {
                start: cur.start,
                end: cur.end,
                committed: used - pending,
                pending,
                total: w.limit,
                slots: false,
                until: 0,
                line: None,
            })
        }
        (Item::Budget(b), _) if leasable(item) => {
            let stored = match st {
                ItemState::Budget(s) => **s,
                _ => Default::default(),
            };
            let cur = b.current(&stored, now);
            // The pacing line a grant's life ahead: delivery runs ahead of
            // the line by at most that, never past the amount.
            let total = b.cap(cur.start, cur.end, now.saturating_add(LEASE_TTL));
            Some(LeaseView {
                start: cur.start,
                end: cur.end,
                committed: cur.spent,
                pending: cur.pending,
                total,
                slots: false,
                until: 0,
                line: None,
            })
        }
        (Item::Rate { rate, kind }, _) => {
            // q units every p ns is 1000·q every p µs: exact, no rounding.
            let (q, p) = rate.slope();
            let (rate_arg, per_us) = if p % 1000 == 0 {
                (q, p / 1000)
            } else {
                (q.saturating_mul(1000), p)
            };
            let burst = rate.burst();
            // What the line gives in a grant's life: the most a node asks.
            let total = burst.saturating_add(
                (u128::from(q) * u128::from(LEASE_TTL) / u128::from(p.max(1))) as u64,
            );
            Some(LeaseView {
                start: 0,
                end: Nanos::MAX,
                committed: 0,
                pending,
                total,
                slots: false,
                until: 0,
                line: Some(Line {
                    burst,
                    rate: rate_arg,
                    per_us,
                    look_us: if *kind == Kind::Gap {
                        0
                    } else {
                        LINE_LOOKAHEAD / 1000
                    },
                    refill_ms: u64::try_from(rate.refill_ns().div_ceil(1_000_000))
                        .unwrap_or(u64::MAX),
                }),
            })
        }
        (Item::Concurrency(c), _) => {
            let held = match st {
                ItemState::Concurrency(s) => s.clone(),
                _ => Default::default(),
            };
            // No period: one grant of slots for as long as the campaign lives.
            Some(LeaseView {
                start: 0,
                end: Nanos::MAX,
                committed: 0,
                pending: c.open(&held, now),
                total: c.max,
                slots: true,
                until: held.deadlines.last().copied().unwrap_or(0),
                line: None,
            })
        }
        _ => None,
    }
}

/// Whether a leasable campaign item is held as slots (`fc_slots_v1`): a
/// rolling window (each debit a slot held for the window's length) or
/// `max_in_flight`, as [`view`] makes them.
pub(crate) fn held_as_slots(item: &Item) -> bool {
    match item {
        Item::Window(w) => matches!(
            w.layout,
            Layout::Rolling { .. } | Layout::Approximate { .. }
        ),
        Item::Concurrency(_) => true,
        _ => false,
    }
}

/// The total an adaptive budget may be granted now under the fleet's plan:
/// its line a grant's life ahead, as [`view`] does for the other pacings.
pub(super) fn plan_total(b: &Budget, v: &LeaseView, anchor: Nanos, base: u64, now: Nanos) -> u64 {
    b.plan_cap(v.start, v.end, anchor, base, now.saturating_add(LEASE_TTL))
}
