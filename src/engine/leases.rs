//! Leases: campaign-scope state with a shared store (docs/cluster.md,
//! "Leases"). A campaign's budget, campaign-scope window cap or
//! max_in_flight is never written per decision: each node holds a grant, a
//! number of units it may
//! spend in the current period, from a generic Redis Function
//! (`fc_lease_v1`) that hands out max-min fair shares of what is left of the
//! total. A node decides on its own campaign record as on one node, and an
//! item it leases allows only while the node's own use in the period (what
//! it committed plus what it holds pending) stays within its grant.
//!
//! Counters are absolute: a node reports the cumulative units it committed
//! in the period and receives its cumulative grant, so a retried call, or
//! one whose reply was lost, changes nothing (the delta version of the
//! prototype over-delivered 0.98 % for that reason; docs/cluster.md). Expiry is
//! by Redis's clock; a node's unspent grant goes back to the pool once it
//! expired and the node's open holds' deadlines passed, and ten minutes
//! later the holder is folded into a sum, so a lease holds its live holders
//! only ([`REHOLD_AFTER`]).
//!
//! A campaign-scope `rate` or `gap` is leased as a token line
//! (`fc_line_v1`): the line rises with Redis's clock, burst + r·(t − t0),
//! and a node is granted units of it as of now plus a short lookahead
//! ([`LINE_LOOKAHEAD`]); a gap is the line of burst 1, with no lookahead.
//! A node counts what it committed on a line itself ([`Leases::commit_line`]):
//! a rate's state (a TAT) holds no count.
//!
//! `max_in_flight` is leased as slots (`fc_slots_v1`): held, then given back,
//! so the node reports what it holds now rather than a cumulative count.
//!
//! Grant sizes adapt to each node's recent spend: a node asks for what it
//! spent in the last [`LEASE_TTL`] (at least the request's units and 1), at
//! most a quarter of the total, so busy nodes hold more and idle ones
//! little; what a node holds beyond its fair share it keeps until spent,
//! never longer than its grant lives.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::{Clock, Nanos};
use crate::limits::budget::{Budget, BudgetState, Levers, Pacing};
use crate::limits::window::{Layout, Window};
use crate::limits::{Item, ItemState, Kind};
use crate::model::Scope;
use crate::store::{
    LeaseGrant, LeaseRequest, LineRequest, PlanRequest, Segments, Shared, SlotsRequest, StoreError,
    TotalRule,
};

use super::hot::Reads;
use super::registry::CampaignEntry;
use super::request::MAX_TTL_MS;
use super::{Engine, SpendReports};

/// How long a grant lives (by Redis's clock); a node uses it for 80 % of
/// that by its own clock, so clock drift never makes it spend past expiry.
pub(crate) const LEASE_TTL: Nanos = 2_000_000_000;

/// After a refresh that granted nothing, no refresh for this long: without
/// it every refused request at exhaustion became a lease call (53 000 per
/// node in 40 s in the prototype; docs/cluster.md).
const QUIET: Nanos = 100_000_000;

/// How often a grant in use is renewed, its spend reported on the way
/// (with `spend_reports = "batched"`, the most spend a node killed leaves
/// unreported: one second's, plus a sweep).
const REPORT_EVERY: Nanos = 1_000_000_000;

/// With `spend_reports = "batched"`, the most of a leased item's limit a
/// node may have committed and not reported: one part in this many (a
/// budget's amount, a window's limit, a line's burst). A node killed then
/// leaves at most that much unreported, which the store counts as spent
/// once its grant is reclaimed (never granted again, so never delivered):
/// 0.1 % of a budget per node killed. Below 1 000 units the bound is 0 and
/// each commit is reported before it is acknowledged, as with `"commit"`.
const UNREPORTED_PARTS: u64 = 1000;

/// The most units of `item` a node may have committed unreported, with
/// batched spend reports ([`UNREPORTED_PARTS`]).
fn unreported_bound(item: &Item) -> u64 {
    let limit = match item {
        Item::Budget(b) => b.amount,
        Item::Window(w) => w.limit,
        Item::Rate { rate, .. } => rate.burst(),
        // Slots are held and given back, not reported as spend.
        Item::Concurrency(_) | Item::Adaptive(_) => 0,
    };
    limit / UNREPORTED_PARTS
}

/// How far ahead of now a token line (a campaign-scope rate) may be
/// granted: with a grant spent within 80 % of [`LEASE_TTL`] (1.6 s) of
/// asking, the fleet admits in any interval of length d at most
/// burst + r·(d + 2 s) (docs/cluster.md, "Leases"). Gaps have none.
pub(crate) const LINE_LOOKAHEAD: Nanos = 400_000_000;

/// A holder name unused this long is left for a new one. The store folds a
/// holder away (its spent summed, its fields deleted) 10 minutes after its
/// grant and open holds ended (`fold_dead`, src/cluster/functions.lua), so
/// a lease's state holds its live holders only; a name used again after
/// its fold would have its spent counted a second time. Half the fold's
/// delay leaves minutes of margin for clock error (cluster time holds it to
/// about a second).
const REHOLD_AFTER: Nanos = 300 * 1_000_000_000;

/// A grant: (campaign id, item tag, period start).
pub(crate) type GrantKey = (u32, u32, Nanos);

#[derive(Debug, Default, Clone)]
struct Grant {
    /// Cumulative units granted to this node in the period.
    granted: u64,
    /// The committed units last reported.
    reported: u64,
    /// Usable until (this node's clock).
    usable_until: Nanos,
    /// No refresh before (after one that granted nothing).
    quiet_until: Nanos,
    /// Committed at the previous refresh, and when: the spend rate.
    rate_mark: (Nanos, u64),
    /// The period's end: the lease key expires after it.
    end: Nanos,
    /// When this node last called for it.
    called_at: Nanos,
    /// When a decision last allowed on it.
    used_at: Nanos,
    /// Slots (given back when no longer held) rather than units.
    slots: bool,
    /// A token line: the units this node committed on it (its spend).
    line_committed: u64,
    /// A token line: when it has a unit more to grant (this node's clock).
    retry_at: Nanos,
    /// An adaptive budget: the fleet's plan (anchor, base) last received.
    plan: Option<(Nanos, u64)>,
    /// How many times this node took a new holder name for it
    /// ([`REHOLD_AFTER`]); 0: the node's own name.
    holder_epoch: u32,
    /// The units reported under earlier holder names: the node reports its
    /// committed units less these under the current one.
    base: u64,
    /// A profile or adaptive budget: its period's weighted time, and
    /// whether the store confirmed having it (then calls send its id only).
    segments: Option<(Arc<Segments>, bool)>,
    /// A budget with pacing levers: the fleet's spend the store last
    /// reported, and this node's committed units then.
    fleet: (u64, u64),
    /// A budget with pacing levers: its controller, run on the fleet's
    /// spend (docs/pacing.md, "Levers").
    pacer: BudgetState,
    /// Units this node committed of other nodes' holds (a reservation made
    /// elsewhere, committed here): reported, as the store's `o:`, before
    /// such a commit is acknowledged; spent, but not out of this grant.
    foreign: u64,
    /// Units of this node's holds other nodes committed (and reported as
    /// their `foreign`): taken out of this grant, never spent here (`r:`).
    given: u64,
    /// `given` as last reported.
    given_reported: u64,
    /// `foreign` and `given` reported under earlier holder names (as `base`
    /// is for spend).
    moved_base: (u64, u64),
}

/// This node's grants.
#[derive(Default)]
pub(crate) struct Leases {
    grants: Mutex<HashMap<GrantKey, Grant>>,
    /// Serializes reports per node (a commit waiting here finds its spend
    /// reported by the one before it: reports coalesce like a group commit).
    reporting: Mutex<()>,
    /// Numbers slots calls, so a late older one changes nothing.
    seq: std::sync::atomic::AtomicU64,
    /// Refreshes of one grant wait for each other (a grant's stripe, by
    /// its key's hash): the screens that find a grant short at once
    /// made one lease call each for it, and the store gave each a sliver.
    /// Measured on one node of three under load: 1 251 refreshes in 8 s,
    /// up to 9 in a row for one grant in the same state (issue 26).
    refreshing: [Mutex<()>; REFRESH_STRIPES],
}

/// Stripes of [`Leases::refreshing`] (32: the most `Default` makes for an
/// array). Two grants sharing a stripe only wait for each other.
const REFRESH_STRIPES: usize = 32;

/// What a leased item of a campaign looks like now: its period, this node's
/// use in it, and the total the cluster may be granted now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeaseView {
    pub start: Nanos,
    pub end: Nanos,
    pub committed: u64,
    pub pending: u64,
    pub total: u64,
    /// Slots (max_in_flight, `fc_slots_v1`: held, given back) rather than
    /// units spent in a period (`fc_lease_v1`).
    pub slots: bool,
    /// Slots only: when the latest open hold ends.
    pub until: Nanos,
    /// A token line (a campaign-scope rate or gap, `fc_line_v1`): its
    /// `committed` is what [`Leases`] counted, not the item's state.
    pub line: Option<Line>,
}

/// A token line's parameters: burst + `rate` units every `per_us` µs,
/// granted `look_us` ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Line {
    pub burst: u64,
    pub rate: u64,
    pub per_us: u64,
    pub look_us: u64,
    /// burst·T in ms, rounded up: the lease key outlives an idle line by it.
    pub refill_ms: u64,
}

/// Whether item `i` of campaign `e` is leased in units of a period (a
/// budget, a fixed or calendar campaign-scope window): the items whose
/// holds another node's commit charges ([`Engine::charge_foreign`]).
pub(crate) fn leased_in_units(e: &CampaignEntry, tag: u32) -> bool {
    e.tags.iter().zip(&e.compiled.items).any(|(&t, cap)| {
        t == tag
            && cap.scope == Scope::Campaign
            && match &cap.item {
                Item::Budget(_) => true,
                Item::Window(w) => !matches!(
                    w.layout,
                    Layout::Rolling { .. } | Layout::Approximate { .. }
                ),
                _ => false,
            }
    })
}

/// Whether an item is leased with a shared store: a campaign-scope window
/// (fixed and calendar ones as units per period, rolling ones as slots held
/// for the window's length), a budget paced `asap`, `even` or by a profile,
/// `max_in_flight` (slots), or a rate or gap (a token line). An adaptive
/// budget's plan is the fleet's, made in the store (`fc_plan_v1`): every
/// campaign-scope item is leasable.
pub(crate) fn leasable(item: &Item) -> bool {
    match item {
        Item::Window(_) | Item::Concurrency(_) | Item::Rate { .. } | Item::Budget(_) => true,
        // Never a campaign's (`CampaignDef::compile` refuses it).
        Item::Adaptive(_) => false,
    }
}

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

/// The total an adaptive budget may be granted now under the fleet's plan:
/// its line a grant's life ahead, as [`view`] does for the other pacings.
fn plan_total(b: &Budget, v: &LeaseView, anchor: Nanos, base: u64, now: Nanos) -> u64 {
    b.plan_cap(v.start, v.end, anchor, base, now.saturating_add(LEASE_TTL))
}

/// The stripe of [`Leases::refreshing`] grant `k` refreshes under.
fn refresh_stripe(k: GrantKey) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(k);
    (h % REFRESH_STRIPES as u64) as usize
}

/// A lease's key in the shared store.
fn lease_key(k: GrantKey) -> Vec<u8> {
    let mut v = Vec::with_capacity(17);
    v.push(b'l');
    v.extend_from_slice(&k.0.to_be_bytes());
    v.extend_from_slice(&k.1.to_be_bytes());
    v.extend_from_slice(&k.2.to_be_bytes());
    v
}

impl Leases {
    /// Reports one at a time ([`Leases::reporting`]).
    fn one_report(&self) -> std::sync::MutexGuard<'_, ()> {
        self.reporting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GrantKey, Grant>> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `n` more units fit this node's grant for `key` (at `now`),
    /// given its use `v`: what a decision checks, under the campaign's lock.
    pub(crate) fn allows(&self, key: GrantKey, v: &LeaseView, n: u64, now: Nanos) -> bool {
        let mut grants = self.lock();
        let Some(g) = grants.get_mut(&key) else {
            return false;
        };
        let committed = if v.line.is_some() {
            g.line_committed
        } else {
            v.committed
        };
        let ok = now < g.usable_until && committed + g.given + v.pending + n <= g.granted;
        if ok {
            g.used_at = now;
        }
        ok
    }

    /// A token line's retry time after a denial by this node's grant: when
    /// the line has a unit more to grant (`None`: not a line, or now).
    pub(crate) fn retry_after(&self, key: GrantKey, now: Nanos) -> Option<Nanos> {
        let grants = self.lock();
        let g = grants.get(&key)?;
        (g.retry_at > now).then(|| g.retry_at - now)
    }

    /// The levers' controller of budget `b` (grant `key`) as of `now`, run
    /// on the fleet's spend: what the store last reported, plus what this
    /// node (having committed `own` in the period) committed since. Each
    /// node runs its own on the fleet's figures, a second old at most
    /// ([`REPORT_EVERY`]), so the fleet's nodes move their levers alike.
    fn pacer(&self, key: GrantKey, b: &Budget, own: u64, now: Nanos) -> BudgetState {
        let mut grants = self.lock();
        let g = grants.entry(key).or_default();
        if g.pacer.end <= now || g.pacer.start != key.2 {
            let (start, end) = b.calendar.bounds(now);
            g.pacer = BudgetState {
                start,
                end,
                ..BudgetState::default()
            };
            g.end = g.end.max(end);
        }
        let (reported, own_then) = g.fleet;
        g.pacer.spent = reported.saturating_add(own.saturating_sub(own_then));
        g.pacer = b.current(&g.pacer, now);
        g.pacer
    }

    /// Budget `b`'s levers on the fleet's spend (see [`Leases::pacer`]):
    /// `st` is this node's record of it.
    pub(crate) fn levers(&self, key: (u32, u32), b: &Budget, st: &ItemState, now: Nanos) -> Levers {
        let own = b.current(&crate::limits::budget_state(st), now);
        b.levers_of_current(&self.pacer((key.0, key.1, own.start), b, own.spent, now))
    }

    /// Whether `n` units of `throttle` budget `b` pass the draw of the
    /// fleet's controller (this node's record of it `st`, with `pending`
    /// held on it).
    pub(crate) fn throttle_passes(
        &self,
        key: (u32, u32),
        b: &Budget,
        st: &ItemState,
        now: Nanos,
        n: u64,
    ) -> bool {
        let own = b.current(&crate::limits::budget_state(st), now);
        let mut fleet = self.pacer((key.0, key.1, own.start), b, own.spent, now);
        fleet.pending = own.pending;
        b.draw_passes(&fleet, now, n)
    }

    /// Notes the fleet's spend a lease call of budget `key` answered, with
    /// this node's committed units `own` as reported in it.
    fn fleet_spend(&self, key: GrantKey, spent_total: u64, own: u64) {
        self.lock().entry(key).or_default().fleet = (spent_total, own);
    }

    /// Counts `n` units committed on token line `key` by this node.
    pub(crate) fn commit_line(&self, key: GrantKey, n: u64) {
        let mut grants = self.lock();
        let g = grants.entry(key).or_default();
        g.line_committed += n;
        // A line has no period: its count must never be pruned (a node that
        // forgot it would spend its reported units again).
        g.end = Nanos::MAX;
    }

    /// `v` with a token line's committed units filled in from this node's
    /// count, and an adaptive budget's total from the fleet's plan when this
    /// node has the plan of the current slice (else [`Engine::lease_call`]
    /// gets it first).
    fn filled(&self, key: GrantKey, mut v: LeaseView, item: &Item, now: Nanos) -> LeaseView {
        if v.line.is_some() {
            v.committed = self.lock().get(&key).map_or(0, |g| g.line_committed);
        }
        if let Item::Budget(b) = item
            && b.adaptive()
            && let Some((anchor, base)) = self.lock().get(&key).and_then(|g| g.plan)
            && anchor >= b.slice_anchor(v.start, now)
        {
            v.total = plan_total(b, &v, anchor, base, now);
        }
        v
    }

    /// The weighted time of budget `b`'s period in `v`, made once per
    /// period, and whether the store has it.
    fn segments(&self, key: GrantKey, b: &Budget, v: &LeaseView) -> Option<(Arc<Segments>, bool)> {
        let mut grants = self.lock();
        let g = grants.entry(key).or_default();
        if g.segments.is_none() {
            const MS: Nanos = 1_000_000;
            let list = b.segments(v.start, v.end)?;
            let ms = list.into_iter().map(|(s, w)| (s / MS, w)).collect();
            g.segments = Some((Arc::new(Segments::new(ms)), false));
        }
        g.segments.clone()
    }

    /// Notes that the store has the weighted time of `key`.
    fn segments_stored(&self, key: GrantKey) {
        if let Some((_, stored)) = self.lock().get_mut(&key).and_then(|g| g.segments.as_mut()) {
            *stored = true;
        }
    }

    /// Drops the grants of periods that ended.
    fn prune(&self, now: Nanos) {
        self.lock().retain(|_, g| g.end > now);
    }
}

impl<C: Clock> Engine<C> {
    /// This node's name in leases: its id and its process's nonce, so a
    /// restarted node is a new holder (its old grant is reclaimed).
    fn lease_holder(&self) -> String {
        format!("{}/{:08x}", self.options.node_id, self.id_nonce)
    }

    /// This node's holder name for units lease `key`, and the units it
    /// reported under earlier names: a name whose last call is
    /// [`REHOLD_AFTER`] old is left for a new one, reporting from what was
    /// confirmed under the old (a call applied whose answer was lost then
    /// counts twice: fewer units granted, never more). Also: the units
    /// committed of others' holds and given to others, as they are to be
    /// reported under that name (less what earlier names reported).
    fn units_holder(&self, key: GrantKey, now: Nanos) -> (String, u64, (u64, u64)) {
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
    fn lease_call(
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
            let granted = shared.slots(&SlotsRequest {
                key: &lease_key(key),
                holder: &self.lease_holder(),
                seq: self.leases.seq.fetch_add(1, Ordering::AcqRel) + 1,
                used: v.pending,
                want,
                max: v.total,
                ttl_ms,
                hold_ms,
                key_expire_ms: hold_ms.max(ttl_ms) + 3_600_000,
            })?;
            self.record_grant(key, v, want, granted, ttl_ms, now);
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
            Item::Window(w) => TotalRule::Fixed(w.limit),
            Item::Budget(b) => match b.pacing {
                // A throttle's cap is the whole amount; its pass
                // probability is each node's, on the fleet's spend.
                Pacing::Asap | Pacing::Throttle(_) => TotalRule::Fixed(b.amount),
                Pacing::Even => TotalRule::Even {
                    amount: b.amount,
                    allowance: b.allowance,
                    look_ms: LEASE_TTL / 1_000_000,
                },
                Pacing::Profile(_) => TotalRule::Weighted {
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
        if let Item::Budget(b) = item
            && b.has_levers()
        {
            self.leases.fleet_spend(key, grant.spent_total, v.committed);
        }
        Ok(grant)
    }

    /// Counts the committed units of `entries` (a winner's, taken from
    /// campaign `e`'s record) on its token lines, with a shared store.
    pub(crate) fn commit_lines(&self, e: &CampaignEntry, entries: &[super::record::PendingEntry]) {
        if self.shared().is_none() {
            return;
        }
        for p in entries {
            let Some(i) = e.tags.iter().position(|&t| t == p.tag) else {
                continue;
            };
            let cap = &e.compiled.items[i];
            if cap.scope == Scope::Campaign && matches!(cap.item, Item::Rate { .. }) {
                self.leases.commit_line((e.id, p.tag, 0), p.n);
            }
        }
    }

    /// The fleet's adaptive plan (anchor, base) for the slice of `now`: the
    /// one this node has, or the store's (`fc_plan_v1`), which the first
    /// node in a new slice makes.
    fn fleet_plan(
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
    fn record_grant(
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
    fn want(&self, key: GrantKey, v: &LeaseView, n: u64, now: Nanos) -> u64 {
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
                let n = super::chain::units(&cap.item, cost);
                let Some((key, v)) = campaign_view(&self.leases, e, i, now) else {
                    continue;
                };
                let fits = || {
                    let grants = self.leases.lock();
                    match grants.get(&key) {
                        Some(g) => {
                            (now < g.usable_until
                                && v.committed + g.given + v.pending + n <= g.granted)
                                || now < g.quiet_until
                        }
                        None => false,
                    }
                };
                if fits() {
                    continue;
                }
                if reads == Reads::MemoryOnly {
                    return false;
                }
                // One refresh of a grant at a time; one waiting here finds
                // the grant refreshed by the one before it, mostly.
                let _one = self.leases.refreshing[refresh_stripe(key)]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if fits() {
                    continue;
                }
                // Slots: the ones it needs and one spare; units: its rate.
                let want = if v.slots {
                    n + 1
                } else {
                    self.want(key, &v, n, now) + v.pending
                };
                if let Err(err) = self.lease_call(shared, key, &cap.item, &v, want, now) {
                    tracing::debug!("lease refresh of campaign {} failed: {err}", e.id);
                }
            }
        }
        true
    }

    /// Reports this node's committed spend on the leased items of `chains`
    /// (after a commit or an event) where more is unreported than a node
    /// may leave (all of it with `spend_reports = "commit"`, beyond
    /// [`unreported_bound`] with `"batched"`), so a node that dies next
    /// loses none of it, or no more than the bound the store counts as
    /// spent. Reports coalesce: one waiting for another finds its spend
    /// reported and makes no call.
    pub(crate) fn report_spend<'a>(
        &self,
        chains: impl IntoIterator<Item = &'a Arc<CampaignEntry>>,
    ) -> Result<(), StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        let mut due: Vec<(&Arc<CampaignEntry>, usize)> = Vec::new();
        let now = self.now();
        for e in chains {
            if due.iter().any(|(d, _)| d.id == e.id) {
                continue;
            }
            for i in 0..e.compiled.items.len() {
                if self.spend_due(e, i, now).is_some() {
                    due.push((e, i));
                }
            }
        }
        if due.is_empty() {
            // Nothing past its bound (batched reports, most commits): no
            // wait on the reporting lock, which is held across round trips.
            return Ok(());
        }
        let _one = self.leases.one_report();
        let now = self.now();
        for (e, i) in due {
            // Again under the lock: a report made meanwhile may have
            // covered it.
            if let Some((key, v, want)) = self.spend_due(e, i, now) {
                self.lease_call(shared, key, &e.compiled.items[i].item, &v, want, now)?;
            }
        }
        Ok(())
    }

    /// Whether item `i` of campaign `e` has more spend unreported than this
    /// node may leave, and if so its grant, view and want (the headroom it
    /// holds, kept).
    fn spend_due(
        &self,
        e: &CampaignEntry,
        i: usize,
        now: Nanos,
    ) -> Option<(GrantKey, LeaseView, u64)> {
        let cap = &e.compiled.items[i];
        if cap.scope != Scope::Campaign || !leasable(&cap.item) {
            return None;
        }
        let (key, v) = campaign_view(&self.leases, e, i, now).filter(|(_, v)| !v.slots)?;
        let (reported, granted, given) = {
            let mut grants = self.leases.lock();
            if v.committed > grants.get(&key).map_or(0, |g| g.reported) {
                // Spend the renewal must report within a second, even on an
                // item this node holds no grant of (an event counted here):
                // it renews only the grants it knows. Before, an event's
                // spend on a budget above 1 000 units was never reported
                // (delivery read 7 on the node that counted it, 0 on the
                // others, for good).
                let g = grants.entry(key).or_default();
                g.end = g.end.max(v.end);
            }
            grants
                .get(&key)
                .map_or((0, 0, 0), |g| (g.reported, g.granted, g.given))
        };
        let may_leave = match self.options.spend_reports {
            SpendReports::Batched => unreported_bound(&cap.item),
            SpendReports::Commit => 0,
        };
        (v.committed.saturating_sub(reported) > may_leave).then(|| {
            (
                key,
                v,
                granted.saturating_sub(v.committed).saturating_sub(given),
            )
        })
    }

    /// The sweeper's part (every 250 ms): renews the grants in use,
    /// reporting their spend, and forgets ended periods.
    pub(crate) fn renew_leases(&self) {
        self.renew_leases_as(false);
    }

    /// At a clean shutdown: reports every unit committed and not reported
    /// yet, and every hold given up, so the fleet reads them at once and
    /// counts no headroom of this node as spent once it is reclaimed.
    pub fn report_all_spend(&self) {
        self.renew_leases_as(true);
    }

    /// Units committed on this node and not reported to the store yet, over
    /// every leased item: what other nodes' delivery, usage and timelines
    /// lack now (`freqcap_unreported_units`; each is reported within a
    /// second of its commit, docs/cluster.md).
    pub fn unreported_units(&self) -> u64 {
        if self.shared().is_none() {
            return 0;
        }
        let now = self.now();
        let keys: Vec<(GrantKey, u64)> = self
            .leases
            .lock()
            .iter()
            .filter(|(_, g)| !g.slots)
            .map(|(k, g)| (*k, g.reported))
            .collect();
        let reg = self.registry();
        keys.into_iter()
            .filter_map(|(key, reported)| {
                let e = reg.campaign_by_id(key.0)?;
                let i = e.tags.iter().position(|&t| t == key.1)?;
                let (_, v) = campaign_view(&self.leases, e, i, now)
                    .filter(|(k, v)| *k == key && v.line.is_none())?;
                Some(v.committed.saturating_sub(reported))
            })
            .sum()
    }

    fn renew_leases_as(&self, all: bool) {
        let Some(shared) = self.shared() else {
            return;
        };
        let now = self.now();
        self.leases.prune(now);
        // Few: one per leased item per period this node decided on.
        let due: Vec<GrantKey> = self.leases.lock().keys().copied().collect();
        let reg = self.registry();
        for key in due {
            let Some(e) = reg.campaign_by_id(key.0) else {
                continue;
            };
            let Some(i) = e.tags.iter().position(|&t| t == key.1) else {
                continue;
            };
            let Some((_, v)) = campaign_view(&self.leases, e, i, now).filter(|(k, _)| *k == key)
            else {
                continue;
            };
            let Some(g) = self.leases.lock().get(&key).cloned() else {
                continue;
            };
            // Only grants in use: one used since the last call is renewed
            // before it lapses, and unreported spend is reported once a
            // second. An idle grant is left to lapse; its headroom stays this
            // node's, and the next decision that needs it refreshes it.
            let lapsing = g.usable_until <= now + LEASE_TTL / 4;
            let in_use = g.used_at >= g.called_at;
            let due = if v.slots {
                // Slots held beyond those in use (and a spare while
                // decisions use the grant) go back once a second, so an
                // idle node keeps none.
                (lapsing && in_use)
                    || (g.granted > v.pending + u64::from(in_use)
                        && now >= g.called_at.saturating_add(REPORT_EVERY))
            } else {
                // Units given to other nodes are reported as spend is: until
                // then the store counts them twice (fewer granted, never
                // more).
                // Given units at the next tick (250 ms): while unreported
                // they are counted twice, and a burst of spread commits
                // near a budget's end found the pool short (140 of 200 in
                // `leased_budgets_and_campaign_caps_hold_across_nodes`
                // when they waited for the 1 s renewal).
                let unreported = g.reported < v.committed;
                (lapsing && in_use)
                    || g.given_reported < g.given
                    || (unreported
                        && (all || lapsing || now >= g.called_at.saturating_add(REPORT_EVERY)))
            };
            if !due {
                continue;
            }
            let want = if v.slots {
                u64::from(in_use)
            } else {
                self.want(key, &v, 1, now) + v.pending
            };
            if let Err(err) = self.lease_call(shared, key, &e.compiled.items[i].item, &v, want, now)
            {
                tracing::debug!("lease renewal of campaign {} failed: {err}", key.0);
            }
        }
    }

    /// Charges the campaign-side spend of `winners`, committed here of a
    /// reservation another node made (its holds are in that node's grants):
    /// each leased item's units are reported at once as this node's
    /// `foreign` (spent, not out of its grant), so they count even if that
    /// node dies before its deadline; it gives its holds up when it learns
    /// of the commit ([`Engine::give_up_hold`]). An error: nothing more is
    /// reported, and the commit is not acknowledged (a report applied whose
    /// answer was lost counts the units twice: fewer granted, never more).
    pub(crate) fn charge_foreign(
        &self,
        winners: &[super::placement::ForeignWinner],
        final_cost: Option<u64>,
    ) -> Result<(), StoreError> {
        let Some(shared) = self.shared() else {
            return Ok(());
        };
        let reg = self.registry();
        let _one = self.leases.one_report();
        let now = self.now();
        for w in winners {
            let Some(chain) = reg.chain_by_id(w.campaign) else {
                continue;
            };
            // Budgets are charged the final cost, else what was reserved
            // (docs/semantics.md §6.5); caps the impression.
            let cost = final_cost.unwrap_or(w.cost);
            for e in chain.iter() {
                for (i, cap) in e.compiled.items.iter().enumerate() {
                    if cap.scope != Scope::Campaign || !leasable(&cap.item) {
                        continue;
                    }
                    let Some((key, v)) = campaign_view(&self.leases, e, i, now)
                        .filter(|(_, v)| !v.slots && v.line.is_none())
                    else {
                        continue;
                    };
                    let n = super::chain::units(&cap.item, cost);
                    let want = {
                        let mut grants = self.leases.lock();
                        let g = grants.entry(key).or_default();
                        g.foreign += n;
                        g.granted
                            .saturating_sub(v.committed)
                            .saturating_sub(g.given)
                    };
                    if let Err(err) = self.lease_call(shared, key, &cap.item, &v, want, now) {
                        let mut grants = self.leases.lock();
                        let g = grants.entry(key).or_default();
                        g.foreign = g.foreign.saturating_sub(n);
                        return Err(err);
                    }
                }
            }
        }
        Ok(())
    }

    /// Gives up `n` units this node holds on item `tag` of campaign `e`
    /// (its state `st`, as of `at`), committed and charged by another node
    /// ([`Engine::charge_foreign`]): out of this node's grant, never spent
    /// here. Reported with the grant's next renewal.
    pub(crate) fn give_up_hold(
        &self,
        e: &CampaignEntry,
        tag: u32,
        st: &ItemState,
        n: u64,
        at: Nanos,
    ) {
        let Some(i) = e.tags.iter().position(|&t| t == tag) else {
            return;
        };
        let Some(v) = view(&e.compiled.items[i].item, st, 0, at) else {
            return;
        };
        self.leases
            .lock()
            .entry((e.id, tag, v.start))
            .or_default()
            .given += n;
    }

    /// This node's grants now (figures): how many, and units held beyond
    /// what was reported spent.
    pub fn grants_outstanding(&self) -> (usize, u64) {
        let g = self.leases.lock();
        (
            g.len(),
            g.values()
                .map(|g| g.granted.saturating_sub(g.reported).saturating_sub(g.given))
                .sum(),
        )
    }
}

/// The grant key and [`LeaseView`] of item `i` of campaign `e` now (read
/// under the campaign's lock, held for just that).
fn campaign_view(
    leases: &Leases,
    e: &CampaignEntry,
    i: usize,
    now: Nanos,
) -> Option<(GrantKey, LeaseView)> {
    let tag = e.tags[i];
    let v = {
        let rec = e.record.lock().unwrap_or_else(PoisonError::into_inner);
        let st = rec.state(e.id, tag).unwrap_or(&super::chain::FRESH);
        view(
            &e.compiled.items[i].item,
            st,
            rec.pending_on(e.id, tag),
            now,
        )
    }?;
    let key = (e.id, tag, v.start);
    Some((key, leases.filled(key, v, &e.compiled.items[i].item, now)))
}
