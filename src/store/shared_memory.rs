//! [`SharedMemory`]: the shared store's contract in one process, the Rust
//! twin of each function of src/cluster/functions.lua, for tests of the
//! engine's shared path without a Redis.

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
}

/// Owner mode: not yet here (the defaults answer `Unsupported`).
impl OwnedRecords for SharedMemory {}

impl LeaseCalls for SharedMemory {
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
