//! A store several nodes share (docs/cluster.md): records versioned and
//! written by compare-and-set, so that nodes deciding on the same subject
//! never both win. [`crate::cluster::RedisStore`] is the real one;
//! [`SharedMemory`] is the same contract in one process, for tests of the
//! engine's shared path without a Redis.
//!
//! The engine holds, per record, the version of the shared copy it decided
//! on. A write names that version; when another node wrote since, the store
//! answers with the current copy ([`Cas::Conflict`]) and the engine decides
//! again on it. Nothing in a shared store knows what a record means.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::{Batch, KeyValues, MemoryStore, Receipt, Space, Store, StoreError, StoreStats};
use crate::clock::Nanos;

/// A shared store's calls, for metrics (`freqcap_redis_*`): kept here, by
/// the store seam, so that neither the generic store nor the metrics need
/// the Redis module.
#[derive(Debug, Default)]
pub struct CallStats {
    pub calls: AtomicU64,
    /// Calls that failed (connection, cluster down, a script error).
    pub errors: AtomicU64,
    /// Calls past their deadline.
    pub timeouts: AtomicU64,
    /// Sum of call latencies, µs (with `calls`, the mean).
    pub latency_us: AtomicU64,
    /// Calls by latency: ≤ 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100 ms, more.
    pub latency_buckets: [AtomicU64; 10],
    /// Writes a replica did not confirm in time (`replicated`, `fsync`).
    pub unreplicated: AtomicU64,
}

/// Upper bounds of [`CallStats::latency_buckets`], µs.
pub const LATENCY_BOUNDS_US: [u64; 9] = [
    250, 500, 1_000, 2_000, 5_000, 10_000, 25_000, 50_000, 100_000,
];

/// The answer to a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// Written; the record's new version.
    Written(u64),
    /// Another write came first: the current version and value (`None`: the
    /// record is absent, version 0).
    Conflict {
        version: u64,
        value: Option<Vec<u8>>,
    },
    /// Owner mode: a later owner (this epoch) claimed the record; nothing
    /// was written.
    Fenced(u64),
}

/// The answer to an owner's claim of a record ([`Shared::own`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owned {
    /// Claimed: the record's version after the claim, and its value (`None`:
    /// it has none yet).
    Claimed {
        version: u64,
        value: Option<Vec<u8>>,
    },
    /// A later owner (this epoch) claimed it.
    Fenced(u64),
}

/// The answer to a membership call ([`Shared::member`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Membership {
    /// The lease holds: this node's epoch, the store's time (unix ms), and
    /// every member as (name, "epoch active_from_ms expiry_ms addr").
    Lease {
        epoch: u64,
        now_ms: u64,
        members: Vec<(String, String)>,
    },
    /// The lease of that epoch is gone: join again.
    Gone { now_ms: u64 },
}

/// A lease call (`fc_lease_v1`, docs/cluster.md "Leases"): absolute
/// counters, so a retry or a lost reply changes nothing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    pub key: &'a [u8],
    /// Who holds the grant: a node and its process.
    pub holder: &'a str,
    /// The holder's cumulative committed units in the period.
    pub spent: u64,
    /// Units of headroom (beyond `spent`) it would like to hold now.
    pub want: u64,
    /// The most that may be spent plus held in the period, cluster-wide.
    pub total: u64,
    /// The grant lives this long, by the store's clock.
    pub ttl_ms: u64,
    /// The holder's open holds may be committed until this long from now:
    /// its headroom is not reclaimed before (nor before its grant expires).
    pub grace_ms: u64,
    /// The lease key expires this long from now.
    pub key_expire_ms: u64,
    /// The lease's period [start, end), unix ms (`fc_lease_v2`): at a store
    /// time outside it nothing is granted, and no grant outlives its end.
    pub period_ms: (u64, u64),
    /// How the store computes the total at its own time (`total` is the
    /// caller's, for [`TotalRule::Given`]).
    pub rule: TotalRule,
    /// The period's weighted time, for [`TotalRule::Weighted`] and
    /// [`TotalRule::Planned`]: its id always, its segments when the caller
    /// does not know the store to have them (they are kept with the lease).
    pub segments: Option<(&'a Segments, bool)>,
    /// `Some(b)`: the holder reports its spend later than it commits
    /// (`spend_reports = "batched"`), with at most `b` units (≥ 1) committed
    /// and not reported; once reclaimed, that much of its headroom counts
    /// as spent, since it may have spent it unreported, and the rest goes
    /// back. `None`: it reports each commit before acknowledging it.
    pub reports_later: Option<u64>,
    /// The holder's cumulative units committed of other holders' holds (a
    /// reservation another node made, committed on this one): counted as
    /// spent, not taken from its headroom. Reported before such a commit
    /// is acknowledged (`o:` in `fc_lease_v2`; issue 47).
    pub foreign: u64,
    /// The holder's cumulative units of its own holds that other holders
    /// committed (and reported as their `foreign`): its headroom is
    /// granted − spent − given (`r:`).
    pub given: u64,
}

/// `reports_later` as the functions take it: 0 for `None`, b + 1 for at
/// most b (1, "any", is what builds before the bound sent).
pub fn reports_later_arg(r: Option<u64>) -> u64 {
    r.map_or(0, |b| b.max(1).saturating_add(1))
}

/// What a reclaim counts as spent of a holder's `headroom` when it reported
/// as `later` ([`reports_later_arg`]'s form): none, all, or at most its
/// bound (`fc_lease_v2` and `fc_line_v1` in src/cluster/functions.lua).
fn unreported_taken(later: u64, headroom: u64) -> u64 {
    match later {
        0 => 0,
        1 => headroom,
        b => headroom.min(b - 1),
    }
}

/// A period's weighted time for profile and adaptive pacing: segments
/// (start, unix ms; weight), the first at the period's start. F(t) is the
/// sum of weight × ms up to t. The node makes them (local hours need the
/// time-zone database); the store keeps them with the lease and computes
/// the pacing line at its own time, so no node's clock moves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    /// A digest of the segments: a call naming another id than the stored
    /// one must send them.
    pub id: u64,
    pub list: Vec<(u64, u64)>,
}

impl Segments {
    pub fn new(list: Vec<(u64, u64)>) -> Self {
        // FNV-1a: a digest the store compares, not a defence.
        let mut id: u64 = 0xcbf2_9ce4_8422_2325;
        for (s, w) in &list {
            for b in s.to_le_bytes().into_iter().chain(w.to_le_bytes()) {
                id = (id ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Segments { id, list }
    }

    /// As the store keeps them: `start:weight,start:weight,...`.
    pub fn text(&self) -> String {
        let parts: Vec<String> = self.list.iter().map(|(s, w)| format!("{s}:{w}")).collect();
        parts.join(",")
    }

    /// F(t) for `t` in the period ending at `end` (ms), as `weighted_at` in
    /// src/cluster/functions.lua, in the same doubles.
    fn at(&self, end: u64, t: u64) -> f64 {
        let mut f = 0.0;
        for (i, &(s, w)) in self.list.iter().enumerate() {
            if s >= t {
                break;
            }
            let e = self.list.get(i + 1).map_or(end, |n| n.0);
            f += w as f64 * (t.min(e) - s) as f64;
        }
        f
    }
}

/// How `fc_lease_v2` computes a lease's total at Redis's time, so that no
/// node's clock makes it larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TotalRule {
    /// The caller's `total`.
    Given,
    /// A fixed total: a window's limit, an `asap` budget's amount.
    Fixed(u64),
    /// Even pacing over the period: min(amount, ceil(amount·(now + look −
    /// start)/(end − start)) + allowance).
    Even {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
    /// Profile pacing: min(amount, ceil(amount·F(t)/F(end)) + allowance),
    /// F the weighted time of the request's [`Segments`], t = now + look.
    Weighted {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
    /// Adaptive pacing: the fleet's plan (anchor a, base; `fc_plan_v1`'s,
    /// kept with the lease) over the weighted time: min(amount, base +
    /// ceil((amount − base)·(F(t) − F(a))/(F(end) − F(a))) + allowance).
    Planned {
        amount: u64,
        allowance: u64,
        look_ms: u64,
    },
}

impl TotalRule {
    /// The rule's arguments: (rule, amount, allowance, look_ms).
    pub fn args(self) -> (u64, u64, u64, u64) {
        match self {
            TotalRule::Given => (0, 0, 0, 0),
            TotalRule::Fixed(n) => (1, n, 0, 0),
            TotalRule::Even {
                amount,
                allowance,
                look_ms,
            } => (2, amount, allowance, look_ms),
            TotalRule::Weighted {
                amount,
                allowance,
                look_ms,
            } => (3, amount, allowance, look_ms),
            TotalRule::Planned {
                amount,
                allowance,
                look_ms,
            } => (4, amount, allowance, look_ms),
        }
    }

    /// The total at store time `now` (ms) in the period, as `fc_lease_v2`
    /// computes it, given the period's weighted time and the stored plan
    /// (`None`: the store lacks them, and grants nothing).
    pub fn total(
        self,
        given: u64,
        (start, end): (u64, u64),
        now: u64,
        segments: Option<&Segments>,
        plan: Option<(u64, u64)>,
    ) -> Option<u64> {
        let line = |amount: u64, allowance: u64, paced: f64| {
            Some(amount.min((paced.ceil().max(0.0) as u64).saturating_add(allowance)))
        };
        Some(match self {
            TotalRule::Given => given,
            TotalRule::Fixed(n) => n,
            TotalRule::Even {
                amount,
                allowance,
                look_ms,
            } => {
                let t = (now + look_ms).clamp(start, end);
                let span = end.saturating_sub(start).max(1);
                let paced = (u128::from(amount) * u128::from(t - start)).div_ceil(u128::from(span));
                amount.min((paced as u64).saturating_add(allowance))
            }
            TotalRule::Weighted {
                amount,
                allowance,
                look_ms,
            } => {
                let seg = segments?;
                let t = (now + look_ms).clamp(start, end);
                let fe = seg.at(end, end);
                if fe <= 0.0 {
                    return Some(amount);
                }
                return line(amount, allowance, amount as f64 * seg.at(end, t) / fe);
            }
            TotalRule::Planned {
                amount,
                allowance,
                look_ms,
            } => {
                // No plan stored (the lease's key was lost): the line from
                // the period's start.
                let (seg, (a, base)) = (segments?, plan.unwrap_or((start, 0)));
                let a = a.clamp(start, end);
                let t = (now + look_ms).clamp(start, end).max(a);
                let fa = seg.at(end, a);
                let left = seg.at(end, end) - fa;
                if left <= 0.0 {
                    return Some(amount);
                }
                let rest = amount.saturating_sub(base) as f64;
                let paced = base as f64 + (rest * (seg.at(end, t) - fa) / left).ceil();
                return line(amount, allowance, paced);
            }
        })
    }
}

/// A lease's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseGrant {
    /// The holder's cumulative grant: it may spend up to this in the period.
    pub granted: u64,
    /// Spent by every holder (reported).
    pub spent_total: u64,
    /// How long the grant may be used (the store's clock): its life, or
    /// less near the period's end, 0 outside the period.
    pub usable_ms: u64,
    /// The store lacks the weighted time the rule needs (and granted
    /// nothing): call again with the segments.
    pub need_segments: bool,
}

/// A token-line call (`fc_line_v1`, docs/cluster.md "Leases"): a
/// campaign-scope rate or gap, leased in units of a line that rises with
/// Redis's clock; absolute counters, as [`LeaseRequest`].
#[derive(Debug, Clone, Copy)]
pub struct LineRequest<'a> {
    pub key: &'a [u8],
    pub holder: &'a str,
    /// The holder's cumulative committed units on the line.
    pub spent: u64,
    /// Units beyond `spent` it would like to hold now.
    pub want: u64,
    /// The most units that pass at once after idling.
    pub burst: u64,
    /// The line rises `rate` units every `per_us` µs.
    pub rate: u64,
    pub per_us: u64,
    /// A grant may take what the line allows this long from now.
    pub look_us: u64,
    pub ttl_ms: u64,
    pub grace_ms: u64,
    pub key_expire_ms: u64,
    /// As [`LeaseRequest::reports_later`].
    pub reports_later: Option<u64>,
}

/// A token line's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineGrant {
    /// The holder's cumulative grant on the line.
    pub granted: u64,
    /// Spent by every holder (reported).
    pub spent_total: u64,
    /// How long until the line has one more unit to grant (0: now).
    pub retry_ms: u64,
}

/// A plan call (`fc_plan_v1`, docs/cluster.md "Leases"): the adaptive
/// pacing plan of a leased budget's period, made once per slice from the
/// fleet's spend and stored with the lease.
#[derive(Debug, Clone, Copy)]
pub struct PlanRequest<'a> {
    /// The budget's lease key (its period's).
    pub key: &'a [u8],
    /// The start of the slice the caller is in, unix ms.
    pub anchor_ms: u64,
    /// The anchor of the plan the caller knew (0: none), and that plan's
    /// line at `anchor_ms`.
    pub prev_anchor_ms: u64,
    pub prev_line: u64,
    pub key_expire_ms: u64,
}

/// A slots call (`fc_slots_v1`, docs/cluster.md "Leases"): slots held now
/// (absolute, numbered so a late older report changes nothing).
#[derive(Debug, Clone, Copy)]
pub struct SlotsRequest<'a> {
    pub key: &'a [u8],
    pub holder: &'a str,
    /// The holder's call number, rising.
    pub seq: u64,
    /// Slots it holds now.
    pub used: u64,
    /// Slots beyond `used` it would like to be able to take.
    pub want: u64,
    /// The most slots held in sum.
    pub max: u64,
    pub ttl_ms: u64,
    /// Its longest open hold ends this long from now.
    pub hold_ms: u64,
    pub key_expire_ms: u64,
}

/// A campaign's counts in one minute of its timeline (spend, commits,
/// denied), by minute since the epoch: what a node adds at a flush and what
/// the fleet's timeline answers.
pub type MinuteCounts = (u64, [u64; 3]);

/// The answer to [`Shared::write_definitions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DefsWrite {
    /// Applied whole; the definitions' new version.
    Written(u64),
    /// Another change came first (the version is not the expected one):
    /// nothing applied; the current version.
    Conflict(u64),
    /// The caller does not hold the definitions-writer lock: nothing
    /// applied; who holds it, if anyone.
    NotWriter(Option<String>),
}

/// What the engine needs from a shared store beyond [`Store`].
///
/// Promises: a [`Shared::cas`] that answers `Written` was applied once and
/// is as durable as the store's durability mode says; one that fails with an
/// error may or may not have been applied (a timed-out call), so the engine
/// forgets its copy and reads the record again before deciding on it.
/// Versions only grow, also across a record's expiry and re-creation.
pub trait Shared: Send + Sync {
    /// The cluster's time minus this node's clock, ns, if the store measures
    /// it (Redis's `TIME`, src/cluster/time.rs): nodes decide at the
    /// cluster's time, whatever their own clocks say (docs/cluster.md, "Time").
    fn clock_offset(&self) -> Option<i64> {
        None
    }

    /// The (version, value) of record `key`; `None` if absent.
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError>;

    /// Whether record `key` is still at `version` (0: absent): `None` if
    /// so, else what [`Shared::read`] gives. The record travels only when
    /// it moved (`fc_peek_v1`).
    #[allow(clippy::type_complexity)]
    fn peek(&self, key: &[u8], version: u64) -> Result<Option<Option<(u64, Vec<u8>)>>, StoreError> {
        let current = self.read(key)?;
        let same = current.as_ref().map_or(0, |(v, _)| *v) == version;
        Ok((!same).then_some(current))
    }

    /// Writes `value` under `key` if its version is still `expected` (0:
    /// absent), to expire at `expire_at` (unix ns; 0: never).
    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        expire_at: Nanos,
    ) -> Result<Cas, StoreError>;

    /// Owner mode (docs/cluster.md, "Owner mode"): claims record `key` for
    /// the owner of epoch `epoch`, so that no owner of an earlier epoch
    /// writes it again; a record absent is created empty, to expire after
    /// `absent_ttl` unless written.
    fn own(&self, _key: &[u8], _epoch: u64, _absent_ttl: Nanos) -> Result<Owned, StoreError> {
        Err(StoreError::Unsupported(
            "owner mode needs a redis-cluster store",
        ))
    }

    /// [`Shared::cas`] by the owner of epoch `epoch`: [`Cas::Fenced`] if a
    /// later owner claimed the record.
    fn cas_owned(
        &self,
        _key: &[u8],
        _expected: u64,
        _value: &[u8],
        _expire_at: Nanos,
        _epoch: u64,
    ) -> Result<Cas, StoreError> {
        Err(StoreError::Unsupported(
            "owner mode needs a redis-cluster store",
        ))
    }

    /// Owner mode's membership: joins (`epoch` 0) or renews this node's
    /// lease for `ttl_ms`, and reads every member.
    fn member(
        &self,
        _node: &str,
        _addr: &str,
        _epoch: u64,
        _ttl_ms: u64,
    ) -> Result<Membership, StoreError> {
        Err(StoreError::Unsupported(
            "owner mode needs a redis-cluster store",
        ))
    }

    /// Sets `key` to `token` if absent, to expire at `expire_at` (an event id
    /// within its horizon): `true` if this call set it. A claim that is
    /// there already is a duplicate, whoever made it: a retry of a claim
    /// whose answer was lost is not counted (at most once; counting it
    /// again on a matching token counted a user-less event once per repeat).
    fn claim(&self, key: &[u8], expire_at: Nanos, token: &[u8]) -> Result<bool, StoreError>;

    /// Removes a claim this node made and did not use.
    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError>;

    /// A number that changes whenever a definition is written or deleted
    /// (nodes poll it to apply others' changes).
    fn definitions_version(&self) -> Result<u64, StoreError>;

    /// A definition id no node has used, above `above`.
    fn new_id(&self, above: u32) -> Result<u32, StoreError>;

    /// Applies the definition ops of `ops` (others are left out) all
    /// together or not at all, with one version bump: only if the version
    /// is still `expected` (`None`: whatever it is) and, if `writer` is
    /// given, while that name holds the definitions-writer lock
    /// ([`Shared::definitions_writer`]). A failed call may or may not have
    /// been applied, whole (a lost answer).
    fn write_definitions(
        &self,
        expected: Option<u64>,
        writer: Option<&str>,
        ops: &[super::Op],
    ) -> Result<DefsWrite, StoreError>;

    /// Takes the definitions-writer lock for `node` if no one holds it, or
    /// renews it if `node` does, for `ttl_ms` (0: gives it up if `node`
    /// holds it). Returns who holds it after the call.
    fn definitions_writer(&self, node: &str, ttl_ms: u64) -> Result<Option<String>, StoreError>;

    /// Adds `minutes` to campaign `campaign`'s timeline, the fleet's sum
    /// (each node adds what it counted since its last flush), all or
    /// nothing; a day's minutes are kept until `keep_for` after that day.
    fn timeline_add(
        &self,
        campaign: u32,
        minutes: &[MinuteCounts],
        keep_for: Nanos,
    ) -> Result<(), StoreError>;

    /// The fleet's minutes of campaign `campaign` from minute `from` to
    /// `to` (both included), oldest first, those with a count only.
    fn timeline_read(
        &self,
        campaign: u32,
        from: u64,
        to: u64,
    ) -> Result<Vec<MinuteCounts>, StoreError>;

    /// Adds each campaign's activity (commits and denials) on UTC day
    /// `day` (days since the epoch) to the fleet's totals of that day, which
    /// choose the campaigns `/metrics` exports; a day's totals are kept two
    /// days.
    fn activity_add(&self, day: u64, adds: &[(u32, u64)]) -> Result<(), StoreError>;

    /// The campaigns with the most activity on `day` and the day before
    /// (the `n` most active of each day, summed), the most active first,
    /// ties by id.
    fn most_active(&self, day: u64, n: usize) -> Result<Vec<(u32, u64)>, StoreError>;

    /// A lease call: reports the holder's spend and returns its grant.
    fn lease(&self, req: &LeaseRequest<'_>) -> Result<LeaseGrant, StoreError>;

    /// A token-line call: reports the holder's spend on a line and returns
    /// its grant.
    fn line(&self, req: &LineRequest<'_>) -> Result<LineGrant, StoreError>;

    /// A plan call: the (anchor ms, base) of the adaptive plan every node of
    /// the fleet paces by in the slice.
    fn plan(&self, req: &PlanRequest<'_>) -> Result<(u64, u64), StoreError>;

    /// A slots call: reports the slots the holder holds and returns how many
    /// it may hold.
    fn slots(&self, req: &SlotsRequest<'_>) -> Result<u64, StoreError>;

    /// The units every holder of lease `key` has reported spent (0 for a
    /// lease no one holds): the fleet's spend on a campaign item in a period,
    /// which delivery and usage answer on every node.
    fn lease_spent(&self, key: &[u8]) -> Result<u64, StoreError>;

    /// Leaves `notice` for the node whose process nonce is `nonce` (a
    /// reservation it made, settled by another node: docs/cluster.md,
    /// "Spend is reported"). Kept an hour, the longest reservation.
    fn notify(&self, nonce: u32, notice: &[u8]) -> Result<(), StoreError>;

    /// Takes up to `most` notices left for the node of `nonce`, oldest
    /// first.
    fn take_notices(&self, nonce: u32, most: usize) -> Result<Vec<Vec<u8>>, StoreError>;
}

/// One holder of a lease in [`SharedMemory`] (as `fc_lease_v1` keeps it).
#[derive(Debug, Clone, Copy, Default)]
struct LeaseHolder {
    spent: u64,
    granted: u64,
    want: u64,
    /// Expiry, ms since the store was made (a monotonic clock).
    expires: u64,
    /// Its holds may be committed until then (same clock).
    holds_until: u64,
    /// It reports its spend later than it commits, with at most this
    /// many units unreported ([`reports_later_arg`]'s form).
    reports_later: u64,
    /// Units of others' holds it committed (`o:`): spent, not headroom.
    foreign: u64,
    /// Units of its holds others committed (`r:`).
    given: u64,
}

impl LeaseHolder {
    /// Whether its headroom may go back to the pool at `now`.
    fn reclaimable(&self, now: u64) -> bool {
        self.expires.max(self.holds_until) < now
    }

    /// Its unspent headroom: granted − spent − given.
    fn headroom(&self) -> u64 {
        self.granted
            .saturating_sub(self.spent)
            .saturating_sub(self.given)
    }
}

/// How long after its reclaim a holder is folded away (`FOLD_AFTER_MS` of
/// src/cluster/functions.lua).
const FOLD_AFTER_MS: u64 = 600_000;

/// The holders of one lease or token line, and the spent of those folded
/// away (`~S`).
#[derive(Debug, Default)]
struct Holders {
    folded: u64,
    by_name: HashMap<String, LeaseHolder>,
}

impl Holders {
    /// `fold_dead` of src/cluster/functions.lua: the holders other than
    /// `me` reclaimed over [`FOLD_AFTER_MS`] before `now` go, their spent
    /// added to `folded`.
    fn fold_dead(&mut self, me: &str, now: u64) {
        let folded = &mut self.folded;
        self.by_name.retain(|name, h| {
            let keep = name == me || h.expires.max(h.holds_until) + FOLD_AFTER_MS >= now;
            if !keep {
                *folded += h.spent + h.foreign;
            }
            keep
        });
    }
}

/// One holder of slots in [`SharedMemory`] (as `fc_slots_v1` keeps it).
#[derive(Debug, Clone, Copy, Default)]
struct SlotHolder {
    granted: u64,
    seq: u64,
    demand: u64,
    /// Dropped after this (ms since the store was made).
    until: u64,
}

/// A token line in [`SharedMemory`] (as `fc_line_v1` keeps it).
#[derive(Debug, Default)]
struct LineState {
    /// The line's origin, µs of the store's clock (`None`: a new line).
    t0: Option<f64>,
    holders: Holders,
}

/// Records by key: (version, value).
type Versioned = HashMap<Vec<u8>, (u64, Vec<u8>)>;

/// [`Shared`] in one process: several engines on one `Arc<SharedMemory>`
/// behave as nodes on one cluster.
#[derive(Default)]
pub struct SharedMemory {
    /// Definitions, meta and dedupe ids, as [`MemoryStore`] keeps them.
    plain: MemoryStore,
    records: Mutex<Versioned>,
    leases: Mutex<HashMap<Vec<u8>, Holders>>,
    slots: Mutex<HashMap<Vec<u8>, HashMap<String, SlotHolder>>>,
    claims: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// Notices by node nonce ([`Shared::notify`]).
    notices: Mutex<HashMap<u32, std::collections::VecDeque<Vec<u8>>>>,
    definitions: AtomicU64,
    /// Held while definitions are checked and written, so a batch is one
    /// step (as `fc_defs_v1` is in Redis).
    defs_lock: Mutex<()>,
    /// The definitions-writer lock: holder and expiry (ms, the lease clock).
    writer: Mutex<Option<(String, u64)>>,
    /// Timelines by campaign, minute by minute.
    timelines: Mutex<HashMap<u32, std::collections::BTreeMap<u64, [u64; 3]>>>,
    /// Activity by day and campaign.
    activity: Mutex<HashMap<(u64, u32), u64>>,
    ids: AtomicU64,
    /// Record reads, CAS calls and conflicts, for tests.
    pub reads: AtomicU64,
    pub cas_calls: AtomicU64,
    pub cas_conflicts: AtomicU64,
    /// While set, every record read fails, as a store that does not answer
    /// (a primary failing over): for tests.
    pub fail_reads: std::sync::atomic::AtomicBool,
    /// While above 0, a compare-and-set that writes is applied and then
    /// answered as a primary whose replica did not confirm it in time
    /// (`StoreError::Unavailable`), and this is lowered by one: for tests.
    pub unconfirmed_writes: AtomicU64,
    lines: Mutex<HashMap<Vec<u8>, LineState>>,
    /// Adaptive plans by lease key: (anchor ms, base).
    plans: Mutex<HashMap<Vec<u8>, (u64, u64)>>,
    /// Weighted time by lease key (`~pf`, `~pid` in Redis).
    segments: Mutex<HashMap<Vec<u8>, Segments>>,
    /// The lease functions' clock: µs since this store was made.
    started: std::sync::OnceLock<std::time::Instant>,
    /// Or, for tests, this clock (µs), as Redis's `TIME` would be.
    clock: Option<Box<dyn Fn() -> u64 + Send + Sync>>,
}

impl SharedMemory {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store whose lease functions read `clock` (µs) where Redis reads
    /// `TIME`: tests on a manual clock then move the store's time too.
    pub fn with_clock(clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        SharedMemory {
            clock: Some(Box::new(clock)),
            ..Self::default()
        }
    }

    /// The bytes of every record the store holds: for tests.
    pub fn record_bytes(&self) -> usize {
        let m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        m.values().map(|(_, v)| v.len()).sum()
    }

    /// How many holders the store keeps, over all its leases and token
    /// lines (in Redis, five hash fields each): for tests.
    pub fn lease_holders(&self) -> usize {
        let leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        leases.values().map(|h| h.by_name.len()).sum::<usize>()
            + lines
                .values()
                .map(|l| l.holders.by_name.len())
                .sum::<usize>()
    }

    /// The lease and writer-lock functions' clock, ms (see
    /// [`SharedMemory::now_us`]).
    fn now_ms(&self) -> u64 {
        self.now_us() / 1000
    }

    /// The lease functions' time, µs.
    fn now_us(&self) -> u64 {
        match &self.clock {
            Some(c) => c(),
            None => self
                .started
                .get_or_init(std::time::Instant::now)
                .elapsed()
                .as_micros() as u64,
        }
    }
}

/// `fair_share` of src/cluster/functions.lua, in the same (real)
/// arithmetic: the max-min fair share of `pool` for `mine` among `demands`
/// (`mine` included), rounded up.
fn fair_share(demands: &mut [u64], pool: u64, mine: u64) -> u64 {
    demands.sort_unstable();
    let (mut remaining, mut left) = (pool as f64, demands.len() as f64);
    for d in demands.iter() {
        let fair = remaining / left;
        if *d as f64 >= fair {
            if fair < mine as f64 {
                return (fair - 1e-9).ceil().max(0.0) as u64;
            }
            return mine;
        }
        remaining -= *d as f64;
        left -= 1.0;
    }
    mine
}

impl Store for SharedMemory {
    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.plain.get(space, key)
    }

    fn scan(&self, space: Space) -> Result<KeyValues, StoreError> {
        self.plain.scan(space)
    }

    fn submit(&self, batch: Batch, acknowledge: bool) -> Receipt {
        let _d = self
            .defs_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if batch.iter().any(|op| op_space(op) == Space::Definitions) {
            self.definitions.fetch_add(1, Ordering::AcqRel);
        }
        self.plain.submit(batch, acknowledge)
    }

    fn written_seq(&self) -> u64 {
        // Records are written by CAS, never queued: none waits on a batch.
        u64::MAX
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn set_now(&self, now: u64) {
        self.plain.set_now(now);
    }

    fn stats(&self) -> StoreStats {
        StoreStats::default()
    }

    fn compact(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn checkpoint(&self, _: &std::path::Path) -> Result<(), StoreError> {
        Err(StoreError::Unsupported(
            "a shared store has no checkpoint: back up the Redis Cluster instead",
        ))
    }

    fn shared(&self) -> Option<&dyn Shared> {
        Some(self)
    }
}

/// Campaigns by activity, the most active first, ties by id.
pub(crate) fn by_activity(sums: HashMap<u32, u64>) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = sums.into_iter().collect();
    v.sort_unstable_by_key(|(id, a)| (std::cmp::Reverse(*a), *id));
    v
}

fn op_space(op: &super::Op) -> Space {
    match op {
        super::Op::Put(s, ..) | super::Op::Delete(s, ..) => *s,
    }
}

impl Shared for SharedMemory {
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::Acquire) {
            return Err(StoreError::Io("read refused: fail_reads is set".into()));
        }
        let m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(m.get(key).cloned())
    }

    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        _expire_at: Nanos,
    ) -> Result<Cas, StoreError> {
        self.cas_calls.fetch_add(1, Ordering::Relaxed);
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let current = m.get(key).map_or(0, |(v, _)| *v);
        if current != expected {
            self.cas_conflicts.fetch_add(1, Ordering::Relaxed);
            return Ok(Cas::Conflict {
                version: current,
                value: m.get(key).map(|(_, b)| b.clone()),
            });
        }
        let version = current + 1;
        m.insert(key.to_vec(), (version, value.to_vec()));
        let unconfirmed =
            self.unconfirmed_writes
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if unconfirmed.is_ok() {
            return Err(StoreError::Unavailable(
                "the write was not confirmed by a replica in time (unconfirmed_writes)".into(),
            ));
        }
        Ok(Cas::Written(version))
    }

    fn claim(&self, key: &[u8], _expire_at: Nanos, token: &[u8]) -> Result<bool, StoreError> {
        let mut m = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if m.contains_key(key) {
            return Ok(false);
        }
        m.insert(key.to_vec(), token.to_vec());
        Ok(true)
    }

    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError> {
        let mut m = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        m.remove(key);
        Ok(())
    }

    fn definitions_version(&self) -> Result<u64, StoreError> {
        Ok(self.definitions.load(Ordering::Acquire))
    }

    /// The arithmetic of `fc_lease_v1` (src/cluster/functions.lua), for
    /// tests without a Redis: the tests of the function itself run against
    /// Redis (ops/test-functions.sh).
    fn lease(&self, req: &LeaseRequest<'_>) -> Result<LeaseGrant, StoreError> {
        let now = self.now_us() / 1000;
        // Without a clock of its own (`new`), this store has no unix time to
        // hold a period against: it trusts the caller's period and total, as
        // fc_lease_v1 did. With one (`with_clock`), it is fc_lease_v2.
        let (open, total, need_segments) = match self.clock {
            Some(_) => {
                let mut stored = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some((seg, true)) = req.segments {
                    stored.insert(req.key.to_vec(), seg.clone());
                }
                let seg = stored
                    .get(req.key)
                    .filter(|s| req.segments.is_some_and(|(r, _)| r.id == s.id));
                let plan = self
                    .plans
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(req.key)
                    .copied();
                let in_period = (req.period_ms.0..req.period_ms.1).contains(&now);
                match req.rule.total(req.total, req.period_ms, now, seg, plan) {
                    Some(total) => (in_period, total, false),
                    None => (false, 0, true),
                }
            }
            None => (true, req.total, false),
        };
        let req = &LeaseRequest { total, ..*req };
        let mut all = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let state = all.entry(req.key.to_vec()).or_default();
        state.fold_dead(req.holder, now);
        let holders = &mut state.by_name;
        let me = holders.entry(req.holder.to_owned()).or_default();
        me.spent = me.spent.max(req.spent);
        me.foreign = me.foreign.max(req.foreign);
        me.given = me.given.max(req.given);
        me.granted = me.granted.max(me.spent + me.given);
        me.want = req.want;
        me.expires = now + req.ttl_ms;
        me.holds_until = now + req.grace_ms;
        if let Some(b) = req.reports_later {
            me.reports_later = reports_later_arg(Some(b));
        }
        for (name, h) in holders.iter_mut() {
            if name != req.holder && h.reclaimable(now) {
                // As fc_lease_v2: a holder that reports later may have spent
                // up to its bound of its headroom unreported; the rest
                // goes back.
                h.spent += unreported_taken(h.reports_later, h.headroom());
                h.granted = h.spent + h.given;
            }
        }
        let spent: u64 = state.folded + holders.values().map(|h| h.spent + h.foreign).sum::<u64>();
        let live: Vec<(&String, &LeaseHolder)> = holders
            .iter()
            .filter(|(n, h)| *n == req.holder || !h.reclaimable(now))
            .collect();
        let held_others: u64 = live
            .iter()
            .filter(|(n, _)| *n != req.holder)
            .map(|(_, h)| h.headroom())
            .sum();
        // Max-min fair share of what is left, by water-filling the wants.
        let mut wants: Vec<u64> = live.iter().map(|(_, h)| h.want).collect();
        wants.sort_unstable();
        let (mut left, mut share) = (req.total.saturating_sub(spent), 0);
        for (i, w) in wants.iter().enumerate() {
            let level = left.div_ceil((wants.len() - i) as u64);
            if *w >= level {
                share = level;
                break;
            }
            left -= w;
            share = *w;
        }
        let share = share.min(req.want);
        let me = holders.get_mut(req.holder).ok_or(StoreError::Closed)?;
        let headroom = me.headroom();
        let free = req.total.saturating_sub(spent).saturating_sub(held_others);
        // Outside the period the store's time is in, nothing may be spent.
        let new = if open {
            headroom.max(share.min(free))
        } else {
            0
        };
        me.granted = me.spent + me.given + new;
        let usable_ms = match (open, &self.clock) {
            (false, _) => 0,
            (true, Some(_)) => req.ttl_ms.min(req.period_ms.1.saturating_sub(now)),
            (true, None) => req.ttl_ms,
        };
        Ok(LeaseGrant {
            granted: me.granted,
            spent_total: spent,
            usable_ms,
            need_segments,
        })
    }

    /// The arithmetic of `fc_line_v1` (src/cluster/functions.lua), step for
    /// step, in the same doubles.
    fn line(&self, req: &LineRequest<'_>) -> Result<LineGrant, StoreError> {
        if req.rate == 0 || req.per_us == 0 {
            return Err(StoreError::Io(
                "fc_line_v1: rate and per_us must be at least 1".into(),
            ));
        }
        let now_u = self.now_us();
        let now = now_u / 1000;
        let mut all = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let line = all.entry(req.key.to_vec()).or_default();
        line.holders.fold_dead(req.holder, now);
        let me = line
            .holders
            .by_name
            .entry(req.holder.to_owned())
            .or_default();
        me.spent = me.spent.max(req.spent);
        // The caller's headroom goes back to the line.
        me.granted = me.spent;
        me.want = req.want;
        me.expires = now + req.ttl_ms;
        me.holds_until = now + req.grace_ms;
        if let Some(b) = req.reports_later {
            me.reports_later = reports_later_arg(Some(b));
        }
        let mut wants = vec![req.want];
        // A folded holder's grant was its spent (reclaimed before the fold).
        let (mut granted, mut spent) = (line.holders.folded, line.holders.folded);
        for (name, h) in line.holders.by_name.iter_mut() {
            if name != req.holder {
                if h.reclaimable(now) {
                    h.spent += unreported_taken(h.reports_later, h.granted.saturating_sub(h.spent));
                    h.granted = h.spent;
                } else {
                    wants.push(h.want);
                }
            }
            granted += h.granted.max(h.spent);
            spent += h.spent;
        }
        let (rate, per) = (req.rate as f64, req.per_us as f64);
        let allowance = |t0: f64, t: f64| req.burst as f64 + ((t - t0) * rate / per).floor();
        let full = |granted: u64| now_u as f64 - (granted as f64 * per / rate).ceil();
        let t0 = match line.t0 {
            Some(t0) if allowance(t0, now_u as f64) <= (granted + req.burst) as f64 => t0,
            _ => full(granted),
        };
        let avail = (allowance(t0, (now_u + req.look_us) as f64) - granted as f64).max(0.0) as u64;
        let new = fair_share(&mut wants, avail, req.want).min(avail);
        let me = line
            .holders
            .by_name
            .get_mut(req.holder)
            .ok_or(StoreError::Closed)?;
        me.granted = me.spent + new;
        let granted = granted + new;
        let need = (granted + 1).saturating_sub(req.burst);
        let at = t0 + (need as f64 * per / rate).ceil() - req.look_us as f64;
        let retry_ms = if need > 0 && at > now_u as f64 {
            ((at - now_u as f64) / 1000.0).ceil() as u64
        } else {
            0
        };
        line.t0 = Some(t0);
        Ok(LineGrant {
            granted: me.granted,
            spent_total: spent,
            retry_ms,
        })
    }

    /// The arithmetic of `fc_plan_v1`.
    fn plan(&self, req: &PlanRequest<'_>) -> Result<(u64, u64), StoreError> {
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let stored = plans.get(req.key).copied();
        if let Some((a, base)) = stored
            && a >= req.anchor_ms
        {
            return Ok((a, base));
        }
        let mut base = self.lease_spent(req.key)?;
        if let Some((a, _)) = stored
            && a == req.prev_anchor_ms
        {
            base = base.min(req.prev_line);
        }
        plans.insert(req.key.to_vec(), (req.anchor_ms, base));
        Ok((req.anchor_ms, base))
    }

    fn notify(&self, nonce: u32, notice: &[u8]) -> Result<(), StoreError> {
        let mut m = self.notices.lock().unwrap_or_else(PoisonError::into_inner);
        m.entry(nonce).or_default().push_back(notice.to_vec());
        Ok(())
    }

    fn take_notices(&self, nonce: u32, most: usize) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut m = self.notices.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(q) = m.get_mut(&nonce) else {
            return Ok(Vec::new());
        };
        let n = q.len().min(most);
        Ok(q.drain(..n).collect())
    }

    fn lease_spent(&self, key: &[u8]) -> Result<u64, StoreError> {
        let leases = self.leases.lock().map_err(|_| StoreError::Closed)?;
        Ok(leases.get(key).map_or(0, |h| {
            h.folded + h.by_name.values().map(|h| h.spent + h.foreign).sum::<u64>()
        }))
    }

    /// The arithmetic of `fc_slots_v1`, for tests without a Redis.
    fn slots(&self, req: &SlotsRequest<'_>) -> Result<u64, StoreError> {
        let now = self.now_us() / 1000;
        let mut all = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let holders = all.entry(req.key.to_vec()).or_default();
        if let Some(me) = holders.get(req.holder)
            && req.seq <= me.seq
        {
            return Ok(me.granted);
        }
        holders.retain(|name, h| name == req.holder || h.until >= now);
        let others: u64 = holders
            .iter()
            .filter(|(n, _)| *n != req.holder)
            .map(|(_, h)| h.granted)
            .sum();
        let demand = req.used + req.want;
        let mut demands: Vec<u64> = holders
            .iter()
            .filter(|(n, _)| *n != req.holder)
            .map(|(_, h)| h.demand)
            .chain([demand])
            .collect();
        demands.sort_unstable();
        let (mut left, mut share) = (req.max, demand);
        for (i, d) in demands.iter().enumerate() {
            let level = left.div_ceil((demands.len() - i) as u64);
            if *d >= level {
                share = share.min(level);
                break;
            }
            left -= d;
        }
        let granted = req.used.max(share.min(req.max.saturating_sub(others)));
        holders.insert(
            req.holder.to_owned(),
            SlotHolder {
                granted,
                seq: req.seq,
                demand,
                until: now + req.ttl_ms.max(req.hold_ms),
            },
        );
        Ok(granted)
    }

    fn write_definitions(
        &self,
        expected: Option<u64>,
        writer: Option<&str>,
        ops: &[super::Op],
    ) -> Result<DefsWrite, StoreError> {
        let _d = self
            .defs_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(node) = writer {
            let now = self.now_ms();
            let w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
            match &*w {
                Some((holder, until)) if holder == node && *until >= now => {}
                Some((holder, until)) if *until >= now => {
                    return Ok(DefsWrite::NotWriter(Some(holder.clone())));
                }
                _ => return Ok(DefsWrite::NotWriter(None)),
            }
        }
        let current = self.definitions.load(Ordering::Acquire);
        if expected.is_some_and(|v| v != current) {
            return Ok(DefsWrite::Conflict(current));
        }
        let batch: Batch = ops
            .iter()
            .filter(|op| op_space(op) == Space::Definitions)
            .cloned()
            .collect();
        self.plain.submit(batch, true).wait()?;
        Ok(DefsWrite::Written(
            self.definitions.fetch_add(1, Ordering::AcqRel) + 1,
        ))
    }

    fn definitions_writer(&self, node: &str, ttl_ms: u64) -> Result<Option<String>, StoreError> {
        let now = self.now_ms();
        let mut w = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = matches!(&*w, Some((holder, until)) if holder == node && *until >= now);
        let free = !matches!(&*w, Some((_, until)) if *until >= now);
        if ttl_ms == 0 {
            if mine {
                *w = None;
            }
        } else if mine || free {
            *w = Some((node.to_owned(), now + ttl_ms));
        }
        Ok(w.as_ref()
            .filter(|(_, until)| *until >= now)
            .map(|(holder, _)| holder.clone()))
    }

    fn timeline_add(
        &self,
        campaign: u32,
        minutes: &[MinuteCounts],
        _keep_for: Nanos,
    ) -> Result<(), StoreError> {
        let mut all = self
            .timelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let t = all.entry(campaign).or_default();
        for (m, counts) in minutes {
            let b = t.entry(*m).or_default();
            for (x, n) in b.iter_mut().zip(counts) {
                *x = x.saturating_add(*n);
            }
        }
        Ok(())
    }

    fn timeline_read(
        &self,
        campaign: u32,
        from: u64,
        to: u64,
    ) -> Result<Vec<MinuteCounts>, StoreError> {
        let all = self
            .timelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(all
            .get(&campaign)
            .map(|t| t.range(from..=to).map(|(m, c)| (*m, *c)).collect())
            .unwrap_or_default())
    }

    fn activity_add(&self, day: u64, adds: &[(u32, u64)]) -> Result<(), StoreError> {
        let mut all = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
        for (id, n) in adds {
            let a = all.entry((day, *id)).or_default();
            *a = a.saturating_add(*n);
        }
        Ok(())
    }

    fn most_active(&self, day: u64, n: usize) -> Result<Vec<(u32, u64)>, StoreError> {
        let all = self.activity.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sums: HashMap<u32, u64> = HashMap::new();
        for d in [day.saturating_sub(1), day] {
            let mut v: Vec<(u32, u64)> = all
                .iter()
                .filter(|((at, _), _)| *at == d)
                .map(|((_, id), a)| (*id, *a))
                .collect();
            v.sort_unstable_by_key(|(id, a)| (std::cmp::Reverse(*a), *id));
            for (id, a) in v.into_iter().take(n) {
                *sums.entry(id).or_default() += a;
            }
        }
        Ok(by_activity(sums))
    }

    fn new_id(&self, above: u32) -> Result<u32, StoreError> {
        let next = self.ids.fetch_add(1, Ordering::AcqRel) + 1;
        let id = next.max(u64::from(above) + 1);
        self.ids.fetch_max(id, Ordering::AcqRel);
        u32::try_from(id).map_err(|_| StoreError::Io("definition ids are used up".into()))
    }
}
