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
use std::sync::atomic::AtomicU64;

use super::StoreError;
use super::lease_args::{
    LeaseCap, LeaseGrant, LeaseRequest, LineGrant, LineHeld, LineRequest, PlanRequest, SlotsGrant,
    SlotsHeld, SlotsRequest,
};
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
    /// The record is a hot key's, frozen since `since_ms` (the store's
    /// clock, [`Records::hot`]): nothing was written; `value` is the record
    /// as frozen. Its decisions are made on leases (docs/cluster.md, "Hot
    /// keys").
    Leased {
        since_ms: u64,
        value: Option<Vec<u8>>,
    },
}

/// The answer to [`Records::hot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hot {
    /// Frozen since `since_ms` (the store's clock), to live until
    /// `expire_at_ms` at least (0: no expiry); `value`: the record as frozen.
    Frozen {
        since_ms: u64,
        expire_at_ms: u64,
        value: Option<Vec<u8>>,
    },
    /// Not frozen (a call that does not freeze found it so): its version.
    Cold { version: u64 },
}

/// The answer to an owner's claim of a record ([`OwnedRecords::own`]).
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

/// The answer to a membership call ([`OwnedRecords::member`]).
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

/// What a node reports of its decisions as owner ([`OwnedRecords::heat`]).
#[derive(Debug, Clone, Copy)]
pub struct HeatReport<'a> {
    pub node: &'a str,
    /// Decisions made since the last report.
    pub total: u64,
    /// The heaviest keys among them, with their counts.
    pub heavy: &'a [(u128, u64)],
    /// How many keys a table keeps.
    pub top: usize,
    /// A new table is made at most this often.
    pub every_ms: u64,
    /// A new table applies this long after it is made.
    pub ahead_ms: u64,
}

/// The fleet's tables of heavy users ([`OwnedRecords::heat`]), as
/// `crate::cluster::bounded::table_text` writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeatTables {
    /// The store's time, unix ms.
    pub now_ms: u64,
    /// The table before `next`, if any.
    pub prev: Option<String>,
    /// The latest table (it may apply later than now).
    pub next: Option<String>,
}

/// A campaign's counts in one minute of its timeline (spend, commits,
/// denied), by minute since the epoch: what a node adds at a flush and what
/// the fleet's timeline answers.
pub type MinuteCounts = (u64, [u64; 3]);

/// The answer to [`Catalog::write_definitions`].
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

/// Records several nodes decide on, each written by compare-and-set on its
/// version (shared mode), and ids claimed once (events).
///
/// Promises: a [`Records::cas`] that answers `Written` was applied once and
/// is as durable as the store's durability mode says; one that fails with an
/// error may or may not have been applied (a timed-out call), so the engine
/// forgets its copy and reads the record again before deciding on it.
/// Versions only grow, also across a record's expiry and re-creation.
pub trait Records: Send + Sync {
    /// The cluster's time minus this node's clock, ns, if the store measures
    /// it (Redis's `TIME`, src/cluster/time.rs): nodes decide at the
    /// cluster's time, whatever their own clocks say (docs/cluster.md, "Time").
    fn clock_offset(&self) -> Option<i64> {
        None
    }

    /// The (version, value) of record `key`; `None` if absent.
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError>;

    /// Whether record `key` is still at `version` (0: absent): `None` if
    /// so, else what [`Records::read`] gives. The record travels only when
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

    /// Sets `key` to `token` if absent, to expire at `expire_at` (an event id
    /// within its horizon): `true` if this call set it. A claim that is
    /// there already is a duplicate, whoever made it: a retry of a claim
    /// whose answer was lost is not counted (at most once; counting it
    /// again on a matching token counted a user-less event once per repeat).
    fn claim(&self, key: &[u8], expire_at: Nanos, token: &[u8]) -> Result<bool, StoreError>;

    /// Removes a claim this node made and did not use.
    fn unclaim(&self, key: &[u8]) -> Result<(), StoreError>;

    /// A hot key's record (`fc_hot_v1`): with `freeze`, frozen now if it is
    /// not yet, as it is; either way a frozen record lives until `until`
    /// (unix ns) at least. While frozen, [`Records::cas`] answers
    /// [`Cas::Leased`] and writes nothing.
    fn hot(&self, key: &[u8], until: Nanos, freeze: bool) -> Result<Hot, StoreError>;
}

/// Owner mode's records (docs/cluster.md, "Owner mode"): claimed by the
/// node that owns their user, written fenced by its epoch, and the
/// membership that says who owns whom.
pub trait OwnedRecords: Send + Sync {
    /// Owner mode (docs/cluster.md, "Owner mode"): claims record `key` for
    /// the owner of epoch `epoch`, so that no owner of an earlier epoch
    /// writes it again; a record absent is created empty, to expire after
    /// `absent_ttl` unless written.
    fn own(&self, _key: &[u8], _epoch: u64, _absent_ttl: Nanos) -> Result<Owned, StoreError> {
        Err(StoreError::Unsupported(
            "owner mode needs a redis-cluster store",
        ))
    }

    /// [`Records::cas`] by the owner of epoch `epoch`: [`Cas::Fenced`] if a
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

    /// Owner mode's loads: stores this node's report and reads the fleet's
    /// tables of heavy users, making the next one if one is due
    /// (`fc_heat_v1`, docs/cluster.md "Owner mode").
    fn heat(&self, _report: &HeatReport<'_>) -> Result<HeatTables, StoreError> {
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
}

/// Leases of campaign-side and policy-side items (docs/cluster.md,
/// "Leases"): each node holds a share and reports its spend; and the
/// mailbox by which a node that settled another's reservation tells it.
pub trait LeaseCalls: Send + Sync {
    /// A lease call: reports the holder's spend and returns its grant.
    fn lease(&self, req: &LeaseRequest<'_>) -> Result<LeaseGrant, StoreError>;

    /// A token-line call: reports the holder's spend on a line and returns
    /// its grant.
    fn line(&self, req: &LineRequest<'_>) -> Result<LineGrant, StoreError>;

    /// Caps what token line `req.key` may grant in sum from now on, and
    /// reads what it granted: a region's use of a campaign's rate, which
    /// its caller reports to the global tier (docs/regions.md).
    fn line_cap(&self, req: &LeaseCap<'_>) -> Result<LineHeld, StoreError>;

    /// A plan call: the (anchor ms, base) of the adaptive plan every node of
    /// the fleet paces by in the slice.
    fn plan(&self, req: &PlanRequest<'_>) -> Result<(u64, u64), StoreError>;

    /// A slots call: reports the slots the holder holds and returns how many
    /// it may hold, and its fair share.
    fn slots(&self, req: &SlotsRequest<'_>) -> Result<SlotsGrant, StoreError>;

    /// Caps what the holders of slots lease `req.key` may be granted in sum
    /// from now on, and reads what they hold: a region's use, which its
    /// caller reports to the global tier (docs/regions.md), never on a
    /// decision's path.
    fn slots_cap(&self, req: &LeaseCap<'_>) -> Result<SlotsHeld, StoreError>;

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

/// What the fleet shares beyond decisions: definitions and their writer,
/// campaigns' timelines and activity.
pub trait Catalog: Send + Sync {
    /// A number that changes whenever a definition is written or deleted
    /// (nodes poll it to apply others' changes).
    fn definitions_version(&self) -> Result<u64, StoreError>;

    /// A definition id no node has used, above `above`.
    fn new_id(&self, above: u32) -> Result<u32, StoreError>;

    /// Applies the definition ops of `ops` (others are left out) all
    /// together or not at all, with one version bump: only if the version
    /// is still `expected` (`None`: whatever it is) and, if `writer` is
    /// given, while that name holds the definitions-writer lock
    /// ([`Catalog::definitions_writer`]). A failed call may or may not have
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
}

/// A field of a traveller's counts at the global tier: `(field, count)`.
/// Fields are opaque to the store; `src/engine/travellers.rs` names them.
pub type TravelField = (Vec<u8>, u64);

/// One user's exchange with the global tier ([`Travel::travel_sync`]).
#[derive(Debug, Clone, Copy)]
pub struct TravelSync<'a> {
    pub user: &'a str,
    /// The user's home region, and the caller's.
    pub home: &'a str,
    pub here: &'a str,
    /// Counts this caller owns (each field has one writer), set as given.
    pub counts: &'a [TravelField],
    /// How far the caller's region has applied others' counts, set as given.
    pub applied: &'a [TravelField],
    /// How long the user's fields are kept after this call, ms.
    pub keep_ms: u64,
}

/// What the global tier holds of one user after a sync: every region's
/// counts and how far every region has applied them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TravelView {
    pub counts: Vec<TravelField>,
    pub applied: Vec<TravelField>,
}

/// Users across regions (docs/regions.md, "Users across regions"): a
/// user's home region, and per-field counters each region owns a field of,
/// merged by sum. A global tier implements it; nothing here is on a
/// decision's path.
pub trait Travel: Send + Sync {
    /// Makes `region` the home of each of `users` that has none, kept
    /// `keep_ms`; answers each user's home, in order.
    fn claim_homes(
        &self,
        region: &str,
        users: &[&str],
        keep_ms: u64,
    ) -> Result<Vec<String>, StoreError>;

    /// For each user: writes the caller's counts and applied positions,
    /// adds the user to its home's travellers when the caller is not its
    /// home, and answers what the tier then holds of it. One round trip.
    fn travel_sync(&self, users: &[TravelSync<'_>]) -> Result<Vec<TravelView>, StoreError>;

    /// Up to `most` of the users other regions have counted whose home is
    /// `home`.
    fn travellers_of(&self, home: &str, most: usize) -> Result<Vec<String>, StoreError>;
}

/// What the engine needs from a shared store beyond [`Store`](super::Store): every
/// feature of one (a store implements each; `&dyn Shared` is all of them).
pub trait Shared: Records + OwnedRecords + LeaseCalls + Catalog + Travel {}

impl<T: Records + OwnedRecords + LeaseCalls + Catalog + Travel> Shared for T {}

/// Campaigns by activity, the most active first, ties by id.
pub(crate) fn by_activity(sums: HashMap<u32, u64>) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = sums.into_iter().collect();
    v.sort_unstable_by_key(|(id, a)| (std::cmp::Reverse(*a), *id));
    v
}
