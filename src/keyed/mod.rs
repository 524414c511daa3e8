//! An in-process keyed limiter: one policy, many keys, many threads, bounded
//! memory.
//!
//! ```
//! use freqcap::{KeyedLimiter, LimiterOptions, ManualClock, PolicyDef};
//!
//! let policy: PolicyDef = freqcap::model::from_json(
//!     r#"{"limits": [{"kind": "rate", "rate": 5, "per": "1s"},
//!                    {"kind": "window", "limit": 100, "window": "1h", "align": "fixed"}]}"#,
//! ).unwrap();
//! let clock = ManualClock::new(1_700_000_000_000_000_000);
//! let limiter = KeyedLimiter::with_clock(&policy, LimiterOptions::default(), clock).unwrap();
//! for _ in 0..5 {
//!     assert!(limiter.check(&"client-42", 1).allowed);
//! }
//! let d = limiter.check(&"client-42", 1);
//! assert!(!d.allowed);
//! assert_eq!(d.retry_after, Some(200_000_000)); // the next unit is 1/5 s away
//! ```

pub mod map;

use std::hash::Hash;

use crate::clock::{Clock, Nanos, SystemClock};
use crate::limits::stack::{Decision, Pending, Stack, Verdict};
use crate::limits::{Hold, ItemState};
use crate::model::{DefinitionError, PolicyDef};
pub use map::{MapStats, Record, ShardedMap};

/// The item states of one key: inline for a one-item policy (the common case,
/// and no heap allocation), boxed for more.
///
/// 32 bytes: the `Many` variant hides in a spare tag value of [`ItemState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackRecord {
    One(ItemState),
    Many(Box<[ItemState]>),
}

impl StackRecord {
    /// A fresh record for `stack`.
    pub fn fresh(stack: &Stack) -> Self {
        match stack.items().len() {
            1 => StackRecord::One(ItemState::Fresh),
            _ => StackRecord::Many(stack.fresh_state().into_boxed_slice()),
        }
    }

    pub fn states(&self) -> &[ItemState] {
        match self {
            StackRecord::One(s) => std::slice::from_ref(s),
            StackRecord::Many(v) => v,
        }
    }

    pub fn states_mut(&mut self) -> &mut [ItemState] {
        match self {
            StackRecord::One(s) => std::slice::from_mut(s),
            StackRecord::Many(v) => v,
        }
    }
}

impl Record for StackRecord {
    type Ctx = Stack;

    fn idle_at(&self, stack: &Stack) -> Nanos {
        stack.idle_at(self.states())
    }

    fn may_own_heap(stack: &Stack) -> bool {
        stack.records_own_heap()
    }

    fn heap_bytes(&self) -> usize {
        let own = match self {
            StackRecord::One(_) => 0,
            StackRecord::Many(v) => std::mem::size_of_val::<[ItemState]>(v),
        };
        own + self.states().iter().map(item_heap_bytes).sum::<usize>()
    }
}

/// Heap bytes owned by one item state.
fn item_heap_bytes(s: &ItemState) -> usize {
    use crate::limits::window::{Debit, LogState};
    match s {
        ItemState::Log(l) => {
            std::mem::size_of::<LogState>() + l.debits.capacity() * std::mem::size_of::<Debit>()
        }
        ItemState::Budget(_) => std::mem::size_of::<crate::limits::budget::BudgetState>(),
        ItemState::Concurrency(c) => c.deadlines.capacity() * std::mem::size_of::<Nanos>(),
        _ => 0,
    }
}

/// Sizing of a [`KeyedLimiter`].
#[derive(Debug, Clone, Copy)]
pub struct LimiterOptions {
    /// Bytes the limiter's records may use; past it, idle keys are dropped first
    /// and active ones only if that is not enough. Default 64 MiB.
    pub memory_budget: usize,
    /// Number of shards (rounded up to a power of two). Default: 16 per core,
    /// at least 64, so threads rarely meet on one lock.
    pub shards: usize,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        LimiterOptions {
            memory_budget: 64 << 20,
            shards: (cores * 16).max(64),
        }
    }
}

/// A policy applied per key, safe to share between threads (`&self` everywhere).
///
/// Each key's decision is one atomic step under its shard's lock: all items are
/// probed, then all debited or none. Keys whose state has returned to fresh are
/// dropped when memory is needed, so the limiter does not grow without bound
/// with one-time keys (unlike a map that needs a manual `retain_recent`).
///
/// Reservations made here must be released or committed by the caller; a
/// pending debit that is never released counts as spent (the engine adds
/// expiry on top of this).
pub struct KeyedLimiter<K, C = SystemClock> {
    stack: Stack,
    map: ShardedMap<K, StackRecord>,
    clock: C,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K, SystemClock> {
    /// A limiter for `policy` on the system clock.
    pub fn new(policy: &PolicyDef, options: LimiterOptions) -> Result<Self, DefinitionError> {
        Self::with_clock(policy, options, SystemClock::new())
    }
}

impl<K: Hash + Eq + Clone, C: Clock> KeyedLimiter<K, C> {
    /// A limiter for `policy` on the given clock.
    pub fn with_clock(
        policy: &PolicyDef,
        options: LimiterOptions,
        clock: C,
    ) -> Result<Self, DefinitionError> {
        Ok(Self::from_stack(policy.compile()?.stack, options, clock))
    }

    /// A limiter for an already compiled stack.
    pub fn from_stack(stack: Stack, options: LimiterOptions, clock: C) -> Self {
        KeyedLimiter {
            stack,
            map: ShardedMap::new(options.memory_budget, options.shards),
            clock,
        }
    }

    /// The compiled policy (for item names and kinds when reporting).
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    /// Decides `cost` units for `key` now and debits them if allowed.
    pub fn check<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        let stack = &self.stack;
        // Only the decision leaves the closure: carrying the (empty) pending part
        // out too would copy a few hundred bytes more per call.
        self.map.with(
            key,
            now,
            stack,
            || StackRecord::fresh(stack),
            |rec| stack.decide(rec.states_mut(), now, cost, Hold::Immediate).0,
        )
    }

    /// Like [`KeyedLimiter::check`] (the same decision and debit) without the
    /// per-item figures: allowed or not, the delay, and when to retry.
    pub fn admit<Q>(&self, key: &Q, cost: u64) -> Verdict
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        let stack = &self.stack;
        self.map.with(
            key,
            now,
            stack,
            || StackRecord::fresh(stack),
            |rec| stack.admit(rec.states_mut(), now, cost),
        )
    }

    /// Like [`KeyedLimiter::check`], but holds the debit as pending until
    /// `deadline`; the returned [`Pending`] (present when allowed and cost > 0)
    /// releases or commits it.
    pub fn reserve<Q>(&self, key: &Q, cost: u64, ttl: Nanos) -> (Decision, Option<Pending>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        self.decide_at(
            key,
            now,
            cost,
            Hold::Reserve {
                deadline: now.saturating_add(ttl),
            },
        )
    }

    /// The decision at an explicit time (tests, replay). `now` must not go back
    /// for a key; the system clock guarantees that.
    pub fn decide_at<Q>(
        &self,
        key: &Q,
        now: Nanos,
        cost: u64,
        hold: Hold,
    ) -> (Decision, Option<Pending>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let stack = &self.stack;
        self.map.with(
            key,
            now,
            stack,
            || StackRecord::fresh(stack),
            |rec| stack.decide(rec.states_mut(), now, cost, hold),
        )
    }

    /// Undoes a reservation's pending debits.
    pub fn release<Q>(&self, key: &Q, pending: &Pending)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        let stack = &self.stack;
        self.map.with(
            key,
            now,
            stack,
            || StackRecord::fresh(stack),
            |rec| stack.release(rec.states_mut(), pending, now),
        );
    }

    /// Makes a reservation's pending debits permanent at `final_cost`.
    pub fn commit<Q>(&self, key: &Q, pending: &Pending, final_cost: u64)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let now = self.clock.now();
        let stack = &self.stack;
        self.map.with(
            key,
            now,
            stack,
            || StackRecord::fresh(stack),
            |rec| stack.commit(rec.states_mut(), pending, final_cost, now),
        );
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes held by the limiter's records (tables and record heap).
    pub fn memory_bytes(&self) -> usize {
        self.map.memory_bytes()
    }

    /// Eviction counters.
    pub fn stats(&self) -> &MapStats {
        self.map.stats()
    }

    /// Drops every key whose state is back to fresh; returns how many.
    pub fn sweep(&self) -> usize {
        self.map.sweep(self.clock.now(), &self.stack)
    }
}
