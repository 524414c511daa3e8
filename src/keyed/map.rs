//! A sharded, memory-bounded map from key to record: the structure under
//! [`super::KeyedLimiter`] and, later, under the engine's hot tier.
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
//!   exceeded) plus the heap its records own. Heap is counted against the table
//!   at that full size, since the table grows to it as records arrive. When an
//!   insert would exceed it (or a record's heap grew past it), the shard first
//!   drops every *idle* record — one whose state equals a fresh one, so dropping
//!   it changes no future answer. Only if that frees less than an eighth does it
//!   evict *active* records, those closest to idle first, and count them in
//!   [`MapStats::evicted_active`]: the budget is then too small for the traffic
//!   and an operator needs to know. Both sweeps are O(shard) and happen at most
//!   once per eighth of a shard's capacity in inserts, so O(1) amortized.
//! - **Records that never mattered are never stored.** An operation on an absent
//!   key runs on a fresh record and inserts it only if it is no longer idle (a
//!   denied request or a peek on a new key allocates nothing).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

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
}

/// A shard behind its lock, alone on its cache line(s).
type ShardSlot<K, V> = CachePadded<Mutex<Shard<K, V>>>;

/// See the module documentation.
pub struct ShardedMap<K, V> {
    shards: Box<[ShardSlot<K, V>]>,
    hasher: foldhash::fast::RandomState,
    /// `shards.len() - 1`; the shard count is a power of two.
    mask: usize,
    /// Records one shard may hold before it must evict.
    max_len: usize,
    /// Bytes one shard may use (table plus record heap).
    shard_budget: usize,
    stats: MapStats,
}

/// Bytes a table of `buckets` buckets occupies: one entry and one control byte each.
fn table_bytes<K, V>(buckets: usize) -> usize {
    buckets * (std::mem::size_of::<(K, V)>() + 1)
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
                CachePadded::new(Mutex::new(Shard {
                    table: HashTable::new(),
                    heap: 0,
                }))
            })
            .collect();
        ShardedMap {
            shards,
            hasher: foldhash::fast::RandomState::default(),
            mask: n - 1,
            max_len,
            shard_budget,
            stats: MapStats::default(),
        }
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
        let hash = self.hasher.hash_one(key);
        let mut shard = self.shards[self.shard_of(hash)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let eq = |e: &(K, V)| e.0.borrow() == key;
        if let Some((_, v)) = shard.table.find_mut(hash, eq) {
            if !V::may_own_heap(ctx) {
                return f(v);
            }
            let before = v.heap_bytes();
            let r = f(v);
            let after = v.heap_bytes();
            shard.heap = shard.heap + after - before;
            if after > before && self.over_budget(&shard, 0) {
                // A record that grew in place (a longer log) can overrun the
                // share as an insert can.
                self.evict(&mut shard, now, ctx, 0);
            }
            return r;
        }
        let mut v = fresh();
        let r = f(&mut v);
        if v.idle_at(ctx) > now {
            let add = v.heap_bytes();
            if shard.table.len() >= self.max_len || self.over_budget(&shard, add) {
                self.evict(&mut shard, now, ctx, add);
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
            shard.heap += v.heap_bytes();
            shard.table.insert_unique(hash, (key.to_owned(), v), rehash);
        }
        r
    }

    /// Runs `f` on the record for `key` if present, without creating one.
    pub fn get<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hasher.hash_one(key);
        let shard = self.shards[self.shard_of(hash)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard
            .table
            .find(hash, |e| e.0.borrow() == key)
            .map(|e| f(&e.1))
    }

    /// Whether the shard, plus `extra` heap bytes about to be added, exceeds its
    /// share of the budget. The table counts at its largest size (`max_len` is
    /// 7/8 of its buckets): an insert may grow it there, and heap that fit beside
    /// the smaller table would then push the shard past its share.
    fn over_budget(&self, shard: &Shard<K, V>, extra: usize) -> bool {
        table_bytes::<K, V>(self.max_len / 7 * 8) + shard.heap + extra > self.shard_budget
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
            let drop_n = len.saturating_sub(target).max(len / 4).max(1);
            let mut idles: Vec<Nanos> = shard.table.iter().map(|(_, v)| v.idle_at(ctx)).collect();
            let (_, &mut threshold, _) = idles.select_nth_unstable(drop_n.min(len) - 1);
            let mut dropped = 0usize;
            let mut freed_heap = 0;
            shard.table.retain(|(_, v)| {
                let keep = dropped >= drop_n || v.idle_at(ctx) > threshold;
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
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).table.len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held: every shard's table allocation plus the heap its records own.
    pub fn memory_bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let s = s.lock().unwrap_or_else(PoisonError::into_inner);
                table_bytes::<K, V>(buckets(&s.table)) + s.heap
            })
            .sum()
    }

    /// Drops every record idle at `now` (e.g. from a periodic sweeper). Returns
    /// how many were dropped.
    pub fn sweep(&self, now: Nanos, ctx: &V::Ctx) -> usize {
        let mut total = 0;
        for s in self.shards.iter() {
            let mut s = s.lock().unwrap_or_else(PoisonError::into_inner);
            let before = s.table.len();
            let mut freed = 0;
            s.table.retain(|(_, v)| {
                let keep = v.idle_at(ctx) > now;
                if !keep {
                    freed += v.heap_bytes();
                }
                keep
            });
            s.heap -= freed;
            total += before - s.table.len();
        }
        self.stats
            .evicted_idle
            .fetch_add(total as u64, Ordering::Relaxed);
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
