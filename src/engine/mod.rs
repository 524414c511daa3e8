//! The decision core (docs/semantics.md §4, §6, §10.2): definitions, the
//! hot tier of subject records, reservations, and what goes to the store.
//!
//! One operation per file:
//! - [`check`]: `POST /v1/check`, decided against a policy or inline limits.
//! - [`check_all`]: several keys all or nothing (Envoy's rate limit service).
//! - [`throttle`]: `CL.THROTTLE`, redis-cell's command, on one policy key.
//! - [`screen`]: `POST /v1/screen`, candidates over their campaign chains.
//! - [`settle`]: commit (and late commit), release, expiry at the deadline.
//! - [`events`]: impressions without a reservation, deduplicated by id.
//! - [`identities`]: a request's households and devices, each its record.
//! - [`exclusion`]: competitive exclusion within one screen.
//! - [`erase`]: a viewer's records removed (the right to erasure).
//! - [`definitions`]: put, get and delete of policies and campaigns; loading
//!   them at open; deleted ones remembered for the redefinition grace.
//! - [`migrate`]: counter tags of an older build's records, rewritten at open.
//! - [`reset`]: one policy key's (or `CL.THROTTLE` key's) counters emptied.
//! - [`file_definitions`]: the set a definitions directory defines, put in
//!   place whole.
//! - [`usage`]: a user's usage of a campaign's caps; a campaign's delivery.
//! - [`figures`]: the per-definition metrics' figures.
//! - [`timeline`]: a campaign's minutes (spend, commits, cap hits) for the
//!   ad-ops page.
//!
//! What they share:
//! - [`request`]: request and outcome types, and the one set of validators.
//! - [`chain`]: locking a chain's campaign records; settling pending entries.
//! - [`hot`]: the hot tier's words: record keys, how far a miss may read
//!   ([`hot::Reads`]), how a decision stops short.
//! - [`gate`]: one decision at a time per record on a shared store.
//! - [`persist`]: the one place records become store writes.
//! - [`record`]: one subject's counters and pending debits, and their disk
//!   form; [`compact_form`], a shared record's compact layout.
//! - [`holds`]: what a shared record remembers of its reservations.
//! - [`minutes`]: a campaign's minutes as data.
//! - [`registry`]: policies and campaigns, their parent chains.
//! - [`reservations`]: open reservations, idempotent ids, deadline expiry,
//!   and who wins a commit (`winners`, the one rule).
//!
//! Where a record lives, the seam ([`placement`]): the engine's
//! `Placement`, fixed at open, is `Local` (one node), `Shared` (shared mode:
//! records by compare-and-set, reservations kept in them) or `Owned` (owner
//! mode: a user's record in its owner's memory, `placement/owned.rs`, where
//! an owner-mode screen is decided and writes nothing). Operations call
//! `with_record`; only the seam asks where the record is. [`leases`]: with a
//! shared store, this node's grants of campaign-scope state.
//!
//! **Lock order.** A decision that spans records takes: the user's (or policy
//! key's) hot-tier shard lock, then the campaign records of the chain(s) in
//! ascending campaign id, then the store's submit lock. Ids are stable across
//! redefinitions, so the order is total and fixed and no two decisions can wait
//! on each other in a cycle. The reservation table's and the dedupe set's locks
//! are never held while a record lock is taken. [`check_all`]'s key stripes
//! come before all of these, lowest stripe first.

mod chain;
mod check;
mod check_all;
mod compact_form;
mod definitions;
mod erase;
mod events;
mod exclusion;
mod figures;
mod file_definitions;
mod gate;
mod holds;
mod hot;
mod identities;
mod leases;
mod migrate;
mod minutes;
mod persist;
mod placement;
pub(crate) mod record;
pub(crate) mod registry;
mod reported;
pub(crate) mod request;
pub(crate) mod reservations;
mod reset;
mod screen;
mod settle;
mod throttle;
mod timeline;
mod travellers;
mod usage;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use crate::clock::{Clock, Nanos};
use crate::keyed::ShardedMap;
use crate::model::DefinitionError;
use crate::store::{Op, Space, Store, StoreError};

use placement::Dedupe;
use record::SubjectRecord;
use registry::Registry;
use reservations::Reservations;

pub use crate::limits::priority::Priority;
pub use check_all::{AllOutcome, KeyCheck, MAX_KEYS, Usage};
pub use events::PendingEvents;
pub use figures::{BudgetFigures, CampaignFigures, DefinitionFigures, PolicyFigures};
pub use file_definitions::{FileDef, FileDefinitions, Replaced, WRITER_TTL_MS};
pub use leases::{REGION_TTL, RegionFigures, SafeCapacity};
pub use minutes::{Bucket, PerUser};
pub use request::{
    CandidateResult, CheckOutcome, CheckRequest, CheckTarget, CommitOutcome, CommitRequest,
    CompiledInline, DeniedBy, Event, Outcome, ScreenCandidate, ScreenOutcome, ScreenRequest,
    split_ids,
};
pub use request::{compile_inline, compile_limits_at};
pub use settle::{EXPIRE_BATCH, PendingCommit, SWEEP_BATCH};
pub use throttle::{ThrottleOutcome, ThrottleRequest, Throttled};
pub use timeline::{CampaignTimeline, Minute};
pub use usage::{CapUsage, Delivery};

/// Sizing and limits of an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Bytes the hot tier of user and policy-key records may use.
    pub memory_budget: usize,
    /// Hot-tier shards (rounded up to a power of two).
    pub shards: usize,
    /// How long an event id is remembered for deduplication.
    pub dedupe_horizon: Nanos,
    /// How long a record stays in the hot tier once idle (equal to a fresh
    /// one) before the sweeper drops it. A key used again within it is
    /// decided from memory rather than read back from RocksDB, which for a
    /// large keyspace means a walk of the memtable's skip list; the memory
    /// budget still evicts idle records first when it is reached. 0 drops
    /// them at the next sweep.
    pub idle_grace: Nanos,
    /// Most reservations open at once: a reserving request past it is
    /// refused ([`EngineError::Overloaded`]). Reservations also may account
    /// for at most half of `memory_budget` (see [`reservations`]), whichever
    /// comes first.
    pub max_open_reservations: usize,
    /// Most candidates in one screen.
    pub max_candidates: usize,
    /// Longest key, user, campaign, policy or event id, in bytes.
    pub max_id_len: usize,
    /// The nonce in made reservation ids (`r-<nonce>-<seq>`). `None` (the
    /// default) draws one per process, so an id from before a restart never
    /// names a new reservation; replay fixes it so the same input gives the
    /// same output.
    pub id_nonce: Option<u32>,
    /// With a shared store: a screen whose user's record cannot be reached
    /// answers every known campaign eligible (reserving nothing) instead of
    /// 503. For ad servers that prefer serving to refusing (docs/cluster.md).
    pub fail_open: bool,
    /// This node's name in a cluster (leases name their holder by it and
    /// the process's nonce).
    pub node_id: String,
    /// With a shared store, when a commit's spend on leased campaign state
    /// is reported (docs/cluster.md, "Leases").
    pub spend_reports: SpendReports,
    /// With a shared store, the layout its records are written in:
    /// [`codec::SHARED_FORMAT_VERSION`] (3, the default), or 2 while nodes
    /// of an older build still read them during a rolling upgrade
    /// (docs/cluster.md, "Record layout"). Every layout is read.
    pub record_layout: u8,
    /// Every policy and campaign in shadow mode (`--shadow`; docs/semantics.md,
    /// "Shadow mode"), whatever its own `mode`.
    pub shadow: bool,
    /// How long a deleted policy or campaign is remembered: re-created under
    /// its name within it, it takes its id back and its counters carry on,
    /// as an edit's do (docs/semantics.md §5.3). 0: a deletion is final.
    pub redefine_grace: Nanos,
    /// How a fleet of nodes on a shared store keeps its users' records
    /// (docs/cluster.md, "Owner mode"); ignored on one node's store.
    pub fleet: Fleet,
}

/// How a fleet keeps its users' records, fixed when the engine opens
/// ([`Engine::open`] makes it the engine's [`placement::Placement`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Fleet {
    /// Shared mode: in the shared store, any node deciding on any user by
    /// compare-and-set.
    #[default]
    Shared,
    /// Owner mode: in the memory of the user's owner; `advertise` is where
    /// other nodes forward this node's users (its HTTP address).
    Owner { advertise: String },
}

/// When spend on leased campaign state is reported to the shared store
/// (docs/cluster.md, "Leases").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpendReports {
    /// Before the commit is acknowledged: a node's kill -9 leaves nothing
    /// unreported (one lease call per commit of a leased campaign, shared
    /// by concurrent commits of it; ~1.05 a commit in benches/cluster.sh).
    Commit,
    /// With the grants' renewal, once a second per grant in use, and before
    /// a commit is acknowledged only when the node would otherwise hold
    /// more than 0.1 % of the item's limit unreported (`leases.rs`,
    /// `UNREPORTED_PARTS`). A node killed leaves at most that unreported;
    /// the store counts it as spent once the grant is reclaimed, so it is
    /// never delivered twice: a budget is at most 0.1 % under-delivered per
    /// node killed, and ~0 lease calls are made per commit.
    #[default]
    Batched,
}

impl std::str::FromStr for SpendReports {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "commit" => Ok(SpendReports::Commit),
            "batched" => Ok(SpendReports::Batched),
            _ => Err(format!(
                "spend_reports must be commit or batched, got {s:?}"
            )),
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            memory_budget: 1 << 30,
            shards: crate::keyed::LimiterOptions::default().shards,
            dedupe_horizon: 24 * 3600 * 1_000_000_000,
            idle_grace: 60 * 1_000_000_000,
            max_open_reservations: DEFAULT_MAX_OPEN_RESERVATIONS,
            max_candidates: 10_000,
            max_id_len: 256,
            id_nonce: None,
            fail_open: false,
            node_id: "node".into(),
            spend_reports: SpendReports::Batched,
            record_layout: crate::store::codec::SHARED_FORMAT_VERSION,
            shadow: false,
            redefine_grace: 24 * 3600 * 1_000_000_000,
            fleet: Fleet::Shared,
        }
    }
}

/// The default of [`EngineOptions::max_open_reservations`]. A
/// one-candidate screen's reservation measured 1 512 bytes of RSS (1 429
/// accounted), so with the default 1 GiB budget the budget's half binds
/// first (about 375 000); this bound holds for larger budgets: 1 000 000 open
/// is about 1.5 GB, and expires in about 1.4 s (700 000/s measured).
pub const DEFAULT_MAX_OPEN_RESERVATIONS: usize = 1_000_000;

/// Why a request failed. Each maps to one HTTP status (docs/semantics.md
/// §8.5).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// 400: `field` names what is wrong.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 409: which conflict, in [`Conflict`].
    #[error("{0}")]
    Conflict(Conflict),
    /// 503: no room for another reservation (the open count or its memory
    /// share is used up); nothing was reserved.
    #[error("{0}")]
    Overloaded(String),
    /// 500: the store failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a request conflicts with the state it found (HTTP 409).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// The id's first request is still being decided.
    #[error("reservation {id:?} is being decided")]
    BeingDecided { id: String },
    /// A reserve under an id already committed or released (remembered
    /// until its deadline).
    #[error("reservation {id:?} is already settled")]
    AlreadySettled { id: String },
    /// A check under the id of a screen's reservation, or the reverse.
    #[error("reservation {id:?} belongs to a {}", kind.as_str())]
    BelongsTo { id: String, kind: ReservationKind },
    /// A reserve under a live id with another request.
    #[error("reservation {id:?} exists with a different request")]
    DifferentRequest { id: String },
    /// A release of a committed reservation, or a commit of a released one.
    #[error("reservation {id:?} was {}", outcome.as_str())]
    SettledOtherwise { id: String, outcome: Outcome },
    /// A repeat of a settle whose first call has not finished.
    #[error("the reservation is still being settled; retry")]
    StillSettling,
    /// A delete of a campaign that is some campaign's parent.
    #[error("campaign {name:?} still has children; delete them first")]
    HasChildren { name: String },
    /// A change of a campaign that would leave a descendant's opt-out
    /// (`ignore_caps`) naming no cap of its chain.
    #[error(
        "campaign {by:?} opts out of {entry:?} (ignore_caps), which this change would remove \
         from its chain; change {by:?} first"
    )]
    OptedOut { by: String, entry: String },
    /// A change through the API of a definition the definitions directory
    /// defines (docs/service.md, "Definitions as files").
    #[error(
        "{what} is defined by the file {file} of the definitions directory; change the file instead"
    )]
    DefinedByFile { what: String, file: String },
}

/// What made a reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReservationKind {
    Check,
    Screen,
}

impl ReservationKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReservationKind::Check => "check",
            ReservationKind::Screen => "screen",
        }
    }
}

impl From<DefinitionError> for EngineError {
    fn from(e: DefinitionError) -> Self {
        EngineError::InvalidArgument {
            field: e.field,
            message: e.message,
        }
    }
}

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> EngineError {
    EngineError::InvalidArgument {
        field: field.into(),
        message: message.into(),
    }
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub commits: AtomicU64,
    pub late_commits: AtomicU64,
    pub releases: AtomicU64,
    pub expired: AtomicU64,
    pub events: AtomicU64,
    pub duplicate_events: AtomicU64,
    /// Hot-tier lookups that had to ask the store (hits: [`Engine::hot_hits`]).
    pub hot_misses: AtomicU64,
    /// With a shared store: records written by compare-and-set, and those
    /// writes that met another node's first (decided again).
    pub cas: AtomicU64,
    pub cas_conflicts: AtomicU64,
    /// Hot keys this node learned were frozen (docs/cluster.md, "Hot
    /// keys"): decided on leases from then.
    pub hot_keys: AtomicU64,
    /// Owner mode: users claimed (taken into memory from the store), and
    /// decisions refused because a later owner had claimed the user.
    pub owner_claims: AtomicU64,
    pub owner_fenced: AtomicU64,
    /// Screens answered eligible without their user's record, which could
    /// not be reached (`fail_open`).
    pub failed_open: AtomicU64,
    /// Candidates a screen found eligible and then denied when it held on
    /// another identity's record (a household's), which another screen had
    /// filled in between (`identities.rs`).
    pub identity_rechecks: AtomicU64,
    /// Viewers erased (`erase.rs`), whether or not they had records.
    pub erasures: AtomicU64,
    /// Calls of the lease function (grants and spend reports).
    pub lease_calls: AtomicU64,
    /// With a shared store: decisions on a record whose own time was more
    /// than [`placement::MAX_RECORD_AHEAD`] past this node's (written by a node
    /// whose clock ran ahead), held up by that much only.
    pub record_time_capped: AtomicU64,
}

const META_HASH_KEY: &[u8] = b"hash_key";

fn random_key() -> [u8; 16] {
    // std's RandomState is seeded from the OS's randomness.
    let mut k = [0u8; 16];
    for half in k.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(std::process::id() as u64);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    k
}

fn corrupt(key: &[u8], message: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: String::from_utf8_lossy(key).into_owned(),
        message: message.into(),
    }
}

/// See the module documentation.
pub struct Engine<C: Clock> {
    clock: C,
    /// The engine's time: max(last seen, clock), so it never goes back.
    last_now: AtomicU64,
    store: Arc<dyn Store>,
    /// The current definitions. Readers clone the `Arc` (a read lock for a few
    /// ns); writers build a new snapshot under `defs_write`.
    registry: RwLock<Arc<Registry>>,
    /// Serializes definition changes (validate, persist, publish).
    defs_write: Mutex<()>,
    /// With a shared store, the definitions' version last applied
    /// ([`Engine::refresh_definitions`]).
    defs_version: AtomicU64,
    /// With a shared store, when it last answered the sweeper's poll (the
    /// engine's time; readiness).
    shared_ok_at: AtomicU64,
    /// User and policy-key records (see [`hot`]).
    hot: ShardedMap<[u64; 2], SubjectRecord>,
    reservations: Reservations,
    /// With a shared store: this node's grants of campaign-scope state.
    leases: leases::Leases,
    /// In a region (docs/regions.md): the grants of campaigns' period
    /// items the global tier gave this node's region.
    regions: std::sync::OnceLock<leases::Regions>,
    /// With a shared store: the policy keys decided on leases (hot).
    hot_keys: placement::HotKeys,
    /// With a shared store: reservations past their deadline whose record
    /// could not be read yet.
    unsettled: settle::Unsettled,
    dedupe: Dedupe,
    /// The locks [`Engine::check_all`] takes its keys under.
    key_locks: check_all::KeyLocks,
    /// With a shared store, the records being decided (one decision at a
    /// time per record, no lock across a Redis call).
    gates: gate::Gates,
    /// Where records live: this node's store, a shared store by
    /// compare-and-set, or the owner's memory (owner mode). Fixed at open.
    placement: placement::Placement,
    /// When the campaigns' timelines were last written (engine time).
    timelines_flushed_at: AtomicU64,
    /// With a shared store: the fleet's most active campaigns, which
    /// `/metrics` exports on every node ([`figures`]).
    fleet_top: figures::FleetTop,
    /// SipHash key for subject and event-id hashes, per data directory, so ids
    /// a client picks cannot be made to collide.
    hash_key: [u8; 16],
    /// Random per process: made reservation ids differ from those of an earlier
    /// run, whose reservations are gone.
    id_nonce: u32,
    options: EngineOptions,
    pub stats: EngineStats,
}

impl<C: Clock> Engine<C> {
    /// Opens the engine on `store`: loads definitions and campaign counters;
    /// user and policy-key records come back on first touch, and remembered
    /// event ids are looked up in the store when an id comes again.
    pub fn open(
        store: Arc<dyn Store>,
        clock: C,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        let hash_key = match store.get(Space::Meta, META_HASH_KEY)? {
            Some(v) if v.len() == 16 => {
                let mut k = [0u8; 16];
                k.copy_from_slice(&v);
                k
            }
            Some(_) => return Err(corrupt(META_HASH_KEY, "expected 16 bytes").into()),
            None => {
                let k = random_key();
                let put = Op::Put(Space::Meta, META_HASH_KEY.to_vec(), k.to_vec());
                persist::write_durably(&*store, vec![put])?;
                // A shared store keeps the first node's key (nodes starting
                // together each write one; the store sets it only if absent),
                // so read back the one that is there.
                match store.get(Space::Meta, META_HASH_KEY)? {
                    Some(v) if v.len() == 16 => {
                        let mut stored = [0u8; 16];
                        stored.copy_from_slice(&v);
                        stored
                    }
                    _ => k,
                }
            }
        };
        let placement = placement::Placement::of(&*store, &options)?;
        let (reg, defs_version) = placement.open_definitions(&*store)?;
        let hot = ShardedMap::new(options.memory_budget, options.shards);
        let reservations = Reservations::new(
            options.max_open_reservations,
            options.memory_budget / 2,
            hot.outside(),
        );
        let started = placement::cluster_time(clock.now(), &*store);
        Ok(Engine {
            last_now: AtomicU64::new(started),
            clock,
            hot,
            store,
            registry: RwLock::new(Arc::new(reg)),
            defs_write: Mutex::new(()),
            defs_version: AtomicU64::new(defs_version),
            shared_ok_at: AtomicU64::new(started),
            reservations,
            leases: leases::Leases::default(),
            regions: std::sync::OnceLock::new(),
            hot_keys: placement::HotKeys::default(),
            unsettled: settle::Unsettled::default(),
            dedupe: Dedupe::new(),
            key_locks: check_all::KeyLocks::default(),
            gates: gate::Gates::default(),
            placement,
            timelines_flushed_at: AtomicU64::new(0),
            fleet_top: figures::FleetTop::default(),
            hash_key,
            id_nonce: options.id_nonce.unwrap_or_else(|| {
                let k = random_key();
                u32::from_le_bytes([k[0], k[1], k[2], k[3]])
            }),
            options,
            stats: EngineStats::default(),
        })
    }

    /// The engine's time now (never earlier than a time it already used):
    /// the clock's, or with a shared store the cluster's (the clock shifted
    /// by the offset the store measures; docs/cluster.md, "Time").
    pub fn now(&self) -> Nanos {
        let t = placement::cluster_time(self.clock.now(), &*self.store);
        let prev = self.last_now.fetch_max(t, Ordering::AcqRel);
        let now = prev.max(t);
        self.store.set_now(now);
        now
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The current definitions.
    pub fn registry(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn publish(&self, reg: Registry) {
        *self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(reg);
    }

    /// A 128-bit keyed hash of a namespaced id.
    fn hash(&self, ns: u8, def_id: u32, id: &str) -> u128 {
        self.hash_bytes(ns, def_id, id.as_bytes())
    }

    /// [`Engine::hash`] of any bytes (`CL.THROTTLE`'s keys).
    fn hash_bytes(&self, ns: u8, def_id: u32, id: &[u8]) -> u128 {
        use siphasher::sip128::{Hasher128, SipHasher13};
        let mut h = SipHasher13::new_with_key(&self.hash_key);
        h.write_u8(ns);
        h.write_u32(def_id);
        h.write(id);
        h.finish128().as_u128()
    }

    /// A new reservation id: `r-<process nonce>-<sequence>`; with a shared
    /// store, `record` (the one holding it) is named at the end, so any node
    /// finds it (docs/cluster.md).
    pub(crate) fn new_reservation_id(&self, record: Option<hot::RecordKey>) -> String {
        let suffix = record.map(Self::id_suffix).unwrap_or_default();
        format!(
            "r-{:08x}-{:x}{suffix}",
            self.id_nonce,
            self.reservations.next_seq()
        )
    }

    /// Checks a key, user, campaign or event id against
    /// [`EngineOptions::max_id_len`].
    pub(crate) fn check_id(&self, field: &str, id: &str) -> Result<(), EngineError> {
        request::check_id(field, id, self.options.max_id_len)
    }

    /// Records in the hot tier, and the bytes they use.
    pub fn hot_len(&self) -> usize {
        self.hot.len()
    }

    pub fn hot_bytes(&self) -> usize {
        self.hot.memory_bytes()
    }

    /// Record lookups served from memory (the hot tier's hits).
    pub fn hot_hits(&self) -> u64 {
        self.hot.hits()
    }

    pub fn hot_stats(&self) -> &crate::keyed::MapStats {
        self.hot.stats()
    }

    /// Drops records idle for longer than [`EngineOptions::idle_grace`] from
    /// the hot tier, and the empty slots of the others (a periodic sweeper
    /// calls it).
    pub fn sweep(&self) -> usize {
        let now = self.now();
        self.expire(now);
        self.flush_timelines(false);
        self.hot.sweep(
            now.saturating_sub(self.options.idle_grace),
            &self.store.written_seq(),
        )
    }

    /// Open reservations.
    pub fn open_reservations(&self) -> usize {
        self.reservations.open()
    }

    /// Bytes reservations account for (open ones and settled ones remembered
    /// until their deadline), against half of the memory budget.
    pub fn reservation_bytes(&self) -> usize {
        self.reservations.bytes()
    }

    /// Writes everything queued to disk, durably.
    pub fn flush(&self) -> Result<(), EngineError> {
        Ok(self.store.flush()?)
    }
}
