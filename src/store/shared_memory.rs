//! [`SharedMemory`]: the shared store's contract in one process, the Rust
//! twin of each function of src/cluster/functions.lua, owner mode's
//! (`fc_own_v1`, `fc_cas_v2`, `fc_member_v1`) included, for tests of the
//! engine's shared path without a Redis.
//!
//! Where the twin differs from Redis: a record written by compare-and-set
//! keeps no expiry (its `expire_at` is not held: this store is for tests),
//! and plain [`Records::cas`] numbers versions current + 1 where `fc_cas_v1`
//! takes max(current + 1, the store's µs time); owner mode's functions take
//! the latter, as Redis does. An owner's claim of an absent record does
//! expire, after its `absent_ttl`, on the store's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use super::lease_args::*;
use super::shared::*;
use super::{Batch, KeyValues, MemoryStore, Receipt, Space, Store, StoreError, StoreStats};
use crate::clock::Nanos;

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
    /// A region's cap and its seq (`~c`, `~s` of `fc_line_cap_v1`).
    cap: Option<(u64, u64)>,
}

/// One record, as the Redis hash of src/cluster/functions.lua holds it.
#[derive(Debug, Clone, Default)]
struct Record {
    /// `v`: its version.
    version: u64,
    /// `b`: its value (`None`: an owner's claim of a user with no record
    /// yet, `fc_own_v1`).
    value: Option<Vec<u8>>,
    /// `e`: the epoch of the owner that last claimed or wrote it (0: none).
    epoch: u64,
    /// `h`: frozen as a hot key's since then (ms of the store's clock,
    /// `fc_hot_v1`).
    hot_since: Option<u64>,
    /// When it goes, ms of the store's clock: an owner's claim of an absent
    /// record, `absent_ttl` after it unless written (Redis's `PEXPIRE`).
    expires_ms: Option<u64>,
}

impl Record {
    /// Whether it is gone at `now_ms` (Redis: a key is expired once its time
    /// is past).
    fn expired(&self, now_ms: u64) -> bool {
        self.expires_ms.is_some_and(|t| now_ms > t)
    }
}

/// Records by key.
type Versioned = HashMap<Vec<u8>, Record>;

/// The record under `key` at `now_ms`: one whose time ran out is taken away
/// first, as Redis expires a key.
fn live<'a>(m: &'a mut Versioned, key: &[u8], now_ms: u64) -> Option<&'a mut Record> {
    if m.get(key).is_some_and(|r| r.expired(now_ms)) {
        m.remove(key);
    }
    m.get_mut(key)
}

/// The largest integer a Lua number (a double) holds exactly: the bound of
/// every argument and version of src/cluster/functions.lua (`MAX_INT`).
const MAX_INT: u64 = (1 << 53) - 1;

/// `uint_arg` of src/cluster/functions.lua: `v` if a Lua function takes it,
/// else its error.
fn uint_arg(f: &str, name: &str, v: u64) -> Result<u64, StoreError> {
    if v > MAX_INT {
        return Err(StoreError::Io(format!(
            "{f}: {name} must be a non-negative integer <= 2^53-1"
        )));
    }
    Ok(v)
}

/// One member's lease in [`SharedMemory`] (`n:<node>` of `fc_member_v1`).
#[derive(Debug, Clone)]
struct MemberLease {
    epoch: u64,
    /// From when it owns users (unix ms, the store's time).
    from_ms: u64,
    /// When its lease ends (same clock).
    expiry_ms: u64,
    addr: String,
}

impl MemberLease {
    /// As the members hash stores it: "epoch active_from_ms expiry_ms addr".
    fn text(&self) -> String {
        format!(
            "{} {} {} {}",
            self.epoch, self.from_ms, self.expiry_ms, self.addr
        )
    }
}

/// Owner mode's members hash (`fc:{members}`, `fc_member_v1`).
#[derive(Debug, Default)]
struct Members {
    /// `#epoch`: the last epoch given out (only grows).
    last_epoch: u64,
    /// By node name, in name order (Redis's `HGETALL` has an order of its
    /// own; no caller depends on it).
    by_node: std::collections::BTreeMap<String, MemberLease>,
}

/// A node's report: when (ms), its total, its heaviest keys.
type HeatOf = (u64, u64, Vec<(u128, u64)>);

/// Owner mode's loads (`fc:{members}:heat`, `fc_heat_v1`).
#[derive(Default)]
struct Heat {
    /// By node: when it reported (ms), its total and its heaviest keys.
    reports: std::collections::BTreeMap<String, HeatOf>,
    prev: Option<String>,
    next: Option<String>,
}

/// How long after its lease ended a member is removed from the members
/// (`fc_member_v1`: "over a minute ago").
const MEMBER_GONE_AFTER_MS: u64 = 60_000;

/// [`Shared`] in one process: several engines on one `Arc<SharedMemory>`
/// behave as nodes on one cluster.
#[derive(Default)]
pub struct SharedMemory {
    /// Definitions, meta and dedupe ids, as [`MemoryStore`] keeps them.
    plain: MemoryStore,
    records: Mutex<Versioned>,
    /// Owner mode's members (`fc_member_v1`).
    members: Mutex<Members>,
    /// Owner mode's loads (`fc_heat_v1`).
    heat: Mutex<Heat>,
    leases: Mutex<HashMap<Vec<u8>, Holders>>,
    slots: Mutex<HashMap<Vec<u8>, HashMap<String, SlotHolder>>>,
    /// Slots leases' caps and their seqs (`~c`, `~s` of `fc_slots_cap_v1`).
    slot_caps: Mutex<HashMap<Vec<u8>, (u64, u64)>>,
    claims: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    /// Notices by node nonce ([`LeaseCalls::notify`]).
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
    /// Lease calls, for tests (a global tier's calls: docs/regions.md).
    pub lease_calls: AtomicU64,
    /// Record reads, CAS calls and conflicts, for tests.
    pub reads: AtomicU64,
    pub cas_calls: AtomicU64,
    pub cas_conflicts: AtomicU64,
    /// While set, every record read fails, as a store that does not answer
    /// (a primary failing over): for tests.
    pub fail_reads: std::sync::atomic::AtomicBool,
    /// While set, every lease, line and slots call fails, as a global
    /// tier out of reach (docs/regions.md): for tests.
    pub fail_leases: std::sync::atomic::AtomicBool,
    /// While above 0, a compare-and-set that writes is applied and then
    /// answered as a primary whose replica did not confirm it in time
    /// (`StoreError::Unavailable`), and this is lowered by one: for tests.
    pub unconfirmed_writes: AtomicU64,
    lines: Mutex<HashMap<Vec<u8>, LineState>>,
    /// Adaptive plans by lease key: (anchor ms, base).
    plans: Mutex<HashMap<Vec<u8>, (u64, u64)>>,
    /// Weighted time by lease key (`~pf`, `~pid` in Redis).
    segments: Mutex<HashMap<Vec<u8>, Segments>>,
    /// Users across regions, as the global tier keeps them
    /// (src/cluster/travel.rs); nothing expires here.
    travel: Mutex<TravelTier>,
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

    /// An error while [`SharedMemory::fail_leases`] is set.
    fn leases_reachable(&self) -> Result<(), StoreError> {
        if self.fail_leases.load(Ordering::Acquire) {
            return Err(StoreError::Unavailable(
                "lease refused: fail_leases is set".into(),
            ));
        }
        Ok(())
    }

    /// The bytes of every record the store holds: for tests.
    pub fn record_bytes(&self) -> usize {
        let m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        m.values()
            .map(|r| r.value.as_ref().map_or(0, Vec::len))
            .sum()
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

    /// The members' time, unix ms: the store's clock if it has one
    /// (`with_clock`), else the system's. Unlike the lease functions' times,
    /// which the store only compares with each other, members' times go out
    /// ([`Membership`]) and are read as the cluster's time, which without a
    /// clock offset is the node's own.
    fn unix_ms(&self) -> u64 {
        match &self.clock {
            Some(_) => self.now_ms(),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        }
    }

    /// A compare-and-set that wrote `version`: answered `Written`, or, while
    /// `unconfirmed_writes` is above 0, as a write no replica confirmed.
    fn written(&self, version: u64) -> Result<Cas, StoreError> {
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

    /// A compare-and-set that found record `rec` (`None`: absent) at
    /// another version: its version and value, as `fc_cas_v1` answers.
    fn conflict(&self, rec: Option<&Record>) -> Cas {
        self.cas_conflicts.fetch_add(1, Ordering::Relaxed);
        Cas::Conflict {
            version: rec.map_or(0, |r| r.version),
            value: rec.and_then(|r| r.value.clone()),
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

fn op_space(op: &super::Op) -> Space {
    match op {
        super::Op::Put(s, ..) | super::Op::Delete(s, ..) => *s,
    }
}

impl Records for SharedMemory {
    fn read(&self, key: &[u8]) -> Result<Option<(u64, Vec<u8>)>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::Acquire) {
            return Err(StoreError::Io("read refused: fail_reads is set".into()));
        }
        let now = self.now_ms();
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        // An owner's claim with no value reads as absent (`HMGET v b`).
        Ok(live(&mut m, key, now).and_then(|r| Some((r.version, r.value.clone()?))))
    }

    /// `fc_peek_v1`: `None` while the record is at `version` (0: absent),
    /// which an owner's claim with no value is at too, else what
    /// [`Records::read`] gives.
    fn peek(&self, key: &[u8], version: u64) -> Result<Option<Option<(u64, Vec<u8>)>>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_reads.load(Ordering::Acquire) {
            return Err(StoreError::Io("read refused: fail_reads is set".into()));
        }
        let now = self.now_ms();
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let rec = live(&mut m, key, now);
        if rec.as_ref().map_or(0, |r| r.version) == version {
            return Ok(None);
        }
        Ok(Some(rec.and_then(|r| Some((r.version, r.value.clone()?)))))
    }

    fn cas(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        _expire_at: Nanos,
    ) -> Result<Cas, StoreError> {
        self.cas_calls.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let rec = live(&mut m, key, now);
        // `fc_cas_v3`: a frozen record is refused first, whatever the version.
        if let Some(r) = rec.as_ref()
            && let Some(since_ms) = r.hot_since
        {
            return Ok(Cas::Leased {
                since_ms,
                value: r.value.clone(),
            });
        }
        let current = rec.map_or(0, |r| r.version);
        if current != expected {
            return Ok(self.conflict(m.get(key)));
        }
        // The owner's epoch stays (`fc_cas_v1` sets `v` and `b` only); the
        // write's expiry replaces a claim's (here: none).
        let rec = m.entry(key.to_vec()).or_default();
        rec.version = current + 1;
        rec.value = Some(value.to_vec());
        rec.expires_ms = None;
        self.written(current + 1)
    }

    /// `fc_hot_v1`, step for step.
    fn hot(&self, key: &[u8], until: Nanos, freeze: bool) -> Result<Hot, StoreError> {
        self.cas_calls.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let current = live(&mut m, key, now).map_or(0, |r| r.version);
        let rec = match m.get_mut(key) {
            Some(r) if r.hot_since.is_some() => r,
            _ if !freeze => return Ok(Hot::Cold { version: current }),
            _ => {
                let r = m.entry(key.to_vec()).or_default();
                r.hot_since = Some(now);
                r.version = current + 1;
                r
            }
        };
        let until_ms = until.div_ceil(1_000_000);
        if let Some(t) = rec.expires_ms.as_mut() {
            *t = (*t).max(until_ms);
        }
        Ok(Hot::Frozen {
            since_ms: rec.hot_since.unwrap_or(now),
            expire_at_ms: rec.expires_ms.unwrap_or(0),
            value: rec.value.clone(),
        })
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
}

/// Owner mode: `fc_own_v1`, `fc_cas_v2` and `fc_member_v1`
/// (src/cluster/functions.lua) step for step, with the same replies and
/// errors (a Lua error reply is a [`StoreError::Io`] naming the function);
/// their tests against Redis are ops/test-functions.sh's, mirrored in this
/// file's. Versions are Redis's: max(current + 1, the store's µs time).
impl OwnedRecords for SharedMemory {
    /// `fc_own_v1`: an owner's claim raises the record's epoch `e` to
    /// `epoch` and moves its version, so no write made on an older copy
    /// lands; one by an earlier epoch than `e` is [`Owned::Fenced`], one by
    /// `e` itself changes nothing. An absent record is created with no value,
    /// to go `absent_ttl` (whole ms) after the claim unless written.
    fn own(&self, key: &[u8], epoch: u64, absent_ttl: Nanos) -> Result<Owned, StoreError> {
        const F: &str = "fc_own_v1";
        let epoch = uint_arg(F, "epoch", epoch)?;
        let ttl = uint_arg(F, "absent_ttl_ms", absent_ttl / 1_000_000)?;
        if epoch == 0 {
            return Err(StoreError::Io(format!("{F}: epoch must be at least 1")));
        }
        let now_us = self.now_us();
        let now = now_us / 1000;
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let (e, current, value) =
            live(&mut m, key, now).map_or((0, 0, None), |r| (r.epoch, r.version, r.value.clone()));
        if e > epoch {
            return Ok(Owned::Fenced(e));
        }
        if e == epoch {
            return Ok(Owned::Claimed {
                version: current,
                value,
            });
        }
        let version = (current + 1).max(now_us);
        if version > MAX_INT {
            return Err(StoreError::Io(format!("{F}: version would exceed 2^53-1")));
        }
        let rec = m.entry(key.to_vec()).or_default();
        rec.version = version;
        rec.epoch = epoch;
        if rec.value.is_none() && ttl > 0 {
            rec.expires_ms = Some(now.saturating_add(ttl));
        }
        Ok(Owned::Claimed { version, value })
    }

    /// `fc_cas_v2`: [`Cas::Fenced`] if a later owner claimed the record
    /// (nothing written, whatever version `expected` names), else
    /// `fc_cas_v1`, a write leaving the record's epoch at max(its, `epoch`).
    fn cas_owned(
        &self,
        key: &[u8],
        expected: u64,
        value: &[u8],
        _expire_at: Nanos,
        epoch: u64,
    ) -> Result<Cas, StoreError> {
        let epoch = uint_arg("fc_cas_v2", "epoch", epoch)?;
        self.cas_calls.fetch_add(1, Ordering::Relaxed);
        let now_us = self.now_us();
        let mut m = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        let e = live(&mut m, key, now_us / 1000).map_or(0, |r| r.epoch);
        if e > epoch {
            return Ok(Cas::Fenced(e));
        }
        // From here on it is fc_cas_v1, which names itself in its errors.
        const F: &str = "fc_cas_v1";
        let expected = uint_arg(F, "expected_version", expected)?;
        let current = m.get(key).map_or(0, |r| r.version);
        if current != expected {
            return Ok(self.conflict(m.get(key)));
        }
        let version = (current + 1).max(now_us);
        if version > MAX_INT {
            return Err(StoreError::Io(format!("{F}: version would exceed 2^53-1")));
        }
        let rec = m.entry(key.to_vec()).or_default();
        rec.version = version;
        rec.value = Some(value.to_vec());
        rec.expires_ms = None;
        rec.epoch = rec.epoch.max(epoch);
        self.written(version)
    }

    /// `fc_heat_v1`: stores this node's report; if the last table was made
    /// `every_ms` ago or more (or there is none) and a report no older than
    /// that counts anything, makes the next, applying `ahead_ms` from now;
    /// reports older than 2 × `every_ms` are removed.
    fn heat(&self, r: &HeatReport<'_>) -> Result<HeatTables, StoreError> {
        const F: &str = "fc_heat_v1";
        if r.node.is_empty() || r.node.len() > 128 || r.node.contains(' ') {
            return Err(StoreError::Io(format!(
                "{F}: node must be 1 to 128 bytes without spaces"
            )));
        }
        let total = uint_arg(F, "total", r.total)?;
        if r.top > 4096 {
            return Err(StoreError::Io(format!("{F}: top must be at most 4096")));
        }
        let every = uint_arg(F, "every_ms", r.every_ms)?;
        let ahead = uint_arg(F, "ahead_ms", r.ahead_ms)?;
        if r.heavy.len() > r.top {
            return Err(StoreError::Io(format!("{F}: at most `top` keys")));
        }
        for (_, w) in r.heavy {
            uint_arg(F, "weight", *w)?;
        }
        let now = self.unix_ms();
        let mut heat = self.heat.lock().unwrap_or_else(PoisonError::into_inner);
        heat.reports
            .insert(r.node.to_owned(), (now, total, r.heavy.to_vec()));
        let made = heat
            .next
            .as_deref()
            .and_then(crate::cluster::bounded::parse_table)
            .map(|(from, _)| from.saturating_sub(ahead));
        if made.is_none_or(|m| m.saturating_add(every) <= now) {
            heat.reports
                .retain(|_, (at, _, _)| at.saturating_add(every.saturating_mul(2)) >= now);
            let fresh: Vec<(u64, &[(u128, u64)])> = heat
                .reports
                .values()
                .filter(|(at, _, _)| at.saturating_add(every) >= now)
                .map(|(_, t, keys)| (*t, keys.as_slice()))
                .collect();
            if fresh.iter().any(|(t, _)| *t > 0) {
                let w = crate::cluster::bounded::merge(fresh, r.top);
                let text = crate::cluster::bounded::table_text(now.saturating_add(ahead), &w);
                heat.prev = heat.next.replace(text);
            }
        }
        Ok(HeatTables {
            now_ms: now,
            prev: heat.prev.clone(),
            next: heat.next.clone(),
        })
    }

    /// `fc_member_v1`: `epoch` 0 joins with the next epoch, owning nothing
    /// for one lease (`ttl_ms`), or until an earlier process of the same
    /// name's lease ends if that is later; otherwise renews the lease of
    /// that epoch to at least now + `ttl_ms` (0: ends it now), or answers
    /// [`Membership::Gone`] if it is not this node's or ran out. Members
    /// whose lease ended over a minute ago are removed.
    fn member(
        &self,
        node: &str,
        addr: &str,
        epoch: u64,
        ttl_ms: u64,
    ) -> Result<Membership, StoreError> {
        const F: &str = "fc_member_v1";
        if node.is_empty() || node.len() > 128 || node.contains(' ') {
            return Err(StoreError::Io(format!(
                "{F}: node must be 1 to 128 bytes without spaces"
            )));
        }
        if addr.is_empty() || addr.len() > 256 || addr.contains(' ') {
            return Err(StoreError::Io(format!(
                "{F}: addr must be 1 to 256 bytes without spaces"
            )));
        }
        let epoch = uint_arg(F, "epoch", epoch)?;
        let ttl = uint_arg(F, "ttl_ms", ttl_ms)?;
        if ttl == 0 && epoch == 0 {
            return Err(StoreError::Io(format!(
                "{F}: ttl_ms must be at least 1 to join"
            )));
        }
        let now = self.unix_ms();
        let mut all = self.members.lock().unwrap_or_else(PoisonError::into_inner);
        let current = all.by_node.get(node).cloned();
        let lease = if epoch == 0 {
            all.last_epoch += 1;
            let mut from_ms = now.saturating_add(ttl);
            if let Some(c) = &current
                && c.expiry_ms > now
            {
                from_ms = from_ms.max(c.expiry_ms);
            }
            MemberLease {
                epoch: all.last_epoch,
                from_ms,
                expiry_ms: from_ms.saturating_add(ttl),
                addr: addr.to_owned(),
            }
        } else {
            let Some(c) = current.filter(|c| c.epoch == epoch && c.expiry_ms > now) else {
                return Ok(Membership::Gone { now_ms: now });
            };
            let expiry_ms = match ttl {
                0 => now,
                _ => c.expiry_ms.max(now.saturating_add(ttl)),
            };
            MemberLease {
                expiry_ms,
                addr: addr.to_owned(),
                ..c
            }
        };
        let epoch = lease.epoch;
        all.by_node.insert(node.to_owned(), lease);
        all.by_node
            .retain(|_, m| m.expiry_ms.saturating_add(MEMBER_GONE_AFTER_MS) >= now);
        Ok(Membership::Lease {
            epoch,
            now_ms: now,
            members: all
                .by_node
                .iter()
                .map(|(n, m)| (n.clone(), m.text()))
                .collect(),
        })
    }
}

impl LeaseCalls for SharedMemory {
    /// The arithmetic of `fc_lease_v1` (src/cluster/functions.lua), for
    /// tests without a Redis: the tests of the function itself run against
    /// Redis (ops/test-functions.sh).
    fn lease(&self, req: &LeaseRequest<'_>) -> Result<LeaseGrant, StoreError> {
        self.leases_reachable()?;
        // As fc_lease_v2 refuses them (its numbers are Lua doubles): a
        // caller that passes here passes there.
        self.lease_calls.fetch_add(1, Ordering::Relaxed);
        const MAX_INT: u64 = (1 << 53) - 1;
        for (name, n) in [
            ("spent", req.spent),
            ("want", req.want),
            ("total", req.total),
            ("foreign", req.foreign),
            ("given", req.given),
        ] {
            if n > MAX_INT {
                return Err(StoreError::Io(format!(
                    "fc_lease_v2: {name} must be a non-negative integer <= 2^53-1"
                )));
            }
        }
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
        self.leases_reachable()?;
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
        // What the caller held: a cap lets it keep that much.
        let held = me.granted.saturating_sub(me.spent);
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
        let mut avail =
            (allowance(t0, (now_u + req.look_us) as f64) - granted as f64).max(0.0) as u64;
        // A region's cap: Σ granted <= max(Σ now, cap).
        // A region's line with no cap yet grants nothing (but what the
        // caller held).
        let cap = match line.cap {
            Some((c, _)) => Some(c),
            None => req.capped.then_some(0),
        }
        .map(|c| c.max(granted + held));
        let capped = cap.is_some_and(|c| c.saturating_sub(granted) < avail);
        if let Some(c) = cap.filter(|_| capped) {
            avail = c.saturating_sub(granted);
        }
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
        let mut retry_ms = if need > 0 && at > now_u as f64 {
            ((at - now_u as f64) / 1000.0).ceil() as u64
        } else {
            0
        };
        if capped && new < req.want {
            retry_ms = retry_ms.max(100);
        }
        line.t0 = Some(t0);
        Ok(LineGrant {
            spent: me.spent,
            granted: me.granted,
            spent_total: spent,
            retry_ms,
        })
    }

    fn line_cap(&self, req: &LeaseCap<'_>) -> Result<LineHeld, StoreError> {
        let now = self.now_us() / 1000;
        let mut all = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let line = all.entry(req.key.to_vec()).or_default();
        let seq = if req.seq == 0 { now } else { req.seq };
        let (cap, cap_seq) = match line.cap {
            Some((c, s)) if s > seq => (c, s),
            _ => {
                line.cap = Some((req.cap, seq));
                (req.cap, seq)
            }
        };
        let h = &line.holders;
        Ok(LineHeld {
            granted: h.folded
                + h.by_name
                    .values()
                    .map(|n| n.granted.max(n.spent))
                    .sum::<u64>(),
            wants: h
                .by_name
                .values()
                .filter(|n| !n.reclaimable(now))
                .map(|n| n.want)
                .sum(),
            now_ms: now,
            cap,
            seq: cap_seq,
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

    /// The arithmetic of `fc_slots_v2`, for tests without a Redis.
    fn slots(&self, req: &SlotsRequest<'_>) -> Result<SlotsGrant, StoreError> {
        self.leases_reachable()?;
        let now = self.now_us() / 1000;
        let mut all = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        // A region's cap (`fc_slots_cap_v1`'s `~c`) lowers the max.
        let max = match self
            .slot_caps
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(req.key)
        {
            Some(&(cap, _)) => req.max.min(cap),
            None => req.max,
        };
        let holders = all.entry(req.key.to_vec()).or_default();
        if let Some(me) = holders.get(req.holder)
            && req.seq <= me.seq
        {
            return Ok(SlotsGrant {
                granted: me.granted,
                target: me.granted.min(max),
            });
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
        let (mut left, mut share) = (max, demand);
        for (i, d) in demands.iter().enumerate() {
            let level = left.div_ceil((demands.len() - i) as u64);
            if *d >= level {
                share = share.min(level);
                break;
            }
            left -= d;
        }
        let target = share.min(max.saturating_sub(others));
        let granted = req.used.max(target);
        holders.insert(
            req.holder.to_owned(),
            SlotHolder {
                granted,
                seq: req.seq,
                demand,
                until: now + req.ttl_ms.max(req.hold_ms),
            },
        );
        Ok(SlotsGrant { granted, target })
    }

    fn slots_cap(&self, req: &LeaseCap<'_>) -> Result<SlotsHeld, StoreError> {
        let now = self.now_us() / 1000;
        let all = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let mut caps = self
            .slot_caps
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let seq = if req.seq == 0 { now } else { req.seq };
        let (cap, cap_seq) = match caps.get(req.key) {
            Some(&(c, s)) if s > seq => (c, s),
            _ => {
                caps.insert(req.key.to_vec(), (req.cap, seq));
                (req.cap, seq)
            }
        };
        let mut held = SlotsHeld {
            now_ms: now,
            cap,
            seq: cap_seq,
            ..SlotsHeld::default()
        };
        for h in all.get(req.key).into_iter().flat_map(|m| m.values()) {
            if h.until >= now {
                held.held += h.granted;
                held.demand += h.demand.max(h.granted);
                held.hold_ms = held.hold_ms.max(h.until - now);
            }
        }
        Ok(held)
    }

    fn lease_spent(&self, key: &[u8]) -> Result<u64, StoreError> {
        let leases = self.leases.lock().map_err(|_| StoreError::Closed)?;
        Ok(leases.get(key).map_or(0, |h| {
            h.folded + h.by_name.values().map(|h| h.spent + h.foreign).sum::<u64>()
        }))
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
}

/// [`Travel`]'s keys in one process: homes, each user's counts and applied
/// positions, and each home's travellers.
#[derive(Default)]
struct TravelTier {
    homes: HashMap<String, String>,
    counts: HashMap<String, std::collections::BTreeMap<Vec<u8>, u64>>,
    applied: HashMap<String, std::collections::BTreeMap<Vec<u8>, u64>>,
    travellers: HashMap<String, std::collections::BTreeSet<String>>,
}

impl Travel for SharedMemory {
    fn claim_homes(
        &self,
        region: &str,
        users: &[&str],
        _keep_ms: u64,
    ) -> Result<Vec<String>, StoreError> {
        let mut t = self.travel.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(users
            .iter()
            .map(|u| {
                t.homes
                    .entry((*u).to_owned())
                    .or_insert_with(|| region.to_owned())
                    .clone()
            })
            .collect())
    }

    fn travel_sync(&self, users: &[TravelSync<'_>]) -> Result<Vec<TravelView>, StoreError> {
        let mut t = self.travel.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(users
            .iter()
            .map(|s| {
                let c = t.counts.entry(s.user.to_owned()).or_default();
                c.extend(s.counts.iter().cloned());
                let counts = c.iter().map(|(f, n)| (f.clone(), *n)).collect();
                let a = t.applied.entry(s.user.to_owned()).or_default();
                a.extend(s.applied.iter().cloned());
                let applied = a.iter().map(|(f, n)| (f.clone(), *n)).collect();
                if s.home != s.here {
                    t.travellers
                        .entry(s.home.to_owned())
                        .or_default()
                        .insert(s.user.to_owned());
                }
                TravelView { counts, applied }
            })
            .collect())
    }

    fn travellers_of(&self, home: &str, most: usize) -> Result<Vec<String>, StoreError> {
        let t = self.travel.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(t.travellers
            .get(home)
            .map(|s| s.iter().take(most).cloned().collect())
            .unwrap_or_default())
    }
}

impl Catalog for SharedMemory {
    fn definitions_version(&self) -> Result<u64, StoreError> {
        Ok(self.definitions.load(Ordering::Acquire))
    }

    fn new_id(&self, above: u32) -> Result<u32, StoreError> {
        let next = self.ids.fetch_add(1, Ordering::AcqRel) + 1;
        let id = next.max(u64::from(above) + 1);
        self.ids.fetch_max(id, Ordering::AcqRel);
        u32::try_from(id).map_err(|_| StoreError::Io("definition ids are used up".into()))
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
}

#[cfg(test)]
mod tests {
    //! Owner mode's functions, as ops/test-functions.sh tests them against
    //! Redis ("owner mode: fc_own_v1, fc_cas_v2, fc_member_v1"), on a store
    //! whose clock the test moves.

    use std::sync::Arc;

    use super::*;
    use crate::clock::{Clock, MS, ManualClock};

    /// The store's time at the start: unix ns (µs on the store's clock).
    const T0: Nanos = 1_800_000_000_000 * MS;
    const KO: &[u8] = b"u-owned";
    const TTL: Nanos = 60_000 * MS;

    fn store() -> (SharedMemory, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(T0));
        let c = clock.clone();
        (SharedMemory::with_clock(move || c.now() / 1000), clock)
    }

    fn claimed(o: Owned) -> (u64, Option<Vec<u8>>) {
        match o {
            Owned::Claimed { version, value } => (version, value),
            other => panic!("not claimed: {other:?}"),
        }
    }

    fn written(c: Cas) -> u64 {
        match c {
            Cas::Written(v) => v,
            other => panic!("not written: {other:?}"),
        }
    }

    fn lease(m: Membership) -> (u64, u64, Vec<(String, String)>) {
        match m {
            Membership::Lease {
                epoch,
                now_ms,
                members,
            } => (epoch, now_ms, members),
            other => panic!("no lease: {other:?}"),
        }
    }

    /// A member's (epoch, active_from_ms, expiry_ms, addr), as
    /// `Owners` parses it.
    fn entry(members: &[(String, String)], node: &str) -> Option<(u64, u64, u64, String)> {
        let (_, v) = members.iter().find(|(n, _)| n == node)?;
        let mut p = v.splitn(4, ' ');
        Some((
            p.next()?.parse().ok()?,
            p.next()?.parse().ok()?,
            p.next()?.parse().ok()?,
            p.next()?.to_owned(),
        ))
    }

    fn io_error(r: Result<impl std::fmt::Debug, StoreError>) -> String {
        match r {
            Err(StoreError::Io(m)) => m,
            other => panic!("not an Io error: {other:?}"),
        }
    }

    /// "claim of an absent record: claimed, no blob": the claim has a
    /// version and no value, reads as absent, peeks as current, and a claim
    /// again by the same owner changes nothing.
    #[test]
    fn a_claim_of_an_absent_record_has_a_version_and_no_value() {
        let (s, _) = store();
        let (v, value) = claimed(s.own(KO, 5, TTL).unwrap());
        assert_eq!(value, None);
        assert!(
            v >= T0 / 1000,
            "a claim's version is the store's µs time: {v}"
        );
        assert_eq!(claimed(s.own(KO, 5, TTL).unwrap()), (v, None));
        assert_eq!(s.read(KO).unwrap(), None);
        assert_eq!(s.peek(KO, v).unwrap(), None, "at the claim's version");
        assert_eq!(s.peek(KO, 0).unwrap(), Some(None), "moved, no value");
        // A write against "absent" is refused: the claim stands.
        assert_eq!(
            s.cas_owned(KO, 0, b"x", 0, 5).unwrap(),
            Cas::Conflict {
                version: v,
                value: None
            }
        );
        assert_eq!(
            s.cas(KO, 0, b"x", 0).unwrap(),
            Cas::Conflict {
                version: v,
                value: None
            }
        );
        assert_eq!(s.record_bytes(), 0);
    }

    /// The rest of the script's owner-mode cases: the owner writes, a later
    /// owner claims and reads the value with a moved version, the deposed
    /// owner can neither write (even at the current version) nor claim it
    /// back, the new owner writes; epoch 0 is refused.
    #[test]
    fn a_later_owners_claim_fences_the_earlier_owner() {
        let (s, clock) = store();
        let (vo, _) = claimed(s.own(KO, 5, TTL).unwrap());
        let vw = written(s.cas_owned(KO, vo, b"mine", 0, 5).unwrap());
        assert!(vw > vo);
        let (vn, value) = claimed(s.own(KO, 6, TTL).unwrap());
        assert_eq!(value.as_deref(), Some(&b"mine"[..]));
        assert!(vn > vw, "the claim moved the version ({vw} < {vn})");
        assert_eq!(s.cas_owned(KO, vn, b"stale", 0, 5).unwrap(), Cas::Fenced(6));
        assert_eq!(s.own(KO, 5, TTL).unwrap(), Owned::Fenced(6));
        assert_eq!(s.read(KO).unwrap(), Some((vn, b"mine".to_vec())));
        clock.advance(MS);
        let v = written(s.cas_owned(KO, vn, b"new", 0, 6).unwrap());
        assert!(v > vn);
        assert_eq!(s.read(KO).unwrap(), Some((v, b"new".to_vec())));
        assert_eq!(
            io_error(s.own(KO, 0, TTL)),
            "fc_own_v1: epoch must be at least 1"
        );
        assert_eq!(
            io_error(s.own(KO, MAX_INT + 1, TTL)),
            "fc_own_v1: epoch must be a non-negative integer <= 2^53-1"
        );
    }

    /// "A write leaves `e` at max(e, epoch)": a write by a later epoch than
    /// the claim's fences the claimer; a plain compare-and-set keeps the
    /// epoch, and a fenced write changes nothing, counted as a call and no
    /// conflict.
    #[test]
    fn a_write_raises_the_records_epoch_and_a_plain_cas_keeps_it() {
        let (s, _) = store();
        let (v, _) = claimed(s.own(KO, 5, TTL).unwrap());
        let v = written(s.cas_owned(KO, v, b"a", 0, 7).unwrap());
        assert_eq!(s.own(KO, 6, TTL).unwrap(), Owned::Fenced(7));
        let v = written(s.cas(KO, v, b"b", 0).unwrap());
        assert_eq!(s.own(KO, 6, TTL).unwrap(), Owned::Fenced(7));
        assert_eq!(s.cas_owned(KO, v, b"c", 0, 6).unwrap(), Cas::Fenced(7));
        assert_eq!(s.cas_calls.load(Ordering::Relaxed), 3);
        assert_eq!(s.cas_conflicts.load(Ordering::Relaxed), 0);
        assert_eq!(s.read(KO).unwrap(), Some((v, b"b".to_vec())));
        // A stale version is a conflict, with the current record.
        assert_eq!(
            s.cas_owned(KO, v - 1, b"c", 0, 7).unwrap(),
            Cas::Conflict {
                version: v,
                value: Some(b"b".to_vec())
            }
        );
        assert_eq!(s.cas_conflicts.load(Ordering::Relaxed), 1);
    }

    /// Versions only grow across claims and writes, also on a clock that
    /// stands still, and a claim by the record's own epoch moves nothing.
    #[test]
    fn versions_only_grow_across_claims() {
        let (s, _) = store();
        let mut last = 0;
        let mut seen = |v: u64| {
            assert!(v > last, "{v} after {last}");
            last = v;
        };
        let (v, _) = claimed(s.own(KO, 1, TTL).unwrap());
        seen(v);
        let mut v = written(s.cas_owned(KO, v, b"1", 0, 1).unwrap());
        seen(v);
        for epoch in 2..6 {
            let (c, value) = claimed(s.own(KO, epoch, TTL).unwrap());
            seen(c);
            assert!(value.is_some());
            assert_eq!(claimed(s.own(KO, epoch, TTL).unwrap()).0, c);
            v = written(s.cas_owned(KO, c, b"w", 0, epoch).unwrap());
            seen(v);
            v = written(s.cas(KO, v, b"p", 0).unwrap());
            seen(v);
        }
        assert_eq!(s.read(KO).unwrap().map(|(v, _)| v), Some(v));
    }

    /// "the claim stands for a while (absent_ttl_ms)": a claim of an absent
    /// record goes after its ttl unless written; then the owner's write
    /// against it conflicts with "absent" and a new claim has a higher
    /// version. A written claim, or one made with no ttl, stays.
    #[test]
    fn a_claim_of_an_absent_record_runs_out_unless_written() {
        let (s, clock) = store();
        let (v, _) = claimed(s.own(KO, 5, 1_000 * MS).unwrap());
        clock.advance(1_000 * MS);
        assert_eq!(s.peek(KO, v).unwrap(), None, "still there at its ttl");
        clock.advance(MS);
        assert_eq!(s.peek(KO, v).unwrap(), Some(None), "gone just after");
        assert_eq!(s.read(KO).unwrap(), None);
        assert_eq!(
            s.cas_owned(KO, v, b"late", 0, 5).unwrap(),
            Cas::Conflict {
                version: 0,
                value: None
            }
        );
        // Its epoch went with it: an earlier owner may claim it now.
        let (again, value) = claimed(s.own(KO, 4, 1_000 * MS).unwrap());
        assert_eq!(value, None);
        assert!(again > v);
        // A later claim of the still-absent record sets its ttl afresh.
        clock.advance(900 * MS);
        let (c, _) = claimed(s.own(KO, 5, 1_000 * MS).unwrap());
        clock.advance(900 * MS);
        assert_eq!(
            s.peek(KO, c).unwrap(),
            None,
            "the ttl counts from the later claim"
        );
        // Written, it stays.
        written(s.cas_owned(KO, c, b"mine", 0, 5).unwrap());
        clock.advance(10 * TTL);
        assert_eq!(s.read(KO).unwrap().map(|(_, b)| b), Some(b"mine".to_vec()));
        // A claim with no ttl stays too.
        let (k, _) = claimed(s.own(b"u-other", 5, 0).unwrap());
        clock.advance(10 * TTL);
        assert_eq!(s.peek(b"u-other", k).unwrap(), None);
    }

    /// `fc_heat_v1`'s twin: reports merge into one table, made at most
    /// every `every_ms` and applying `ahead_ms` later; stale reports leave.
    #[test]
    fn heat_reports_make_one_table_ahead_of_time() {
        use crate::cluster::bounded::parse_table;
        let (s, clock) = store();
        let report = |node, total, heavy| HeatReport {
            node,
            total,
            heavy,
            top: 2,
            every_ms: 10_000,
            ahead_ms: 6_000,
        };
        let t0 = clock.now() / MS;
        let nothing = s.heat(&report("n1", 0, &[])).unwrap();
        assert_eq!(
            (nothing.prev, nothing.next),
            (None, None),
            "no decisions, no table"
        );
        let first = s.heat(&report("n1", 100, &[(7, 60), (8, 10)])).unwrap();
        let (from, w) = parse_table(first.next.as_deref().unwrap()).unwrap();
        assert_eq!(
            (from, w.heavy, w.rest),
            (t0 + 6_000, vec![(7, 60), (8, 10)], 30)
        );
        clock.advance(5_000 * MS);
        let early = s.heat(&report("n2", 50, &[(8, 45)])).unwrap();
        assert_eq!(early.next, first.next, "a table is made at most every 10 s");
        clock.advance(5_000 * MS);
        let second = s.heat(&report("n1", 20, &[(7, 20)])).unwrap();
        assert_eq!(second.prev, first.next);
        let (from, w) = parse_table(second.next.as_deref().unwrap()).unwrap();
        assert_eq!(from, t0 + 16_000);
        assert_eq!(
            (w.heavy, w.rest),
            (vec![(8, 45), (7, 20)], 5),
            "n1's latest, n2's"
        );
        clock.advance(21_000 * MS);
        let third = s.heat(&report("n1", 1, &[])).unwrap();
        let (_, w) = parse_table(third.next.as_deref().unwrap()).unwrap();
        assert_eq!(
            (w.heavy, w.rest),
            (vec![], 1),
            "n2's report is too old to count"
        );
        let bad = s.heat(&report("n 1", 1, &[])).unwrap_err();
        assert!(bad.to_string().contains("node must be"), "{bad}");
        let bad = s
            .heat(&report("n1", 1, &[(1, 1), (2, 1), (3, 1)]))
            .unwrap_err();
        assert!(bad.to_string().contains("at most `top` keys"), "{bad}");
    }

    /// The script's `fc_member_v1` cases, and what it says without a test
    /// there: a join gets the next epoch and owns nothing for a lease; a
    /// renewal of that epoch holds, another's is gone; leaving ends the lease
    /// at the call, after which a renewal is gone; a lease that ran out is
    /// gone; a restarted process waits for its predecessor's lease; members
    /// gone over a minute are removed; epochs only grow.
    #[test]
    fn members_join_renew_leave_and_run_out() {
        let (s, clock) = store();
        let now = || clock.now() / MS;
        let (e1, at, members) = lease(s.member("n1", "127.0.0.1:1", 0, 2_000).unwrap());
        assert_eq!((e1, at), (1, now()), "a join gets the first epoch");
        assert_eq!(
            entry(&members, "n1"),
            Some((1, now() + 2_000, now() + 4_000, "127.0.0.1:1".into())),
            "a member owns nothing for a lease after it joined"
        );
        clock.advance(500 * MS);
        let (e, _, members) = lease(s.member("n1", "127.0.0.1:1", 1, 2_000).unwrap());
        assert_eq!(e, 1, "a renewal of that epoch holds");
        assert_eq!(
            entry(&members, "n1").map(|m| (m.1, m.2)),
            Some((T0 / MS + 2_000, T0 / MS + 4_000)),
            "a renewal never shortens the lease, nor moves its start"
        );
        assert_eq!(
            s.member("n1", "127.0.0.1:1", 7, 2_000).unwrap(),
            Membership::Gone { now_ms: now() },
            "a renewal of another epoch is gone: join again"
        );
        let (e2, _, members) = lease(s.member("n2", "127.0.0.1:2", 0, 2_000).unwrap());
        assert_eq!(e2, 2, "a second member gets the next epoch");
        assert_eq!(members.len(), 2);
        assert!(entry(&members, "n2").is_some_and(|m| m.1 >= now() + 2_000));
        clock.advance(3_000 * MS);
        let (_, _, members) = lease(s.member("n1", "127.0.0.1:1", 1, 2_000).unwrap());
        assert_eq!(
            entry(&members, "n1").map(|m| m.2),
            Some(now() + 2_000),
            "renewed to now + ttl"
        );
        let (e, _, members) = lease(s.member("n1", "127.0.0.1:1", 1, 0).unwrap());
        assert_eq!(e, 1, "n1 leaves: answered with its lease");
        assert_eq!(
            entry(&members, "n1").map(|m| m.2),
            Some(now()),
            "its lease ended at the call"
        );
        assert!(matches!(
            s.member("n1", "127.0.0.1:1", 1, 2_000).unwrap(),
            Membership::Gone { .. }
        ));
        // n2's lease (to join + 4 s) runs out unrenewed.
        clock.advance(2_000 * MS);
        assert_eq!(
            s.member("n2", "127.0.0.1:2", 2, 2_000).unwrap(),
            Membership::Gone { now_ms: now() }
        );
        // A process of n2's name restarted while a lease of n2 runs waits
        // for it: n3 joins, then n3 restarts at once.
        let (e3, _, members) = lease(s.member("n3", "127.0.0.1:3", 0, 2_000).unwrap());
        assert_eq!(e3, 3);
        let (_, _, expiry, _) = entry(&members, "n3").unwrap();
        clock.advance(100 * MS);
        let (e4, _, members) = lease(s.member("n3", "127.0.0.1:30", 0, 2_000).unwrap());
        assert_eq!(e4, 4, "epochs only grow");
        assert_eq!(
            entry(&members, "n3"),
            Some((4, expiry, expiry + 2_000, "127.0.0.1:30".into())),
            "from the end of its predecessor's lease"
        );
        assert!(matches!(
            s.member("n3", "127.0.0.1:3", 3, 2_000).unwrap(),
            Membership::Gone { .. }
        ));
        // n1 and n2 ended; over a minute later they are removed.
        let n2_end = T0 / MS + 500 + 4_000;
        clock.set((n2_end + MEMBER_GONE_AFTER_MS) * MS);
        let (_, _, members) = lease(s.member("n3", "127.0.0.1:30", 0, 2_000).unwrap());
        assert!(
            entry(&members, "n2").is_some(),
            "a minute after its end: kept"
        );
        clock.advance(MS);
        let (e, _, members) = lease(s.member("n5", "127.0.0.1:5", 0, 2_000).unwrap());
        assert_eq!(e, 6);
        let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["n3", "n5"]);
    }

    /// The arguments `fc_member_v1` refuses.
    #[test]
    fn members_refuse_bad_arguments() {
        let (s, _) = store();
        assert_eq!(
            io_error(s.member("n4", "127.0.0.1:4", 0, 0)),
            "fc_member_v1: ttl_ms must be at least 1 to join"
        );
        assert_eq!(
            io_error(s.member("n 3", "127.0.0.1:3", 0, 2_000)),
            "fc_member_v1: node must be 1 to 128 bytes without spaces"
        );
        assert_eq!(
            io_error(s.member("", "127.0.0.1:3", 0, 2_000)),
            "fc_member_v1: node must be 1 to 128 bytes without spaces"
        );
        assert_eq!(
            io_error(s.member("n3", "", 0, 2_000)),
            "fc_member_v1: addr must be 1 to 256 bytes without spaces"
        );
        assert_eq!(
            io_error(s.member("n3", "127.0.0.1:3", 0, MAX_INT + 1)),
            "fc_member_v1: ttl_ms must be a non-negative integer <= 2^53-1"
        );
        // Refused calls gave out no epoch.
        assert_eq!(lease(s.member("n3", "a:1", 0, 2_000).unwrap()).0, 1);
    }

    /// Without a clock of its own, members' times are unix ms.
    #[test]
    fn members_times_are_unix_ms_without_a_clock() {
        let s = SharedMemory::new();
        let before = crate::clock::SystemClock::new().now() / MS;
        let (_, now_ms, _) = lease(s.member("n1", "a:1", 0, 2_000).unwrap());
        assert!(now_ms + 1_000 >= before && now_ms < before + 60_000);
    }
}
