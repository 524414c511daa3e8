//! `concurrency`: how many reservations may be open at once (docs/semantics.md §2.4).

use crate::clock::Nanos;

/// A compiled concurrency item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    pub max: u64,
}

/// The deadlines of the open reservations holding a slot, in ascending order.
/// 24 bytes plus 8 per open reservation (at most `max`). Deadlines are needed, not
/// just a count, because `retry_after` is the earliest one and `reset_after` the
/// latest one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrencyState {
    pub deadlines: Vec<Nanos>,
}

impl Concurrency {
    /// Open reservations at `now`: a deadline ≤ now has expired (docs/semantics.md §4.4).
    pub fn open(&self, st: &ConcurrencyState, now: Nanos) -> u64 {
        let expired = st.deadlines.partition_point(|&d| d <= now);
        (st.deadlines.len() - expired) as u64
    }

    /// Allowed iff one more slot fits (reserve) or a slot is free (immediate).
    /// Both conditions are `open < max`.
    pub fn allows(&self, st: &ConcurrencyState, now: Nanos) -> bool {
        self.open(st, now) < self.max
    }

    /// (remaining, reset_after): the latest open deadline − now.
    pub fn figures(&self, st: &ConcurrencyState, now: Nanos) -> (u64, Nanos) {
        let open = self.open(st, now);
        let reset = if open == 0 {
            0
        } else {
            st.deadlines.last().map_or(0, |d| d - now)
        };
        (self.max.saturating_sub(open), reset)
    }

    /// retry_after of a denial: when enough open slots have ended for one
    /// more to fit — the earliest open deadline when exactly `max` are open,
    /// a later one when more are (a priority class's lower ceiling, or a
    /// `max` lowered by a redefinition).
    pub fn retry(&self, st: &ConcurrencyState, now: Nanos) -> Option<Nanos> {
        let expired = st.deadlines.partition_point(|&d| d <= now);
        let open = &st.deadlines[expired..];
        let must_end = (open.len() as u64 + 1).saturating_sub(self.max);
        let k = usize::try_from(must_end).ok()?.checked_sub(1)?;
        open.get(k).map(|d| d - now)
    }

    /// Takes a slot until `deadline`, dropping expired deadlines on the way.
    pub fn hold(&self, st: &mut ConcurrencyState, deadline: Nanos, now: Nanos) {
        let expired = st.deadlines.partition_point(|&d| d <= now);
        st.deadlines.drain(..expired);
        let at = st.deadlines.partition_point(|&d| d <= deadline);
        st.deadlines.insert(at, deadline);
    }

    /// Frees the slot held until `deadline` (commit, release or expiry). A slot
    /// already dropped as expired is not freed twice.
    pub fn free(&self, st: &mut ConcurrencyState, deadline: Nanos) {
        if let Ok(i) = st.deadlines.binary_search(&deadline) {
            st.deadlines.remove(i);
        }
    }

    pub fn idle_at(&self, st: &ConcurrencyState) -> Nanos {
        st.deadlines.last().copied().unwrap_or(0)
    }
}
