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

//!
//! Where each part lives: what a leased item looks like now (`view.rs`,
//! pure); the calls that renew grants (`calls.rs`); spend reported, and
//! holds charged or given up (`reports.rs`).

mod calls;
mod keys;
mod region_board;
mod region_caps;
mod regions;
mod reports;
mod view;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::clock::Nanos;
use crate::limits::budget::{Budget, BudgetState, Levers};
use crate::limits::window::Layout;
use crate::limits::{Item, ItemState};
use crate::model::Scope;
use crate::store::Segments;

use crate::engine::registry::CampaignEntry;

pub(crate) use regions::Regions;
pub use regions::{REGION_TTL, RegionFigures, SafeCapacity};
use view::plan_total;
pub(crate) use view::view;

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

/// A grant: (what is leased, item tag, period start).
pub(crate) type GrantKey = (Leased, u32, Nanos);

/// Whose items a grant is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Leased {
    /// A campaign's (by id): its campaign-scope items.
    Campaign(u32),
    /// A hot policy key's (`keys.rs`): the key's hash, and when the store
    /// froze its record (ms, Redis's clock), so a key frozen again after
    /// a reset or its marker's expiry starts on fresh leases.
    Key { hash: u128, since_ms: u64 },
}

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

/// The stripe of [`Leases::refreshing`] grant `k` refreshes under.
fn refresh_stripe(k: GrantKey) -> usize {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(k);
    (h % REFRESH_STRIPES as u64) as usize
}

/// A lease's key in the shared store.
fn lease_key(k: GrantKey) -> Vec<u8> {
    let mut v = Vec::with_capacity(41);
    match k.0 {
        // A campaign's keys are those of every build before hot keys.
        Leased::Campaign(id) => {
            v.push(b'l');
            v.extend_from_slice(&id.to_be_bytes());
        }
        Leased::Key { hash, since_ms } => {
            v.push(b'h');
            v.extend_from_slice(&hash.to_be_bytes());
            v.extend_from_slice(&since_ms.to_be_bytes());
        }
    }
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
        b.levers_of_current(&self.pacer(
            (Leased::Campaign(key.0), key.1, own.start),
            b,
            own.spent,
            now,
        ))
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
        let mut fleet = self.pacer(
            (Leased::Campaign(key.0), key.1, own.start),
            b,
            own.spent,
            now,
        );
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
        let st = rec.state(e.id, tag).unwrap_or(&crate::engine::chain::FRESH);
        view(
            &e.compiled.items[i].item,
            st,
            rec.pending_on(e.id, tag),
            now,
        )
    }?;
    let key = (Leased::Campaign(e.id), tag, v.start);
    Some((key, leases.filled(key, v, &e.compiled.items[i].item, now)))
}
