//! The lease calls that give this node its grants, made before a decision
//! needs them ([`Engine::prepare_leases`]) and at renewal: units of a
//! period, token lines, slots and the fleet's adaptive plan.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::limits::Item;
use crate::limits::budget::{Budget, Pacing};
use crate::model::Scope;
use crate::store::{
    LeaseGrant, LeaseRequest, LineRequest, PlanRequest, Shared, SlotsRequest, StoreError, TotalRule,
};

use crate::engine::hot::Reads;
use crate::engine::registry::CampaignEntry;
use crate::engine::request::MAX_TTL_MS;
use crate::engine::{Engine, SpendReports};

use super::*;
use crate::engine::hot::Halt;

impl<C: Clock> Engine<C> {
    /// This node's name in leases: its id and its process's nonce, so a
    /// restarted node is a new holder (its old grant is reclaimed).
    pub(super) fn lease_holder(&self) -> String {
        format!("{}/{:08x}", self.options.node_id, self.id_nonce)
    }

    /// This node's holder name for units lease `key`, and the units it
    /// reported under earlier names: a name whose last call is
    /// [`REHOLD_AFTER`] old is left for a new one, reporting from what was
    /// confirmed under the old (a call applied whose answer was lost then
    /// counts twice: fewer units granted, never more). Also: the units
    /// committed of others' holds and given to others, as they are to be
    /// reported under that name (less what earlier names reported).
    pub(super) fn units_holder(&self, key: GrantKey, now: Nanos) -> (String, u64, (u64, u64)) {
        let mut grants = self.leases.lock();
        let g = grants.entry(key).or_default();
        if g.called_at != 0 && now >= g.called_at.saturating_add(REHOLD_AFTER) {
            g.holder_epoch += 1;
            g.base = g.reported;
            g.moved_base = (g.foreign, g.given_reported);
            g.called_at = 0;
        }
        let name = match g.holder_epoch {
            0 => self.lease_holder(),
            n => format!("{}/{n}", self.lease_holder()),
        };
        let moved = (
            g.foreign.saturating_sub(g.moved_base.0),
            g.given.saturating_sub(g.moved_base.1),
        );
        (name, g.base, moved)
    }

    /// What the fleet has committed on item `i` of campaign `e` in its
    /// current period, with a shared store and a leased item counted in
    /// units (budgets, fixed and calendar campaign-scope windows): what
    /// every holder reported (one read of the lease), plus what this node
    /// committed and has not reported yet (`spend_reports = "batched"`).
    /// `None` where the node's own record is the whole truth (no shared
    /// store, or an item not leased in units). Each node's record holds
    /// only its own commits: before, delivery answered a third of a
    /// campaign's spend on each of three nodes (docs/cluster.md).
    pub(crate) fn fleet_committed(
        &self,
        e: &CampaignEntry,
        i: usize,
        now: Nanos,
    ) -> Result<Option<u64>, StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(None);
        };
        if !leasable(&e.compiled.items[i].item) {
            return Ok(None);
        }
        let Some((key, v)) =
            campaign_view(&self.leases, e, i, now).filter(|(_, v)| !v.slots && v.line.is_none())
        else {
            return Ok(None);
        };
        let reported = self.leases.lock().get(&key).map_or(0, |g| g.reported);
        let fleet = shared.lease_spent(&lease_key(key))?;
        Ok(Some(fleet + v.committed.saturating_sub(reported)))
    }

    /// An adaptive budget's cap now under the fleet's plan, if this node has
    /// the plan of the current slice (a shared store only).
    pub(crate) fn fleet_plan_cap(&self, e: &CampaignEntry, i: usize, now: Nanos) -> Option<u64> {
        self.shared()?;
        let Item::Budget(b) = &e.compiled.items[i].item else {
            return None;
        };
        let (key, v) = campaign_view(&self.leases, e, i, now)?;
        let (anchor, base) = self.leases.lock().get(&key).and_then(|g| g.plan)?;
        (b.adaptive() && anchor >= b.slice_anchor(v.start, now))
            .then(|| b.plan_cap(v.start, v.end, anchor, base, now))
    }

    /// Calls the lease function for `key`, reporting `v.committed` and
    /// asking for `want` units of headroom, and records the grant.
    pub(super) fn lease_call(
        &self,
        shared: &dyn Shared,
        key: GrantKey,
        item: &Item,
        v: &LeaseView,
        want: u64,
        now: Nanos,
    ) -> Result<LeaseGrant, StoreError> {
        let ttl_ms = LEASE_TTL / 1_000_000;
        self.stats.lease_calls.fetch_add(1, Ordering::Relaxed);
        if v.slots {
            let hold_ms = v.until.saturating_sub(now).div_ceil(1_000_000) + 1_000;
            // In a region, at most the slots the global tier granted the
            // region (docs/regions.md, "Caps across regions").
            let max = self
                .region_total(key, v, now)
                .map_or(v.total, |t| t.min(v.total));
            let granted = shared
                .slots(&SlotsRequest {
                    key: &lease_key(key),
                    holder: &self.lease_holder(),
                    seq: self.leases.seq.fetch_add(1, Ordering::AcqRel) + 1,
                    used: v.pending,
                    want,
                    max,
                    ttl_ms,
                    hold_ms,
                    key_expire_ms: hold_ms.max(ttl_ms) + 3_600_000,
                })?
                .granted;
            self.record_grant(key, v, want, granted, ttl_ms, now);
            // A slot freed by a debit that aged out is taken again within
            // the node's grant: in a region, only while the region's own
            // grant is usable. Past it, the tier frees the region's slots
            // once the holds it knew of end, and one taken since would be
            // held twice (docs/regions.md, "Caps across regions").
            if let Some(until) = self.region_slots_until(key) {
                let mut grants = self.leases.lock();
                if let Some(g) = grants.get_mut(&key) {
                    g.usable_until = g.usable_until.min(until);
                }
            }
            return Ok(LeaseGrant {
                granted,
                spent_total: 0,
                usable_ms: ttl_ms,
                need_segments: false,
            });
        }
        // A hold made under a grant may be committed until its
        // reservation's deadline: the grant is reclaimed only after the
        // latest one this node has open (plus a second for the sweep that
        // learns of a commit elsewhere).
        let grace_ms = (self.reservations.latest_deadline().saturating_sub(now) / 1_000_000
            + 1_000)
            .min(MAX_TTL_MS);
        let (holder, base, (foreign, given)) = self.units_holder(key, now);
        // Once reclaimed, up to its bound of its headroom counts as spent:
        // with batched reports a node killed leaves that much unreported,
        // which the fleet spent again before (issue 25, R7).
        let reports_later = match self.options.spend_reports {
            SpendReports::Batched => Some(unreported_bound(item)).filter(|&b| b > 0),
            SpendReports::Commit => None,
        };
        if let Some(line) = v.line {
            // In a region, what the line grants is capped in the region's
            // store by the region's grant (docs/regions.md).
            let capped = self.region_line(key, v);
            let grant = shared.line(&LineRequest {
                key: &lease_key(key),
                holder: &holder,
                spent: v.committed.saturating_sub(base),
                want,
                burst: line.burst,
                rate: line.rate,
                per_us: line.per_us,
                look_us: line.look_us,
                ttl_ms,
                grace_ms,
                // An idle line is full again after its refill time: its key
                // may go then (and an hour more, as period leases).
                key_expire_ms: line.refill_ms.saturating_add(3_600_000),
                reports_later,
                capped,
            })?;
            let retry_at = now.saturating_add(grant.retry_ms.saturating_mul(1_000_000));
            self.leases.lock().entry(key).or_default().retry_at = retry_at;
            let granted = base.saturating_add(grant.granted);
            self.record_grant(key, v, want, granted, ttl_ms, now);
            return Ok(LeaseGrant {
                granted,
                spent_total: grant.spent_total,
                usable_ms: ttl_ms,
                need_segments: false,
            });
        }
        let key_expire_ms = v.end.saturating_sub(now) / 1_000_000 + 3_600_000;
        // An adaptive budget's total follows the fleet's plan, made once per
        // slice from the fleet's spend: a node's own record holds only its
        // own spend, a third of it on three nodes.
        let total = match item {
            Item::Budget(b) if b.adaptive() => {
                let (anchor, base) = self.fleet_plan(shared, key, b, v, key_expire_ms, now)?;
                plan_total(b, v, anchor, base, now)
            }
            _ => v.total,
        };
        // The total is computed by the store at its time where it can be
        // (fc_lease_v2): a node whose clock runs ahead is not granted a
        // budget's line ahead of Redis's.
        let rule = match item {
            // A hot key's total is the limit less what its frozen record
            // counted (`keys.rs`): the node's, as given.
            _ if matches!(key.0, Leased::Key { .. }) => TotalRule::Given,
            Item::Window(w) => TotalRule::Fixed(w.limit),
            Item::Budget(b) => match b.pacing {
                // A throttle's cap is the whole amount; its pass
                // probability is each node's, on the fleet's spend.
                Pacing::Asap | Pacing::Throttle(_) => TotalRule::Fixed(b.amount),
                // Over a schedule, even pacing weighs open time only: a
                // profile's rule, with the segments below.
                Pacing::Even if !b.within_schedule() => TotalRule::Even {
                    amount: b.amount,
                    allowance: b.allowance,
                    look_ms: LEASE_TTL / 1_000_000,
                },
                Pacing::Even | Pacing::Profile(_) => TotalRule::Weighted {
                    amount: b.amount,
                    allowance: b.allowance,
                    look_ms: LEASE_TTL / 1_000_000,
                },
                Pacing::Adaptive(_) => TotalRule::Planned {
                    amount: b.amount,
                    allowance: b.allowance,
                    look_ms: LEASE_TTL / 1_000_000,
                },
            },
            _ => TotalRule::Given,
        };
        // In a region (docs/regions.md), at most what the global tier
        // granted the region: a total of the node's, as given.
        let (total, rule) = match self.region_total(key, v, now) {
            Some(t) => (total.min(t), TotalRule::Given),
            None => (total, rule),
        };
        let segments = match (item, rule) {
            (Item::Budget(b), TotalRule::Weighted { .. } | TotalRule::Planned { .. }) => {
                self.leases.segments(key, b, v)
            }
            _ => None,
        };
        let lkey = lease_key(key);
        let request = |segments| LeaseRequest {
            key: &lkey,
            holder: &holder,
            spent: v.committed.saturating_sub(base),
            want,
            total,
            ttl_ms,
            // A hold made under a grant may be committed until its
            // reservation's deadline: the grant is reclaimed only after the
            // latest one this node has open (plus a second for the sweep
            // that learns of a commit elsewhere), not after the longest TTL
            // allowed (1 h), which stranded a dead node's headroom for the
            // rest of the period: 79-82 % of a budget delivered after a
            // node's kill -9 (issue 25).
            grace_ms,
            key_expire_ms,
            // Periods are whole ms (calendar bounds, window lengths); the end
            // rounded up keeps a period's last instant in it.
            period_ms: (v.start / 1_000_000, v.end.div_ceil(1_000_000)),
            rule,
            segments,
            reports_later,
            foreign,
            given,
        };
        let mut grant = shared.lease(&request(segments.as_ref().map(|(s, sent)| (&**s, !sent))))?;
        if let Some((seg, _)) = &segments {
            // The store lacks the weighted time (a new lease, or one whose
            // segments another definition replaced): once more with them.
            if grant.need_segments {
                grant = shared.lease(&request(Some((seg, true))))?;
            }
            if !grant.need_segments {
                self.leases.segments_stored(key);
            }
        }
        // The store's grant covers what this name spent and gave; the
        // node's counts include what earlier names did.
        let moved_base = self.leases.lock().get(&key).map_or(0, |g| g.moved_base.1);
        grant.granted = base
            .saturating_add(moved_base)
            .saturating_add(grant.granted);
        {
            let mut grants = self.leases.lock();
            let g = grants.entry(key).or_default();
            g.given_reported = g.given_reported.max(given.saturating_add(g.moved_base.1));
        }
        self.record_grant(key, v, want, grant.granted, grant.usable_ms, now);
        // A hot key's figures are the fleet's (`keys.rs`); a budget's
        // levers run on the fleet's spend.
        if matches!(key.0, Leased::Key { .. }) || matches!(item, Item::Budget(b) if b.has_levers())
        {
            self.leases.fleet_spend(key, grant.spent_total, v.committed);
        }
        Ok(grant)
    }

    /// Counts `n` units committed on item `tag` of campaign `e` if that is
    /// a token line this node leases (a campaign-scope rate, with a shared
    /// store): a line's count is the node's own ([`Leases::commit_line`]).
    /// Nothing on one node.
    pub(crate) fn count_on_line(&self, e: &CampaignEntry, tag: u32, n: u64) {
        if self.shared().is_none() {
            return;
        }
        if let Some(i) = e.tags.iter().position(|&t| t == tag)
            && let cap = &e.compiled.items[i]
            && cap.scope == Scope::Campaign
            && matches!(cap.item, Item::Rate { .. })
        {
            self.leases.commit_line((Leased::Campaign(e.id), tag, 0), n);
        }
    }

    /// Counts the committed units of `entries` (a winner's, taken from
    /// campaign `e`'s record) on its token lines, with a shared store.
    pub(crate) fn commit_lines(
        &self,
        e: &CampaignEntry,
        entries: &[crate::engine::record::PendingEntry],
    ) {
        for p in entries {
            self.count_on_line(e, p.tag, p.n);
        }
    }

    /// The fleet's adaptive plan (anchor, base) for the slice of `now`: the
    /// one this node has, or the store's (`fc_plan_v1`), which the first
    /// node in a new slice makes.
    pub(super) fn fleet_plan(
        &self,
        shared: &dyn Shared,
        key: GrantKey,
        b: &Budget,
        v: &LeaseView,
        key_expire_ms: u64,
        now: Nanos,
    ) -> Result<(Nanos, u64), StoreError> {
        let anchor = b.slice_anchor(v.start, now);
        let known = self.leases.lock().get(&key).and_then(|g| g.plan);
        if let Some((a, base)) = known
            && a >= anchor
        {
            return Ok((a, base));
        }
        const MS: Nanos = 1_000_000;
        let (prev_anchor_ms, prev_line) = match known {
            Some((a, base)) => (a / MS, b.plan_line_at(v.start, v.end, a, base, anchor)),
            None => (0, 0),
        };
        let (a_ms, base) = shared.plan(&PlanRequest {
            key: &lease_key(key),
            anchor_ms: anchor / MS,
            prev_anchor_ms,
            prev_line,
            key_expire_ms,
        })?;
        let plan = (a_ms.saturating_mul(MS), base);
        let mut grants = self.leases.lock();
        let g = grants.entry(key).or_default();
        g.plan = Some(plan);
        g.end = g.end.max(v.end);
        Ok(plan)
    }

    /// Notes a grant this node received.
    /// `usable_ms`: how long the store says it may be used (its life, or
    /// less near its period's end): the node uses 80 % of that.
    pub(super) fn record_grant(
        &self,
        key: GrantKey,
        v: &LeaseView,
        want: u64,
        granted: u64,
        usable_ms: u64,
        now: Nanos,
    ) {
        let mut grants = self.leases.lock();
        let g = grants.entry(key).or_default();
        g.granted = granted;
        g.reported = g.reported.max(v.committed);
        g.usable_until = now + LEASE_TTL.min(usable_ms.saturating_mul(1_000_000)) * 8 / 10;
        g.end = v.end;
        g.called_at = now;
        g.slots = v.slots;
        // Asked for more and got nothing: the total is used up (or held by
        // others) for now.
        if want > 0 && granted <= v.committed + g.given + v.pending {
            g.quiet_until = match v.line {
                // A line has nothing before its next unit: no call till
                // then (one call per allowed impression of a gap), but one
                // a second at most, so a unit given back is found.
                Some(_) => g.retry_at.clamp(now + 1_000_000, now + REPORT_EVERY),
                None => now + QUIET,
            };
        }
    }

    /// How many units to ask for: what the node committed in the last
    /// grant's life (its recent rate), at least `n` and 1, at most a quarter
    /// of the total (or `n` if more).
    pub(super) fn want(&self, key: GrantKey, v: &LeaseView, n: u64, now: Nanos) -> u64 {
        let mut grants = self.leases.lock();
        let g = grants.entry(key).or_default();
        let (at, before) = g.rate_mark;
        // What its grant was used for: units committed here, and holds
        // other nodes committed (with spread routing, most of them: counted
        // without them, a node asked for 1 unit at a time).
        let used = v.committed + g.given;
        let recent = if at == 0 || now <= at {
            0
        } else {
            let spent = used.saturating_sub(before);
            (u128::from(spent) * u128::from(LEASE_TTL) / u128::from(now - at)) as u64
        };
        if at == 0 || now.saturating_sub(at) >= LEASE_TTL {
            g.rate_mark = (now, used);
        }
        recent.max(n).max(1).min((v.total / 4).max(n).max(1))
    }

    /// The grants a decision on `chains` (each with its cost) is made
    /// against, each made ready first ([`Engine::prepare_leases`]): `None`
    /// on one node, where campaign records decide alone.
    /// [`Halt::NotInMemory`] if a grant needs a refresh (a call to the
    /// store) and `reads` is memory-only: nothing was held yet.
    pub(crate) fn leases_for<'c>(
        &self,
        chains: impl IntoIterator<Item = (&'c [Arc<CampaignEntry>], u64)>,
        now: Nanos,
        reads: Reads,
    ) -> Result<Option<&Leases>, Halt> {
        if self.shared().is_none() {
            return Ok(None);
        }
        for (chain, cost) in chains {
            if !self.prepare_leases(chain, cost, now, reads) {
                return Err(Halt::NotInMemory);
            }
        }
        Ok(Some(&self.leases))
    }

    /// Before a decision, outside every lock: makes sure each leased item of
    /// `chain` has a live grant with room for `cost` (refreshing those that
    /// have not, unless quiet). A refresh that fails leaves the grant as it
    /// is: the decision then denies on that item (never over-spends).
    ///
    /// With `reads` [`Reads::MemoryOnly`] (a decision on the executor) no
    /// grant is refreshed: `false` if one would have been, and the decision
    /// goes to a blocking thread instead.
    pub(crate) fn prepare_leases(
        &self,
        chain: &[Arc<CampaignEntry>],
        cost: u64,
        now: Nanos,
        reads: Reads,
    ) -> bool {
        let Some(shared) = self.shared() else {
            return true;
        };
        for e in chain {
            for (i, cap) in e.compiled.items.iter().enumerate() {
                if cap.scope != Scope::Campaign || !leasable(&cap.item) {
                    continue;
                }
                let n = crate::engine::chain::units(&cap.item, cost);
                let Some((key, v)) = campaign_view(&self.leases, e, i, now) else {
                    continue;
                };
                if !self.ready_grant(shared, key, &cap.item, &v, n, now, reads) {
                    return false;
                }
            }
        }
        true
    }

    /// Makes sure grant `key` (of `item`, as `v` sees it) is live with room
    /// for `n` units, refreshing it if not (unless quiet): `false` only if
    /// it needs a refresh and `reads` is memory-only. A refresh that fails
    /// leaves the grant as it was: the decision denies on it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ready_grant(
        &self,
        shared: &dyn Shared,
        key: GrantKey,
        item: &Item,
        v: &LeaseView,
        n: u64,
        now: Nanos,
        reads: Reads,
    ) -> bool {
        let fits = || {
            let grants = self.leases.lock();
            match grants.get(&key) {
                Some(g) => {
                    (now < g.usable_until && v.committed + g.given + v.pending + n <= g.granted)
                        || now < g.quiet_until
                }
                None => false,
            }
        };
        if fits() {
            return true;
        }
        if reads == Reads::MemoryOnly {
            return false;
        }
        // One refresh of a grant at a time; one waiting here finds the
        // grant refreshed by the one before it, mostly.
        let _one = self.leases.refreshing[refresh_stripe(key)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if fits() {
            return true;
        }
        // Slots: the ones it needs and one spare; units: its rate.
        let want = if v.slots {
            n + 1
        } else {
            self.want(key, v, n, now) + v.pending
        };
        if let Err(err) = self.lease_call(shared, key, item, v, want, now) {
            tracing::debug!("lease refresh of {:?} failed: {err}", key.0);
        }
        true
    }
}
