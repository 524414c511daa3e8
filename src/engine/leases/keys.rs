//! Hot keys' grants (docs/cluster.md, "Hot keys"): a policy key frozen as
//! hot (`crate::engine::placement::leased`) is decided by each node on a
//! record of its own, and each of its items allows only within this node's
//! grant, leased as a campaign's are: a fixed or calendar window (or a
//! budget) as units of its period (`fc_lease_v2`: the fleet is never over
//! its limit), a rolling window as slots held for its length
//! (`fc_slots_v1`), a rate or gap as a token line (`fc_line_v1`, granted
//! [`HOT_LINE_LOOKAHEAD_US`] ahead: over a run of length d at most one
//! burst + r·(d + 100 ms), and one burst more at the switch). What the frozen record counted
//! in the current period is the fleet's already: the total leased is the
//! limit less that.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::clock::{Clock, Nanos, Span};
use crate::engine::Engine;
use crate::engine::chain::{FRESH, units};
use crate::engine::hot::Reads;
use crate::engine::placement::{FREEZE_HOLD, HotKey};
use crate::engine::record::SubjectRecord;
use crate::limits::stack::{Decision, Stack};
use crate::limits::{Hold, Item, ItemState};
use crate::store::Shared;

use super::*;

/// How far ahead of now a hot key's token line is granted: less than a
/// campaign's ([`LINE_LOOKAHEAD`], 400 ms), since the fleet runs ahead of
/// the line by this much at most and a rate limit's callers read every
/// unit over as an error: at 200/s over three nodes, 400 ms let 790 through
/// against a line of 706 in 3.4 s (+11.9 %). More lease calls instead (a
/// busy node renews once per this much of its rate).
const HOT_LINE_LOOKAHEAD_US: u64 = 100_000;

/// When a node's grant of a hot key has no room but the fleet may have
/// some: a retry soon may find a refreshed grant.
const GRANT_RETRY: Span = 100_000_000;

impl<C: Clock> Engine<C> {
    /// The grant key and [`LeaseView`] of item `item` (tag `tag` of
    /// `def_id`) of hot key `hk`, whose record on this node is `own`.
    pub(crate) fn hot_view(
        &self,
        hk: &HotKey,
        own: &SubjectRecord,
        def_id: u32,
        tag: u32,
        item: &Item,
        now: Nanos,
    ) -> Option<(GrantKey, LeaseView)> {
        if !leasable(item) {
            return None;
        }
        let state =
            |r: &SubjectRecord| -> ItemState { r.state(def_id, tag).unwrap_or(&FRESH).clone() };
        let mut v = view(item, &state(own), own.pending_on(def_id, tag), now)?;
        if let Some(l) = v.line.as_mut() {
            l.look_us = l.look_us.min(HOT_LINE_LOOKAHEAD_US);
        }
        // What the frozen record counted is the fleet's already: in the
        // same period (units), or still live (a rolling window's slots). A
        // token line starts full (its bound covers one burst more).
        if let Some(s) = view(item, &state(&hk.seed), hk.seed.pending_on(def_id, tag), now) {
            if v.slots {
                v.total = v.total.saturating_sub(s.pending);
            } else if v.line.is_none() && s.start == v.start {
                v.total = v.total.saturating_sub(s.committed + s.pending);
            }
        }
        let key = (
            Leased::Key {
                hash: hk.hash,
                since_ms: hk.since_ms,
            },
            tag,
            v.start,
        );
        Some((key, self.leases.filled(key, v, item, now)))
    }

    /// Before a decision of `cost` on hot key `hk` by `stack` (of `def_id`,
    /// tags `tags`), outside its record's lock: each leased item's grant is
    /// made ready ([`Engine::ready_grant`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare_hot(
        &self,
        shared: &dyn Shared,
        hk: &HotKey,
        def_id: u32,
        stack: &Stack,
        tags: &[u32],
        cost: u64,
        now: Nanos,
    ) {
        for (item, &t) in stack.items().iter().zip(tags) {
            let Some((key, v)) = ({
                let own = hk.own.lock().unwrap_or_else(PoisonError::into_inner);
                self.hot_view(hk, &own, def_id, t, item, now)
            }) else {
                continue;
            };
            self.ready_grant(
                shared,
                key,
                item,
                &v,
                units(item, cost),
                now,
                Reads::MayWait,
            );
        }
    }

    /// The items of `stack` whose grant on hot key `hk` (this node's record
    /// of it `own`) has no room for `cost`, each with when to retry: a token
    /// line's next unit, the period's end once the fleet's total is spent,
    /// else [`GRANT_RETRY`]. Empty: every grant allows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hot_refusals(
        &self,
        hk: &HotKey,
        own: &SubjectRecord,
        def_id: u32,
        stack: &Stack,
        tags: &[u32],
        cost: u64,
        now: Nanos,
    ) -> Vec<(usize, Span)> {
        let mut out = Vec::new();
        for (i, (item, &t)) in stack.items().iter().zip(tags).enumerate() {
            let Some((key, v)) = self.hot_view(hk, own, def_id, t, item, now) else {
                continue;
            };
            let n = units(item, cost);
            if self.leases.allows(key, &v, n, now) {
                continue;
            }
            // Made ready before the record's lock, then spent by this
            // node's other decisions in between (a new grant is sized to
            // the node's recent rate: 1 unit at first): refreshed once
            // more, under the lock. Without it, a descriptor with room for
            // the fleet was denied 2 times in 60 in
            // `envoys_rate_limit_service_is_all_or_nothing_across_nodes`.
            if let Some(shared) = self.shared()
                && self.ready_grant(shared, key, item, &v, n, now, Reads::MayWait)
                && self.leases.allows(key, &v, n, now)
            {
                continue;
            }
            let retry = match self.leases.retry_after(key, now) {
                Some(r) => Span::from(r),
                None if !v.slots && v.line.is_none() && self.fleet_left(key, &v) < n => {
                    Span::from(v.end.saturating_sub(now))
                }
                None => GRANT_RETRY,
            };
            out.push((i, retry));
        }
        out
    }

    /// The denial of a decision on hot key `hk` (this node's record of it
    /// `own`) by the grants of `refusals` ([`Engine::hot_refusals`]): the
    /// figures as they are, each refusing item denying with its retry.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hot_denial(
        &self,
        hk: &HotKey,
        own: &SubjectRecord,
        def_id: u32,
        stack: &Stack,
        tags: &[u32],
        class: crate::limits::priority::Priority,
        refusals: &[(usize, Span)],
        now: Nanos,
    ) -> Decision {
        let mut states: smallvec::SmallVec<[ItemState; 4]> = tags
            .iter()
            .map(|&t| own.state(def_id, t).cloned().unwrap_or_default())
            .collect();
        let (mut d, _) = stack.decide_as(&mut states, now, 0, Hold::Immediate, class);
        d.allowed = false;
        let mut retry = 0;
        for &(i, r) in refusals {
            if let Some(f) = d.items.get_mut(i) {
                f.allowed = false;
                f.retry_after = Some(r);
            }
            retry = retry.max(r);
        }
        d.retry_after = Some(retry);
        self.hot_figures(hk, own, def_id, stack, tags, &mut d, now);
        d
    }

    /// A decision's figures on hot key `hk` as the fleet's: what a leased
    /// window or budget has left is the fleet's total less the fleet's
    /// spend as the store last answered (a second old at most) and this
    /// node's since, not this node's record's alone. A token line's and a
    /// rolling window's stay this node's.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn hot_figures(
        &self,
        hk: &HotKey,
        own: &SubjectRecord,
        def_id: u32,
        stack: &Stack,
        tags: &[u32],
        d: &mut Decision,
        now: Nanos,
    ) {
        for (i, (item, &t)) in stack.items().iter().zip(tags).enumerate() {
            if let Some((key, v)) = self.hot_view(hk, own, def_id, t, item, now)
                && !v.slots
                && v.line.is_none()
                && let Some(f) = d.items.get_mut(i)
            {
                f.remaining = f.remaining.min(self.fleet_left(key, &v));
            }
        }
        d.remaining = d
            .items
            .iter()
            .map(|f| f.remaining)
            .min()
            .unwrap_or(d.remaining);
    }

    /// What is left of the fleet's total of units grant `key` (as `v` sees
    /// it): the total less the fleet's spend the store last answered and
    /// what this node committed since.
    pub(crate) fn fleet_left(&self, key: GrantKey, v: &LeaseView) -> u64 {
        let (fleet, own_then) = self.leases.lock().get(&key).map_or((0, 0), |g| g.fleet);
        let spent = fleet.saturating_add(v.committed.saturating_sub(own_then));
        v.total.saturating_sub(spent).saturating_sub(v.pending)
    }

    /// Counts `cost` committed on the token lines of `stack` on hot key `hk`
    /// (a line's count is the node's own, [`Leases::commit_line`]).
    pub(crate) fn count_hot_lines(&self, hk: &HotKey, stack: &Stack, tags: &[u32], cost: u64) {
        for (item, &t) in stack.items().iter().zip(tags) {
            if matches!(item, Item::Rate { .. }) {
                let key = (
                    Leased::Key {
                        hash: hk.hash,
                        since_ms: hk.since_ms,
                    },
                    t,
                    0,
                );
                self.leases.commit_line(key, units(item, cost));
            }
        }
    }

    /// Every leased item of hot key `hk` this node decided on, as it is
    /// now: its grant key and view, and the item (a stack and its index).
    fn hot_items(&self, hk: &HotKey, now: Nanos) -> Vec<(GrantKey, LeaseView, Arc<Stack>, usize)> {
        let stacks = hk
            .stacks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let own = hk
            .own
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut out = Vec::new();
        for (def_id, stack, tags) in &stacks {
            for (i, (item, &t)) in stack.items().iter().zip(tags).enumerate() {
                if let Some((key, v)) = self.hot_view(hk, &own, *def_id, t, item, now) {
                    out.push((key, v, stack.clone(), i));
                }
            }
        }
        out
    }

    /// What hot key `hk`'s freeze must live until for what this node leases
    /// under it now: a window's period's end (or a rolling window's length,
    /// or a line's refill), and [`FREEZE_HOLD`] past now at least, so it
    /// never ends inside a period the fleet leased.
    pub(crate) fn hot_until(&self, hk: &HotKey, now: Nanos) -> Nanos {
        let ends = self
            .hot_items(hk, now)
            .into_iter()
            .map(|(_, v, _, _)| match v.line {
                Some(l) => now.saturating_add(l.refill_ms.saturating_mul(1_000_000)),
                None if v.slots => v.until,
                None => v.end,
            });
        ends.fold(now, Nanos::max).saturating_add(FREEZE_HOLD)
    }

    /// The sweeper's part for hot keys: extends the freezes in use, renews
    /// their grants as a campaign's are ([`Engine::renew_grant`]), and
    /// forgets a key whose freeze ended unused.
    pub(super) fn renew_hot_keys(&self, shared: &dyn Shared, all: bool, now: Nanos) {
        for hk in self.hot_keys.all() {
            let used = hk.used_at.load(Ordering::Acquire);
            let in_use = used.saturating_add(LEASE_TTL) >= now;
            if in_use
                && self.hot_due(&hk, now)
                && let Err(e) = self.extend_hot(shared, &hk, now)
            {
                tracing::debug!(
                    "extending hot key {:032x} failed: {:?}",
                    hk.hash,
                    e.into_error()
                );
            }
            for (key, v, stack, i) in self.hot_items(&hk, now) {
                self.renew_grant(shared, key, &stack.items()[i], &v, all, now);
            }
            // Unused past its freeze's end as this node knows it: forgotten
            // once the store says the freeze ended, never before. A key
            // forgotten while its freeze stood would be learned again with
            // an empty record of this node's under the same leases, whose
            // grants count what it spent: spent twice (1 002 of 1 000 in
            // `one_envoy_descriptor_decided_on_three_nodes_at_once_is_leased_exactly`
            // when a key just learned, not yet used, was forgotten).
            if !hk.usable(now)
                && used.saturating_add(FREEZE_HOLD) < now
                && let Err(e) = self.hot_stands(shared, &hk)
            {
                tracing::debug!(
                    "reading hot key {:032x} failed: {:?}",
                    hk.hash,
                    e.into_error()
                );
            }
        }
    }

    /// Units committed on hot keys here and not reported to the store yet.
    pub(super) fn hot_unreported(&self, now: Nanos) -> u64 {
        let mut sum = 0;
        for hk in self.hot_keys.all() {
            for (key, v, _, _) in self.hot_items(&hk, now) {
                if !v.slots && v.line.is_none() {
                    let reported = self.leases.lock().get(&key).map_or(0, |g| g.reported);
                    sum += v.committed.saturating_sub(reported);
                }
            }
        }
        sum
    }
}
