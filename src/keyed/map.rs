//! A sharded, memory-bounded map from key to record: the structure under
//! [`super::KeyedLimiter`] and under the engine's hot tier.
//!
//! Design:
//! - **Shards, each a `std::sync::Mutex` around a hashbrown `HashTable`.** A
//!   decision holds its shard's lock for a few dozen nanoseconds and never across
//!   an `.await`, so a blocking std mutex (futex-based, uncontended in one atomic
//!   op) is cheaper than an async one. Shards are cache-line padded so two cores
//!   working on neighbouring shards do not bounce one line.
//! - **One hash per operation.** The key is hashed once with foldhash (fast and
//!   seeded per map, so keys chosen by clients cannot force collisions); the high
//!   bits pick the shard and the same hash indexes the shard's table.
//! - **A memory budget, enforced on insert and on growth.** Each shard may use
//!   `budget / shards` bytes: its table (a fixed number of buckets is never
//!   exceeded) plus the heap its records own, with the table counted at the
//!   size the next insert gives it. When an
//!   insert would exceed it (or a record's heap grew past it), the shard first
//!   drops every *idle* record — one whose state equals a fresh one, so dropping
//!   it changes no future answer. Only if that frees less than an eighth does it
//!   evict *active* records, those closest to idle first, and count them in
//!   [`MapStats::evicted_active`]: the budget is then too small for the traffic
//!   and an operator needs to know. Both sweeps are O(shard) and happen at most
//!   once per eighth of a shard's capacity in inserts, so O(1) amortized.
//! - **Both cache misses of a lookup at once.** In a table larger than the
//!   cache, a hashbrown lookup misses twice, one after the other: on the control
//!   bytes, then on the entry they point to. The entry's likely place (its home
//!   bucket, where most entries sit) is known from the hash alone, so it is
//!   prefetched together with the control bytes, before the lock is taken and
//!   the clock read ([`ShardedMap::with_now`]): the two misses, the lock and the
//!   clock then overlap.
//! - **Hot records read without a lock.** A record may publish a `u64` view
//!   of itself ([`Record::published`]; a `rate` key's TAT). A record that an
//!   operation leaves unchanged (a denial: the hot keys) takes one of its
//!   shard's few published slots, and every later change of it is written
//!   there under the lock, so [`ShardedMap::published`] reads it with loads
//!   only, as a seqlock: no lock, no write. A denial on a hot key then costs
//!   what governor's does (one atomic read of the TAT) instead of a lock and
//!   an unlock.
//! - **Records that never mattered are never stored.** An operation on an absent
//!   key runs on a fresh record and inserts it only if it is no longer idle (a
//!   denied request or a peek on a new key allocates nothing).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::clock::Nanos;

/// What the map needs to know about its records.
pub trait Record {
    /// What interpreting a record needs (e.g. the limit definitions its states
    /// belong to); passed in rather than stored, so records stay small.
    type Ctx: ?Sized;
    /// The first instant from which the record equals a fresh one if left alone.
    /// A record with `idle_at(..) <= now` may be dropped at `now`.
    fn idle_at(&self, ctx: &Self::Ctx) -> Nanos;
    /// Heap bytes the record owns beyond its inline size (counted in the budget).
    fn heap_bytes(&self) -> usize;
    /// Whether records under `ctx` can own heap at all; when not, the map skips
    /// measuring them on every access.
    fn may_own_heap(_ctx: &Self::Ctx) -> bool {
        true
    }
    /// Whether a record's heap, once it is in the map, keeps its size whatever
    /// is done to it (e.g. several fixed-size states boxed together); when so,
    /// the map skips measuring it on every access.
    fn heap_fixed(ctx: &Self::Ctx) -> bool {
        !Self::may_own_heap(ctx)
    }
    /// Whether the record must not be dropped while active, whatever the
    /// budget says: e.g. it holds debits of open reservations, or changes not
    /// yet on disk, which a copy read back later would miss. Idle records are
    /// dropped regardless (they equal fresh ones).
    fn pinned(&self, _ctx: &Self::Ctx) -> bool {
        false
    }
    /// Drops what a record that is kept holds but reads the same as nothing
    /// (say, counters of campaigns a user was screened for and not shown),
    /// so a busy record does not keep them until it goes idle as a whole.
    /// Returns the heap bytes freed. The sweeper calls it on every record it
    /// keeps, so it should look only at the record's inline fields unless
    /// there is likely something to drop. Nothing, by default.
    fn prune(&mut self, _ctx: &Self::Ctx) -> usize {
        0
    }
    /// A view of the record that readers may see without the lock
    /// ([`ShardedMap::published`]): it must change whenever the record does.
    /// None, by default (nothing is published).
    fn published(&self) -> Option<u64> {
        None
    }
}

/// One published record of a shard: its key's hash and its view, under a
/// sequence number that is odd while it is being written (a seqlock: the
/// writer holds the shard's lock, readers only load).
#[derive(Default)]
struct Slot {
    seq: AtomicU64,
    hash: AtomicU64,
    value: AtomicU64,
}

/// Published slots per shard: a shard's hot keys are few (a key denied again
/// and again is what fills one), and 4 slots of 24 bytes fit one padded line.
const SLOTS: usize = 4;

impl Slot {
    /// The view of the record whose key hashes to `hash`, if this slot holds it.
    #[inline(always)]
    fn read(&self, hash: u64) -> Option<u64> {
        let s1 = self.seq.load(Ordering::Acquire);
        let h = self.hash.load(Ordering::Relaxed);
        let v = self.value.load(Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Acquire);
        let s2 = self.seq.load(Ordering::Relaxed);
        (s1 == s2 && s1 & 1 == 0 && h == hash).then_some(v)
    }

    /// Writes `hash` and `value`; only under the shard's lock.
    fn write(&self, hash: u64, value: u64) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        self.hash.store(hash, Ordering::Relaxed);
        self.value.store(value, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }
}

/// Counters of a map's life, for metrics and tests.
#[derive(Debug, Default)]
pub struct MapStats {
    /// Idle records dropped to make room (lossless).
    pub evicted_idle: AtomicU64,
    /// Active records dropped because the budget was too small (their state was
    /// lost: the next request for the key starts fresh).
    pub evicted_active: AtomicU64,
}

struct Shard<K, V> {
    table: HashTable<(K, V)>,
    /// Sum of `heap_bytes()` over the shard's records.
    heap: usize,
    /// Lookups that found their key in memory: counted under the shard's
    /// lock, so the hot path pays no shared atomic for it.
    hits: u64,
}

/// A shard behind its lock, with where its table lies for prefetching.
struct ShardCell<K, V> {
    shard: Mutex<Shard<K, V>>,
    /// The table's control bytes (null before it allocates). hashbrown keeps
    /// bucket `i`'s entry just below them, at `ctrl - (i + 1) * size_of::<(K, V)>()`
    /// (checked by a test), and a key's probe starts at bucket `hash & mask`.
    /// Written under the lock whenever an insert may have moved the table;
    /// read without it, since a stale value only makes a prefetch useless.
    ctrl: AtomicPtr<u8>,
    /// `buckets - 1`.
    mask: AtomicUsize,
    /// Published records, on their own line so lock-free readers do not
    /// share one with the lock's writers.
    slots: CachePadded<[Slot; SLOTS]>,
}

/// A shard cell alone on its cache line(s).
type PaddedCell<K, V> = CachePadded<ShardCell<K, V>>;

/// Asks the CPU to start loading the cache line at `p` without waiting for it.
/// A hint only: it never faults, whatever the address.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` reads nothing architecturally and cannot fault, for
    // any address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl<K, V> ShardCell<K, V> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shard<K, V>> {
        self.shard.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prefetches what a lookup of `hash` reads first: the control bytes of its
    /// probe's first group and its home bucket's entry.
    #[inline(always)]
    fn prefetch(&self, hash: u64) {
        let ctrl = self.ctrl.load(Ordering::Relaxed);
        if ctrl.is_null() {
            return;
        }
        let size = std::mem::size_of::<(K, V)>();
        let i = hash as usize & self.mask.load(Ordering::Relaxed);
        // hashbrown reads a group of 16 control bytes from bucket i on.
        prefetch(ctrl.wrapping_add(i));
        prefetch(ctrl.wrapping_add(i + 15));
        let entry = ctrl.wrapping_sub((i + 1) * size);
        prefetch(entry);
        prefetch(entry.wrapping_add(size.saturating_sub(1)));
    }

    /// The slot `hash` may be published in.
    #[inline(always)]
    fn slot(&self, hash: u64) -> &Slot {
        // Bits 20.. : neither the shard (40..) nor hashbrown's bucket (low)
        // nor its tag (top seven) bits, for any table this map builds.
        &self.slots[(hash >> 20) as usize % SLOTS]
    }

    /// After an operation on the record of `hash` whose view was `before`
    /// and is `after` (under the lock): an unchanged record takes its slot,
    /// a changed one updates the slot it holds.
    #[inline]
    fn publish(&self, hash: u64, before: Option<u64>, after: Option<u64>) {
        let slot = self.slot(hash);
        let held = slot.hash.load(Ordering::Relaxed) == hash;
        match (after, held) {
            (Some(v), false) if before == after => slot.write(hash, v),
            (Some(v), true) if before != after => slot.write(hash, v),
            // A record that stops publishing is forgotten.
            (None, true) => slot.write(0, 0),
            _ => {}
        }
    }

    /// Forgets every published record of the shard (an eviction may have
    /// dropped one that is not idle).
    fn unpublish_all(&self) {
        for slot in self.slots.iter() {
            if slot.hash.load(Ordering::Relaxed) != 0 {
                slot.write(0, 0);
            }
        }
    }

    /// Records where the table lies after an insert put `entry` in bucket `index`
    /// (the insert may have rebuilt the table elsewhere).
    fn locate(&self, table_buckets: usize, index: usize, entry: *const (K, V)) {
        let size = std::mem::size_of::<(K, V)>();
        let ctrl = entry.cast::<u8>().wrapping_add((index + 1) * size);
        self.ctrl.store(ctrl.cast_mut(), Ordering::Relaxed);
        self.mask
            .store(table_buckets.saturating_sub(1), Ordering::Relaxed);
    }
}

/// See the module documentation.
pub struct ShardedMap<K, V> {
    shards: Box<[PaddedCell<K, V>]>,
    hasher: foldhash::fast::RandomState,
    /// `shards.len() - 1`; the shard count is a power of two.
    mask: usize,
    /// Records one shard may hold before it must evict.
    max_len: usize,
    /// Bytes one shard may use (table plus record heap).
    shard_budget: usize,
    /// Bytes used outside the map that count against the same budget (the
    /// engine's open reservations): each shard's share shrinks by its part.
    outside: Arc<AtomicUsize>,
    stats: MapStats,
}

/// Bytes a table of `buckets` buckets occupies: one entry and one control byte each.
fn table_bytes<K, V>(buckets: usize) -> usize {
    buckets * (std::mem::size_of::<(K, V)>() + 1)
}

/// Buckets hashbrown allocates for a table of capacity `n`: at least 4, else
/// the power of two that keeps `n` within 7/8 of them.
fn buckets_for(n: usize) -> usize {
    match n {
        0..4 => 4,
        4..8 => 8,
        _ => (n * 8 / 7).next_power_of_two(),
    }
}

/// Buckets a table occupies (0 before it allocates, when hashbrown reports one).
/// Not derived from `capacity()`: that is len plus hashbrown's free room, which
/// the tombstones `retain` leaves shrink.
fn buckets<T>(table: &HashTable<T>) -> usize {
    match table.num_buckets() {
        1 => 0,
        n => n,
    }
}

impl<K: Hash + Eq, V: Record> ShardedMap<K, V> {
    /// A map of `shards` shards (rounded up to a power of two) using at most about
    /// `budget` bytes.
    pub fn new(budget: usize, shards: usize) -> Self {
        let n = shards.max(1).next_power_of_two();
        let shard_budget = budget / n;
        // The largest power-of-two bucket count whose table fits the shard budget;
        // hashbrown fills a table to 7/8 before it grows, so stopping at 7/8 of
        // those buckets means the table never outgrows its share.
        let mut buckets = 8usize;
        while table_bytes::<K, V>(buckets * 2) <= shard_budget {
            buckets *= 2;
        }
        let max_len = (buckets / 8 * 7).max(1);
        let shards = (0..n)
            .map(|_| {
                CachePadded::new(ShardCell {
                    shard: Mutex::new(Shard {
                        table: HashTable::new(),
                        heap: 0,
                        hits: 0,
                    }),
                    ctrl: AtomicPtr::new(std::ptr::null_mut()),
                    mask: AtomicUsize::new(0),
                    slots: CachePadded::default(),
                })
            })
            .collect();
        ShardedMap {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            mask: n - 1,
            max_len,
            shard_budget,
            outside: Arc::default(),
            stats: MapStats::default(),
        }
    }

    /// The counter of bytes used outside the map against its budget: whoever
    /// holds it adds and subtracts what it uses; shards evict accordingly
    /// (at their next insert or growth).
    pub fn outside(&self) -> Arc<AtomicUsize> {
        self.outside.clone()
    }

    fn shard_of(&self, hash: u64) -> usize {
        // hashbrown indexes buckets with the low bits and tags them with the top
        // seven; bits 40.. are used by neither for any table this map builds.
        (hash >> 40) as usize & self.mask
    }

    /// Runs `f` on the record for `key` under its shard's lock, creating it with
    /// `fresh` if absent. A record created here is kept only if it is not idle at
    /// `now` afterwards.
    pub fn with<Q, R>(
        &self,
        key: &Q,
        now: Nanos,
        ctx: &V::Ctx,
        fresh: impl FnOnce() -> V,
        f: impl FnOnce(&mut V) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.with_now(key, || now, ctx, fresh, |v, _| f(v))
    }

    /// Like [`ShardedMap::with`], with the time read by `now()` (once) after the
    /// record's memory has been prefetched and before the lock is taken, so a
    /// clock read overlaps the cache misses; `f` gets that time.
    #[inline]
    pub fn with_now<Q, R>(
        &self,
        key: &Q,
        now: impl FnOnce() -> Nanos,
        ctx: &V::Ctx,
        fresh: impl FnOnce() -> V,
        f: impl FnOnce(&mut V, Nanos) -> R,
    ) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let loaded = self.try_with_now(
            key,
            now,
            ctx,
            || Ok::<V, std::convert::Infallible>(fresh()),
            f,
        );
        match loaded {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// Like [`ShardedMap::with`], for records that must be loaded (from a
    /// store, say) when absent, which may fail: `load` runs under the shard's
    /// lock on a miss, and its error is returned without calling `f` or
    /// inserting anything.
    pub fn try_with<Q, R, E>(
        &self,
        key: &Q,
        now: Nanos,
        ctx: &V::Ctx,
        load: impl FnOnce() -> Result<V, E>,
        f: impl FnOnce(&mut V) -> R,
    ) -> Result<R, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_with_now(key, || now, ctx, load, |v, _| f(v))
    }

    /// The one body of the lookups above.
    #[inline(always)]
    fn try_with_now<Q, R, E>(
        &self,
        key: &Q,
        now: impl FnOnce() -> Nanos,
        ctx: &V::Ctx,
        load: impl FnOnce() -> Result<V, E>,
        f: impl FnOnce(&mut V, Nanos) -> R,
    ) -> Result<R, E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let cell = &self.shards[self.shard_of(hash)];
        cell.prefetch(hash);
        let now = now();
        let mut shard = cell.lock();
        let eq = |e: &(K, V)| e.0.borrow() == key;
        let sh = &mut *shard;
        if let Some((_, v)) = sh.table.find_mut(hash, eq) {
            sh.hits += 1;
            if V::heap_fixed(ctx) {
                let before = v.published();
                let r = f(v, now);
                if before.is_some() {
                    cell.publish(hash, before, v.published());
                }
                return Ok(r);
            }
            let before = v.heap_bytes();
            let r = f(v, now);
            let after = v.heap_bytes();
            shard.heap = shard.heap + after - before;
            if after > before && self.over_budget(&shard, 0) {
                // A record that grew in place (a longer log) can overrun the
                // share as an insert can.
                self.evict(&mut shard, now, ctx, 0);
                cell.unpublish_all();
            }
            return Ok(r);
        }
        let mut v = load()?;
        let r = f(&mut v, now);
        if v.idle_at(ctx) > now {
            let add = v.heap_bytes();
            if shard.table.len() >= self.max_len || self.over_budget(&shard, add) {
                self.evict(&mut shard, now, ctx, add);
                cell.unpublish_all();
            }
            let hasher = &self.hasher;
            let rehash = |e: &(K, V)| hasher.hash_one(&e.0);
            if shard.table.len() == shard.table.capacity() {
                // No free slot left, so hashbrown would grow the table; when the
                // room was used up by tombstones that `retain` left, it grows it
                // past its share although it is far from full. Rebuild it at the
                // size this insert needs instead: the same size when tombstones
                // filled it, the next one when it really is full (eviction above
                // keeps that within `max_len`).
                let old = std::mem::take(&mut shard.table);
                shard.table = HashTable::with_capacity(old.len() + 1);
                for e in old {
                    shard.table.insert_unique(rehash(&e), e, rehash);
                }
            }
            shard.heap += add;
            if let Some(p) = v.published() {
                // A key back in the map after it went idle: its slot, if it
                // still holds one, must follow it.
                cell.publish(hash, None, Some(p));
            }
            let e = shard.table.insert_unique(hash, (key.to_owned(), v), rehash);
            let (index, entry) = (e.bucket_index(), std::ptr::from_ref(e.get()));
            cell.locate(shard.table.num_buckets(), index, entry);
        }
        Ok(r)
    }

    /// The published view of `key`'s record ([`Record::published`]), if one of
    /// its shard's slots holds it: the view as of the last operation on it,
    /// read without the lock (a seqlock: loads only). `None` says nothing
    /// about the record; ask under the lock then. A match is by the key's
    /// 64-bit hash (seeded per map): two keys of one shard would have to
    /// collide on all 64 bits to read each other's view.
    #[inline]
    pub fn published<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        self.shards[self.shard_of(hash)].slot(hash).read(hash)
    }

    /// Runs `f` on the record for `key` if present, without creating one.
    pub fn get<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let cell = &self.shards[self.shard_of(hash)];
        cell.prefetch(hash);
        let shard = cell.lock();
        shard
            .table
            .find(hash, |e| e.0.borrow() == key)
            .map(|e| f(&e.1))
    }

    /// Whether the shard, plus `extra` heap bytes about to be added, exceeds its
    /// share of the budget. The table counts at the size it has after one more
    /// insert: when it has no free slot, an insert grows it, and heap that fit
    /// beside the smaller table could then push the shard past its share.
    /// (Counting it at its largest size instead would leave records that own
    /// heap — the engine's — only what the largest table leaves over.)
    fn over_budget(&self, shard: &Shard<K, V>, extra: usize) -> bool {
        let t = &shard.table;
        let buckets = if t.len() < t.capacity() {
            buckets(t)
        } else {
            buckets_for(t.len() + 1)
        };
        let outside = self.outside.load(Ordering::Relaxed) / self.shards.len();
        table_bytes::<K, V>(buckets) + shard.heap + extra + outside > self.shard_budget
    }

    /// Makes room in a full shard, and for the `extra` heap bytes of the record
    /// about to be inserted: idle records first, then the records closest to
    /// idle until a quarter of the shard is free.
    fn evict(&self, shard: &mut Shard<K, V>, now: Nanos, ctx: &V::Ctx, extra: usize) {
        let before = shard.table.len();
        let mut freed_heap = 0;
        shard.table.retain(|(_, v)| {
            let keep = v.idle_at(ctx) > now;
            if !keep {
                freed_heap += v.heap_bytes();
            }
            keep
        });
        shard.heap -= freed_heap;
        let idle = before - shard.table.len();
        self.stats
            .evicted_idle
            .fetch_add(idle as u64, Ordering::Relaxed);
        if idle >= (self.max_len / 8).max(1) && !self.over_budget(shard, extra) {
            return;
        }
        // Lossy: drop the records that would have become idle soonest, a
        // quarter of the shard at a time, until it is back under `target`
        // records and within its share. More than one round happens only when
        // the heap sits in records that were not closest to idle.
        let target = self.max_len / 4 * 3;
        loop {
            let len = shard.table.len();
            if len == 0 || (len <= target && !self.over_budget(shard, extra)) {
                return;
            }
            let mut idles: Vec<Nanos> = shard
                .table
                .iter()
                .filter(|(_, v)| !v.pinned(ctx))
                .map(|(_, v)| v.idle_at(ctx))
                .collect();
            if idles.is_empty() {
                // Only pinned records are left: the shard stays over its share
                // until they settle.
                return;
            }
            let drop_n = len
                .saturating_sub(target)
                .max(len / 4)
                .clamp(1, idles.len());
            let (_, &mut threshold, _) = idles.select_nth_unstable(drop_n - 1);
            let mut dropped = 0usize;
            let mut freed_heap = 0;
            shard.table.retain(|(_, v)| {
                let keep = dropped >= drop_n || v.pinned(ctx) || v.idle_at(ctx) > threshold;
                if !keep {
                    dropped += 1;
                    freed_heap += v.heap_bytes();
                }
                keep
            });
            shard.heap -= freed_heap;
            self.stats
                .evicted_active
                .fetch_add(dropped as u64, Ordering::Relaxed);
        }
    }

    /// Number of records held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().table.len()).sum()
    }

    /// Lookups that found their key in memory, since the map was made.
    pub fn hits(&self) -> u64 {
        self.shards.iter().map(|s| s.lock().hits).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held: every shard's table allocation plus the heap its records own.
    pub fn memory_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock();
                table_bytes::<K, V>(buckets(&s.table)) + s.heap
            })
            .sum()
    }

    /// Runs `f` on every record, one shard's lock at a time (for figures read
    /// rarely: the ad-ops page's impressions per user).
    pub fn for_each(&self, mut f: impl FnMut(&V)) {
        for s in self.shards.iter() {
            let s = s.lock();
            for (_, v) in s.table.iter() {
                f(v);
            }
        }
    }

    /// Drops every record idle at `now` (e.g. from a periodic sweeper). Returns
    /// how many were dropped.
    pub fn sweep(&self, now: Nanos, ctx: &V::Ctx) -> usize {
        let mut total = 0;
        for s in self.shards.iter() {
            let mut s = s.lock();
            let before = s.table.len();
            let mut freed = 0;
            s.table.retain(|(_, v)| {
                if v.idle_at(ctx) > now {
                    freed += v.prune(ctx);
                    true
                } else {
                    freed += v.heap_bytes();
                    false
                }
            });
            s.heap -= freed;
            total += before - s.table.len();
        }
        self.stats
            .evicted_idle
            .fetch_add(total as u64, Ordering::Relaxed);
        total
    }

    /// Drops every record whose key `keep` refuses, whatever its state
    /// (owner mode drops the users it no longer owns: their copies go stale
    /// once another node decides on them). Returns how many were dropped.
    pub fn retain_keys(&self, mut keep: impl FnMut(&K) -> bool) -> usize {
        let mut total = 0;
        for s in self.shards.iter() {
            let mut s = s.lock();
            let before = s.table.len();
            let mut freed = 0;
            s.table.retain(|(k, v)| {
                let kept = keep(k);
                if !kept {
                    freed += v.heap_bytes();
                }
                kept
            });
            s.heap -= freed;
            total += before - s.table.len();
        }
        total
    }

    pub fn stats(&self) -> &MapStats {
        &self.stats
    }

    /// Records one shard may hold (for tests and sizing).
    pub fn shard_capacity(&self) -> usize {
        self.max_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of `N` words, so entries of several sizes (some straddling
    /// cache lines) are checked.
    struct Words<const N: usize>([u64; N]);

    impl<const N: usize> Record for Words<N> {
        type Ctx = ();
        fn idle_at(&self, _: &()) -> Nanos {
            self.0[0]
        }
        fn heap_bytes(&self) -> usize {
            0
        }
        fn may_own_heap(_: &()) -> bool {
            false
        }
    }

    /// The prefetch addresses are hashbrown's real layout: every entry lies at
    /// `ctrl - (index + 1) * size`, and most entries sit in the bucket a probe
    /// starts at (`hash & mask`). If a hashbrown release changed either, the
    /// map would stay correct but lose its prefetch; this test says so.
    fn layout_is_as_assumed<const N: usize>() {
        let map: ShardedMap<u64, Words<N>> = ShardedMap::new(16 << 20, 4);
        for k in 0..20_000u64 {
            map.with(&k, 0, &(), || Words([1; N]), |_| ());
        }
        let size = std::mem::size_of::<(u64, Words<N>)>();
        let (mut home, mut total) = (0usize, 0usize);
        for cell in map.shards.iter() {
            let shard = cell.lock();
            let ctrl = cell.ctrl.load(Ordering::Relaxed);
            let mask = cell.mask.load(Ordering::Relaxed);
            assert_eq!(mask + 1, shard.table.num_buckets());
            for (k, _) in shard.table.iter() {
                let hash = map.hasher.hash_one(k);
                let index = shard
                    .table
                    .find_bucket_index(hash, |e| e.0 == *k)
                    .expect("the key was just iterated");
                let entry = shard.table.get_bucket(index).expect("occupied");
                let at = std::ptr::from_ref(entry).cast::<u8>();
                assert_eq!(at, ctrl.wrapping_sub((index + 1) * size), "key {k}");
                home += usize::from(index == hash as usize & mask);
                total += 1;
            }
        }
        assert_eq!(total, 20_000);
        // At this load (5 000 keys a shard in 8 192 buckets) about half the
        // keys sit in their exact home bucket; the share moves with the
        // per-process hash seed (49 % was seen), so the bound is a third:
        // far enough from chance to be stable, near enough to catch a layout
        // where the prefetched bucket is rarely the one used.
        assert!(
            home * 3 > total,
            "{home} of {total} keys in their home bucket"
        );
    }

    #[test]
    fn prefetch_addresses_match_hashbrown_layout() {
        layout_is_as_assumed::<1>();
        layout_is_as_assumed::<2>();
        layout_is_as_assumed::<4>();
    }
}
