//! The decision core (DESIGN §2.5, §3, §6): definitions, the hot tier of
//! subject records, reservations, and what goes to the store.
//!
//! Where things are:
//! - [`registry`]: policies and campaigns, their parent chains.
//! - [`record`]: one subject's counters and pending debits, and their disk form.
//! - [`reservations`]: open reservations, idempotent ids, deadline expiry.
//! - [`decide`]: check, screen, commit, release, events (this file's `impl`s).
//!
//! **Lock order.** A decision that spans records takes: the user's (or policy
//! key's) hot-tier shard lock, then the campaign records of the chain in
//! ascending campaign id, then the store's submit lock. Ids are stable across
//! redefinitions, so the order is total and fixed and no two decisions can wait
//! on each other in a cycle. The reservation table's and the dedupe set's locks
//! are never held while a record lock is taken.

pub mod decide;
pub mod record;
pub mod registry;
pub mod reservations;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde::{Deserialize, Serialize};

use crate::clock::{Clock, MS, Nanos};
use crate::keyed::ShardedMap;
use crate::limits::Item;
use crate::model::campaign::CampaignDef;
use crate::model::limit::PolicyDef;
use crate::model::{DefinitionError, Warning};
use crate::store::{Op, Space, Store, StoreError, codec};

use record::{SubjectRecord, tag};
use registry::{CampaignEntry, PolicyEntry, Registry, stack_tags};
use reservations::Reservations;

pub use decide::{
    CandidateResult, CheckOutcome, CheckRequest, CheckTarget, CommitOutcome, CommitRequest,
    DeniedBy, Event, Outcome, PendingCommit, PendingEvents, ScreenCandidate, ScreenOutcome,
    ScreenRequest,
};

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
        }
    }
}

/// The default of [`EngineOptions::max_open_reservations`]. A
/// one-candidate screen's reservation measured 1 512 bytes of RSS (1 429
/// accounted), so with the default 1 GiB budget the budget's half binds
/// first (about 375 000); this bound holds for larger budgets: 1 000 000 open
/// is about 1.5 GB, and expires in about 1.4 s (700 000/s measured).
pub const DEFAULT_MAX_OPEN_RESERVATIONS: usize = 1_000_000;

/// Why a request failed. Each maps to one HTTP status (DESIGN §4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// 400: `field` names what is wrong.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// 404.
    #[error("{0}")]
    NotFound(String),
    /// 409.
    #[error("{0}")]
    Conflict(String),
    /// 503: no room for another reservation (the open count or its memory
    /// share is used up); nothing was reserved.
    #[error("{0}")]
    Overloaded(String),
    /// 500: the store failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Only inside [`Engine::check_in_memory`] and
    /// [`Engine::screen_in_memory`], which turn it into `None`: the record
    /// is not in memory and reading it would wait on disk.
    #[error("the record is not in memory")]
    NotInMemory,
}

thread_local! {
    /// Set while a `*_in_memory` call runs on this thread: a hot-tier miss
    /// then reads only what the store has in memory
    /// ([`Store::get_cached`]) and fails with [`EngineError::NotInMemory`]
    /// where it would have to wait on disk. A thread-local rather than a
    /// parameter, so the one decision path serves both kinds of call.
    static MEMORY_ONLY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a `*_in_memory` call runs on this thread.
fn memory_only() -> bool {
    MEMORY_ONLY.with(std::cell::Cell::get)
}

/// Sets [`MEMORY_ONLY`] for a scope and puts back what it was when the scope
/// ends, also by a panic.
struct MemoryOnly {
    before: bool,
}

impl MemoryOnly {
    /// Misses fail with [`EngineError::NotInMemory`] until dropped.
    fn set() -> Self {
        Self::to(true)
    }

    /// Misses read the store, waiting on disk if they must, until dropped:
    /// for the part of a call that must not fail half-way.
    fn lift() -> Self {
        Self::to(false)
    }

    fn to(on: bool) -> Self {
        MemoryOnly {
            before: MEMORY_ONLY.with(|m| m.replace(on)),
        }
    }
}

impl Drop for MemoryOnly {
    fn drop(&mut self) {
        MEMORY_ONLY.with(|m| m.set(self.before));
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
    /// Hot-tier lookups that found the record in memory / had to ask the store.
    pub hot_hits: AtomicU64,
    pub hot_misses: AtomicU64,
}

/// Event ids claimed whose write may not be on disk yet. The ids seen
/// within the horizon live in the store's dedupe space, each written in the
/// same batch as the event it counts, and are looked up there when an id
/// comes (RocksDB's bloom filters answer a new id from memory): nothing is
/// loaded at open, and memory holds only the ids between their claim and
/// their write, a writer queue's worth. (Kept in memory for the whole
/// horizon, ids cost 76 bytes each of RSS — 612 MB after 30 s of unique-id
/// batches — and a restart with 5 million of them spent 7.7 s loading them
/// before it listened.)
///
/// Sharded by the id's hash, so lookups of different ids rarely wait on
/// each other; a lookup reads the store under its shard's lock, so of two
/// batches claiming the same id, exactly one finds it free.
struct Dedupe {
    shards: Box<[Mutex<DedupeShard>]>,
}

/// Claimed ids not yet known written: by hash, the sequence of the batch
/// that writes it ([`UNSUBMITTED`] until submitted), and in that order.
#[derive(Default)]
struct DedupeShard {
    claimed: HashMap<u128, u64>,
    order: VecDeque<(u64, u128)>,
}

/// The batch sequence of an id claimed but not yet submitted.
pub(crate) const UNSUBMITTED: u64 = u64::MAX;

/// Shards of [`Dedupe`].
const DEDUPE_SHARDS: usize = 64;

impl Dedupe {
    fn new() -> Self {
        Dedupe {
            shards: (0..DEDUPE_SHARDS)
                .map(|_| Mutex::new(DedupeShard::default()))
                .collect(),
        }
    }

    fn shard(&self, h: u128) -> std::sync::MutexGuard<'_, DedupeShard> {
        self.shards[(h as usize) % DEDUPE_SHARDS]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl DedupeShard {
    /// Forgets claims whose batch is written: from now on the store has them.
    fn prune(&mut self, written: u64) {
        while let Some(&(seq, h)) = self.order.front() {
            if seq > written {
                break;
            }
            self.order.pop_front();
            if self.claimed.get(&h) == Some(&seq) {
                self.claimed.remove(&h);
            }
        }
    }
}

/// A definition as stored: its id and what the user wrote.
#[derive(Serialize, Deserialize)]
struct StoredDef<T> {
    id: u32,
    def: T,
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
    /// User and policy-key records, by their 128-bit key split in two words
    /// (a `u128` would make every entry 16-byte aligned: 64 bytes, not 56).
    hot: ShardedMap<[u64; 2], SubjectRecord>,
    reservations: Reservations,
    dedupe: Dedupe,
    /// SipHash key for subject and event-id hashes, per data directory, so ids
    /// a client picks cannot be made to collide.
    hash_key: [u8; 16],
    /// Random per process: made reservation ids differ from those of an earlier
    /// run, whose reservations are gone.
    id_nonce: u32,
    options: EngineOptions,
    pub stats: EngineStats,
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
                store
                    .submit(
                        vec![Op::Put(Space::Meta, META_HASH_KEY.to_vec(), k.to_vec())],
                        true,
                    )
                    .wait()?;
                k
            }
        };
        let mut reg = Registry::default();
        for (k, v) in store.scan(Space::Definitions)? {
            let (_, payload) = codec::unframe(&v).map_err(|m| corrupt(&k, m))?;
            let name = String::from_utf8_lossy(&k[2..]).into_owned();
            if k.starts_with(b"p/") {
                let d: StoredDef<PolicyDef> =
                    serde_json::from_slice(payload).map_err(|e| corrupt(&k, e.to_string()))?;
                let compiled = d.def.compile().map_err(|e| corrupt(&k, e.to_string()))?;
                reg.max_id = reg.max_id.max(d.id);
                reg.insert_policy(PolicyEntry {
                    id: d.id,
                    name,
                    tags: stack_tags(&d.def.limits),
                    def: d.def,
                    stack: Arc::new(compiled.stack),
                });
            } else if k.starts_with(b"c/") {
                let d: StoredDef<CampaignDef> =
                    serde_json::from_slice(payload).map_err(|e| corrupt(&k, e.to_string()))?;
                let compiled = d.def.compile().map_err(|e| corrupt(&k, e.to_string()))?;
                let record = match store.get(Space::State, &campaign_disk_key(d.id))? {
                    Some(v) => SubjectRecord::from_stored(&v).map_err(|m| corrupt(&k, m))?,
                    None => SubjectRecord::default(),
                };
                reg.max_id = reg.max_id.max(d.id);
                let entry = CampaignEntry {
                    id: d.id,
                    tags: campaign_tags(&compiled),
                    name: Arc::from(name.as_str()),
                    def: d.def,
                    compiled,
                    record: Arc::new(Mutex::new(record)),
                    chain: Vec::new(),
                };
                let e = Arc::new(entry);
                reg.campaigns_by_id.insert(e.id, e.clone());
                reg.campaigns.insert(name, e);
            }
        }
        reg.rechain();
        let hot = ShardedMap::new(options.memory_budget, options.shards);
        let reservations = Reservations::new(
            options.max_open_reservations,
            options.memory_budget / 2,
            hot.outside(),
        );
        Ok(Engine {
            last_now: AtomicU64::new(clock.now()),
            clock,
            hot,
            store,
            registry: RwLock::new(Arc::new(reg)),
            defs_write: Mutex::new(()),
            reservations,
            dedupe: Dedupe::new(),
            hash_key,
            id_nonce: options.id_nonce.unwrap_or_else(|| {
                let k = random_key();
                u32::from_le_bytes([k[0], k[1], k[2], k[3]])
            }),
            options,
            stats: EngineStats::default(),
        })
    }

    /// The engine's time now (never earlier than a time it already used).
    pub fn now(&self) -> Nanos {
        let t = self.clock.now();
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
    fn hash(&self, ns: u8, owner: u32, id: &str) -> u128 {
        use siphasher::sip128::{Hasher128, SipHasher13};
        let mut h = SipHasher13::new_with_key(&self.hash_key);
        h.write_u8(ns);
        h.write_u32(owner);
        h.write(id.as_bytes());
        h.finish128().as_u128()
    }

    /// A new reservation id: `r-<process nonce>-<sequence>`.
    pub(crate) fn new_reservation_id(&self) -> String {
        format!("r-{:08x}-{:x}", self.id_nonce, self.reservations.next_seq())
    }

    pub(crate) fn check_id(&self, field: &str, id: &str) -> Result<(), EngineError> {
        if id.is_empty() || id.len() > self.options.max_id_len {
            return Err(invalid(
                field,
                format!(
                    "must be 1 to {} bytes, got {}",
                    self.options.max_id_len,
                    id.len()
                ),
            ));
        }
        Ok(())
    }

    // ---- definitions ----

    /// Stores a policy (replacing any of that name) and returns its warnings.
    /// Counters of items whose definition is unchanged at the same index carry
    /// on; a changed item's counters start empty.
    pub fn put_policy(&self, name: &str, def: PolicyDef) -> Result<Vec<Warning>, EngineError> {
        check_def_name("name", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = (*self.registry()).clone();
        let id = match reg.policies.get(name) {
            Some(p) => p.id,
            None => reg.max_id + 1,
        };
        let value = codec::frame(
            0,
            &serde_json::to_vec(&StoredDef { id, def: &def }).unwrap_or_default(),
        );
        self.store
            .submit(
                vec![Op::Put(Space::Definitions, def_key(b"p/", name), value)],
                true,
            )
            .wait()?;
        reg.max_id = reg.max_id.max(id);
        reg.insert_policy(PolicyEntry {
            id,
            name: name.to_owned(),
            tags: stack_tags(&def.limits),
            def,
            stack: Arc::new(compiled.stack),
        });
        self.publish(reg);
        Ok(compiled.warnings)
    }

    pub fn get_policy(&self, name: &str) -> Option<PolicyDef> {
        self.registry().policies.get(name).map(|p| p.def.clone())
    }

    pub fn delete_policy(&self, name: &str) -> Result<(), EngineError> {
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = (*self.registry()).clone();
        if reg.remove_policy(name).is_none() {
            return Err(EngineError::NotFound(format!("no policy named {name:?}")));
        }
        self.store
            .submit(
                vec![Op::Delete(Space::Definitions, def_key(b"p/", name))],
                true,
            )
            .wait()?;
        self.publish(reg);
        Ok(())
    }

    /// Stores a campaign. Its parent must exist and must not make a cycle; a
    /// rejected put leaves the old definition. Counters follow the policy rule
    /// (unchanged items keep theirs); a new parent's caps apply from now on.
    pub fn put_campaign(&self, name: &str, def: CampaignDef) -> Result<Vec<Warning>, EngineError> {
        check_def_name("id", name)?;
        let compiled = def.compile()?;
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = (*self.registry()).clone();
        reg.chain_from(name, def.parent.as_deref())
            .map_err(|m| invalid("parent", m))?;
        let id = match reg.campaigns.get(name) {
            Some(c) => c.id,
            None => reg.max_id + 1,
        };
        let value = codec::frame(
            0,
            &serde_json::to_vec(&StoredDef { id, def: &def }).unwrap_or_default(),
        );
        self.store
            .submit(
                vec![Op::Put(Space::Definitions, def_key(b"c/", name), value)],
                true,
            )
            .wait()?;
        let warnings = compiled.warnings.clone();
        reg.insert_campaign(CampaignEntry {
            id,
            name: Arc::from(name),
            tags: campaign_tags(&compiled),
            def,
            compiled,
            record: Arc::new(Mutex::new(SubjectRecord::default())),
            chain: Vec::new(),
        });
        self.publish(reg);
        Ok(warnings)
    }

    pub fn get_campaign(&self, name: &str) -> Option<CampaignDef> {
        self.registry().campaigns.get(name).map(|c| c.def.clone())
    }

    /// Deletes a campaign without children (409 otherwise) and its counters.
    pub fn delete_campaign(&self, name: &str) -> Result<(), EngineError> {
        let _w = self
            .defs_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut reg = (*self.registry()).clone();
        if !reg.campaigns.contains_key(name) {
            return Err(EngineError::NotFound(format!("no campaign named {name:?}")));
        }
        if reg.has_children(name) {
            return Err(EngineError::Conflict(format!(
                "campaign {name:?} still has children; delete them first"
            )));
        }
        let Some(e) = reg.remove_campaign(name) else {
            return Err(EngineError::NotFound(format!("no campaign named {name:?}")));
        };
        self.store
            .submit(
                vec![
                    Op::Delete(Space::Definitions, def_key(b"c/", name)),
                    Op::Delete(Space::State, campaign_disk_key(e.id)),
                ],
                true,
            )
            .wait()?;
        self.publish(reg);
        Ok(())
    }

    // ---- hot tier ----

    /// Runs `f` on the hot-tier record `key` (disk key `disk`), loading it from
    /// the store on a miss. `f` runs under the record's shard lock.
    fn with_record<R>(
        &self,
        key: u128,
        disk: &[u8],
        now: Nanos,
        f: impl FnOnce(&mut SubjectRecord) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let failed: std::cell::Cell<Option<EngineError>> = std::cell::Cell::new(None);
        let fresh = || {
            let read = if memory_only() {
                self.store.get_cached(Space::State, disk)
            } else {
                Some(self.store.get(Space::State, disk))
            };
            let Some(read) = read else {
                // Nothing is decided on this stand-in: `f` is not called.
                failed.set(Some(EngineError::NotInMemory));
                return SubjectRecord::default();
            };
            self.stats.hot_misses.fetch_add(1, Ordering::Relaxed);
            match read {
                Ok(Some(v)) => match SubjectRecord::from_stored(&v) {
                    Ok(r) => r,
                    Err(m) => {
                        failed.set(Some(corrupt(disk, m).into()));
                        SubjectRecord::default()
                    }
                },
                Ok(None) => SubjectRecord::default(),
                Err(e) => {
                    failed.set(Some(e.into()));
                    SubjectRecord::default()
                }
            }
        };
        let written = self.store.written_seq();
        self.hot.with(&split(key), now, &written, fresh, |rec| {
            if let Some(e) = failed.take() {
                // An unreadable record is not decided on; it stays idle, so
                // the map does not keep it.
                return Err(e);
            }
            let r = f(rec);
            // Until its last batch is written, the copy on disk is older: keep
            // the record at least until then (see `SubjectRecord::write_seq`).
            if rec.write_seq > written {
                rec.idle_at = rec.idle_at.max(now + 1);
            }
            r
        })
    }

    /// [`Engine::check`] if it can be decided without waiting on disk (the
    /// key's record is in memory, as it is for any key used lately, or the
    /// store can answer from memory, as RocksDB's bloom filters do for a new
    /// key); `None` otherwise, having changed nothing — call `check` then,
    /// where waiting on disk is fine. An async server decides on its
    /// executor this way and moves only misses to a blocking thread.
    pub fn check_in_memory(&self, req: &CheckRequest) -> Option<Result<CheckOutcome, EngineError>> {
        let _only = MemoryOnly::set();
        match self.check(req) {
            Err(EngineError::NotInMemory) => None,
            r => Some(r),
        }
    }

    /// [`Engine::screen`] if the user's record is in memory; `None` (having
    /// changed nothing) if it must be read from the store. See
    /// [`Engine::check_in_memory`].
    pub fn screen_in_memory(
        &self,
        req: &ScreenRequest,
    ) -> Option<Result<ScreenOutcome, EngineError>> {
        let _only = MemoryOnly::set();
        match self.screen(req) {
            Err(EngineError::NotInMemory) => None,
            r => Some(r),
        }
    }

    /// Records in the hot tier, and the bytes they use.
    pub fn hot_len(&self) -> usize {
        self.hot.len()
    }

    pub fn hot_bytes(&self) -> usize {
        self.hot.memory_bytes()
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

    // ---- usage ----

    /// Each cap of `campaign` and its ancestors for `user` (DESIGN §3 usage).
    pub fn user_usage(&self, user: &str, campaign: &str) -> Result<Vec<CapUsage>, EngineError> {
        self.check_id("user", user)?;
        let now = self.now();
        self.expire_step(now);
        let reg = self.registry();
        let Some(c) = reg.campaigns.get(campaign) else {
            return Err(EngineError::NotFound(format!(
                "no campaign named {campaign:?}"
            )));
        };
        let ukey = self.hash(b'u', 0, user);
        let user_rec = match self.hot.get(&split(ukey), SubjectRecord::figures_copy) {
            Some(r) => r,
            None => match self.store.get(Space::State, &user_disk_key(ukey))? {
                Some(v) => SubjectRecord::from_stored(&v).map_err(|m| corrupt(b"user", m))?,
                None => SubjectRecord::default(),
            },
        };
        let mut out = Vec::new();
        for id in &c.chain {
            let Some(e) = reg.campaign_by_id(*id) else {
                continue;
            };
            let camp = e.record.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, cap) in e.compiled.items.iter().enumerate() {
                if !matches!(cap.item, Item::Rate { .. } | Item::Window(_)) {
                    continue;
                }
                let rec: &SubjectRecord = match cap.scope {
                    crate::model::Scope::User => &user_rec,
                    crate::model::Scope::Campaign => &camp,
                };
                let t = e.tags[i];
                let st = rec.state(e.id, t).unwrap_or(&decide::FRESH);
                let (remaining, reset_after) = cap.item.figures(st, now);
                let limit = cap.item.limit();
                let pending = rec.pending_on(e.id, t);
                out.push(CapUsage {
                    campaign: e.name.to_string(),
                    name: cap.name.clone(),
                    scope: cap.scope,
                    kind: cap.item.kind().as_str(),
                    limit,
                    used: limit.saturating_sub(remaining).saturating_sub(pending),
                    pending,
                    remaining,
                    reset_after,
                });
            }
        }
        Ok(out)
    }

    /// A campaign's budget delivery now.
    pub fn delivery(&self, campaign: &str) -> Result<Delivery, EngineError> {
        let now = self.now();
        self.expire_step(now);
        let reg = self.registry();
        let Some(c) = reg.campaigns.get(campaign) else {
            return Err(EngineError::NotFound(format!(
                "no campaign named {campaign:?}"
            )));
        };
        let Some((i, cap)) = c
            .compiled
            .items
            .iter()
            .enumerate()
            .find(|(_, x)| matches!(x.item, Item::Budget(_)))
        else {
            return Err(EngineError::NotFound(format!(
                "campaign {campaign:?} has no budget"
            )));
        };
        let Item::Budget(b) = &cap.item else {
            return Err(EngineError::NotFound(format!(
                "campaign {campaign:?} has no budget"
            )));
        };
        let rec = c.record.lock().unwrap_or_else(PoisonError::into_inner);
        let st = match rec.state(c.id, c.tags[i]) {
            Some(crate::limits::ItemState::Budget(s)) => **s,
            _ => Default::default(),
        };
        let v = b.view(&st, now);
        Ok(Delivery {
            campaign: c.name.to_string(),
            amount: cap.item.limit(),
            spent: v.spent,
            pending: v.pending,
            cap_now: v.cap,
            period_start: v.period.0,
            period_end: v.period.1,
        })
    }
}

/// One cap's usage for a user (`GET /v1/users/{u}/campaigns/{c}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapUsage {
    /// The campaign in the chain that owns the cap.
    pub campaign: String,
    pub name: String,
    pub scope: crate::model::Scope,
    pub kind: &'static str,
    pub limit: u64,
    /// Committed debits counted now.
    pub used: u64,
    /// Debits of open reservations.
    pub pending: u64,
    pub remaining: u64,
    pub reset_after: crate::clock::Span,
}

/// A campaign's budget now (`GET /v1/campaigns/{c}/delivery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub campaign: String,
    pub amount: u64,
    pub spent: u64,
    pub pending: u64,
    /// What the pacing allows to have been spent by now in this period.
    pub cap_now: u64,
    pub period_start: Nanos,
    pub period_end: Nanos,
}

fn check_def_name(field: &str, name: &str) -> Result<(), EngineError> {
    let ok = !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("must be 1-256 characters of A-Z a-z 0-9 . _ : -, got {name:?}"),
        ))
    }
}

/// A 128-bit key as the hot tier holds it.
fn split(k: u128) -> [u64; 2] {
    [k as u64, (k >> 64) as u64]
}

fn def_key(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn campaign_disk_key(id: u32) -> Vec<u8> {
    let mut k = vec![b'c'];
    k.extend_from_slice(&id.to_be_bytes());
    k
}

pub(crate) fn user_disk_key(h: u128) -> Vec<u8> {
    let mut k = vec![b'u'];
    k.extend_from_slice(&h.to_be_bytes());
    k
}

pub(crate) fn policy_disk_key(h: u128) -> Vec<u8> {
    let mut k = vec![b'k'];
    k.extend_from_slice(&h.to_be_bytes());
    k
}

fn campaign_tags(c: &crate::model::CompiledCampaign) -> Vec<u32> {
    c.items
        .iter()
        .enumerate()
        .map(|(i, x)| tag(i, x.fingerprint))
        .collect()
}

/// Milliseconds to ns, for ttl fields.
pub(crate) fn ms(x: u64) -> Nanos {
    x.saturating_mul(MS)
}
