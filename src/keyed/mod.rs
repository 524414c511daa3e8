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

use crate::clock::{Clock, Nanos, Span, SystemClock};
use crate::limits::adaptive::Sample;
use crate::limits::priority::Priority;
use crate::limits::rate::{Rate, RateState};
use crate::limits::stack::{Decision, OnLimit, Pending, Stack, Verdict};
use crate::limits::window::Layout;
use crate::limits::{Hold, Item, ItemState};
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

    /// Rate, fixed, calendar and approximate window states are inline and of
    /// fixed size, so a record of only those (boxed when several) never changes
    /// its heap in place: measuring it twice per access would cost more than
    /// deciding a three-item stack's probe.
    fn heap_fixed(stack: &Stack) -> bool {
        stack.items().iter().all(|item| match item {
            Item::Rate { .. } => true,
            Item::Window(w) => !matches!(w.layout, Layout::Rolling { .. }),
            Item::Budget(_) | Item::Concurrency(_) | Item::Adaptive(_) => false,
        })
    }

    fn heap_bytes(&self) -> usize {
        let own = match self {
            StackRecord::One(_) => 0,
            StackRecord::Many(v) => std::mem::size_of_val::<[ItemState]>(v),
        };
        own + self
            .states()
            .iter()
            .map(ItemState::heap_bytes)
            .sum::<usize>()
    }
}

/// The record of a one-item `rate` or `gap` policy whose emission interval is a
/// whole number of ns (`1000/s`, `100/h`, `gap 1ms`; see
/// [`crate::limits::rate::Rate::whole_ns`]): the TAT in ns, 0 when fresh.
///
/// 8 bytes, so a `u64` key's map entry is 16 bytes where a [`StackRecord`]'s is
/// 40. Among many keys a lookup costs a cache miss per cache line its entry
/// touches, and a smaller table keeps more of it in cache, so the entry size is
/// the speed of a large keyed limiter.
///
/// 64 bits of ns reach the year 2554, so it is only used for rates whose
/// burst·T is at most [`TAT_RECORD_MAX_REFILL`]: decisions then keep the TAT
/// below 2^64 ns until the year 2407. (A commit charging far beyond the burst
/// can take the TAT further; it saturates at 2^64 − 1 ns, and the key stays
/// denied until then. A [`RateRecord`] keeps any TAT exactly.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TatRecord(pub Nanos);

/// The longest burst·T (plus delay-mode wait) a [`TatRecord`] is used for:
/// 2^62 ns, about 146 years.
pub const TAT_RECORD_MAX_REFILL: Nanos = 1 << 62;

/// The record of any other one-item `rate` or `gap` policy (`3/s`: the TAT
/// needs its remainder in 1/q ns): its [`RateState`], 16 bytes, so a `u64`
/// key's entry is 24.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateRecord(pub RateState);

/// A record whose item states a [`Stack`] decides on.
trait Slots: Record<Ctx = Stack> {
    /// A fresh record for `stack`.
    fn fresh(stack: &Stack) -> Self;
    /// Runs `f` on the record's item states, one per item of the stack.
    fn with_states<R>(&mut self, f: impl FnOnce(&mut [ItemState]) -> R) -> R;
    /// [`Stack::admit`] on this record.
    fn admit(&mut self, stack: &Stack, now: Nanos, cost: u64) -> Verdict {
        self.with_states(|st| stack.admit(st, now, cost))
    }
}

/// The one item of a stack that is a single `rate` or `gap` item.
fn one_rate(stack: &Stack) -> Option<&Rate> {
    match stack.items() {
        [Item::Rate { rate, .. }] => Some(rate),
        _ => None,
    }
}

/// [`Stack::admit`] for a stack whose one item is `rate`, straight on its
/// state: the same decision and debit (`admit_rate_is_stack_admit` checks it
/// over random streams, delay mode included), without the stack's per-item
/// loops and `ItemState` dispatch, which cost four times the GCRA arithmetic
/// itself on a hot key.
fn admit_rate(
    rate: &Rate,
    on_limit: OnLimit,
    st: &mut RateState,
    now: Nanos,
    cost: u64,
) -> Verdict {
    let allowed = |delay| Verdict {
        allowed: true,
        delay,
        retry_after: None,
    };
    if cost == 0 {
        // A peek: allowed, debits nothing.
        return allowed(0);
    }
    let p = rate.probe(st, now, cost);
    if p.allowed {
        rate.apply(st, &p, cost);
        return allowed(0);
    }
    let retry_after = rate.retry_after(&p, now, cost);
    if let (OnLimit::Delay { max_delay }, Some(wait)) = (on_limit, retry_after) {
        // Delay mode: a rate item's wait is its retry_after; the debit takes
        // the future slot the probe computed.
        if let Ok(wait) = Nanos::try_from(wait)
            && wait <= max_delay
        {
            rate.apply(st, &p, cost);
            return allowed(wait);
        }
    }
    Verdict {
        allowed: false,
        delay: 0,
        retry_after,
    }
}

impl Slots for StackRecord {
    fn fresh(stack: &Stack) -> Self {
        StackRecord::fresh(stack)
    }

    fn with_states<R>(&mut self, f: impl FnOnce(&mut [ItemState]) -> R) -> R {
        f(self.states_mut())
    }
}

// The compact records are decided as the one `ItemState` they stand for, built
// on the stack and written back: the limit arithmetic stays in one place, and
// the copy is a few register moves. A rate item only ever leaves a `Rate` state
// (an all-zero `RateState` reads exactly as `Fresh`), so the write-back sees
// nothing else.

impl Slots for TatRecord {
    fn fresh(_: &Stack) -> Self {
        TatRecord(0)
    }

    fn with_states<R>(&mut self, f: impl FnOnce(&mut [ItemState]) -> R) -> R {
        let mut st = [ItemState::Rate(RateState::from_ns(self.0))];
        let r = f(&mut st);
        if let [ItemState::Rate(s)] = &st {
            self.0 = s.unit_ns();
        }
        r
    }

    fn admit(&mut self, stack: &Stack, now: Nanos, cost: u64) -> Verdict {
        let Some(rate) = one_rate(stack) else {
            return self.with_states(|st| stack.admit(st, now, cost));
        };
        let mut st = RateState::from_ns(self.0);
        let v = admit_rate(rate, stack.on_limit(), &mut st, now, cost);
        self.0 = st.unit_ns();
        v
    }
}

impl Record for TatRecord {
    type Ctx = Stack;

    /// The TAT: what a denial reads ([`KeyedLimiter::admit`]).
    fn published(&self) -> Option<u64> {
        Some(self.0)
    }

    fn idle_at(&self, stack: &Stack) -> Nanos {
        stack.idle_at(&[ItemState::Rate(RateState::from_ns(self.0))])
    }

    fn heap_bytes(&self) -> usize {
        0
    }

    fn may_own_heap(_: &Stack) -> bool {
        false
    }
}

impl Slots for RateRecord {
    fn fresh(_: &Stack) -> Self {
        RateRecord(RateState::default())
    }

    fn with_states<R>(&mut self, f: impl FnOnce(&mut [ItemState]) -> R) -> R {
        let mut st = [ItemState::Rate(self.0)];
        let r = f(&mut st);
        if let [ItemState::Rate(s)] = &st {
            self.0 = *s;
        }
        r
    }

    fn admit(&mut self, stack: &Stack, now: Nanos, cost: u64) -> Verdict {
        match one_rate(stack) {
            Some(rate) => admit_rate(rate, stack.on_limit(), &mut self.0, now, cost),
            None => self.with_states(|st| stack.admit(st, now, cost)),
        }
    }
}

impl Record for RateRecord {
    type Ctx = Stack;

    fn idle_at(&self, stack: &Stack) -> Nanos {
        stack.idle_at(&[ItemState::Rate(self.0)])
    }

    fn heap_bytes(&self) -> usize {
        0
    }

    fn may_own_heap(_: &Stack) -> bool {
        false
    }
}

/// The records of a [`KeyedLimiter`], in the smallest layout its policy allows.
enum Records<K> {
    /// One whole-ns `rate` or `gap` item.
    Tat(ShardedMap<K, TatRecord>),
    /// One other `rate` or `gap` item.
    Rate(ShardedMap<K, RateRecord>),
    /// Anything else.
    Stack(ShardedMap<K, StackRecord>),
}

/// Which record layout a [`KeyedLimiter`] uses for a stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordLayout {
    /// [`TatRecord`], 8 bytes per key.
    Tat,
    /// [`RateRecord`], 16 bytes per key.
    Rate,
    /// [`StackRecord`], 32 bytes per key plus boxed states for several items.
    Stack,
}

impl RecordLayout {
    /// The smallest layout that holds `stack`'s states exactly.
    pub fn for_stack(stack: &Stack) -> Self {
        // The one-rate layouts decide on the rate itself: a stack whose
        // classes see other ceilings goes through the stack.
        if stack.has_classes() {
            return RecordLayout::Stack;
        }
        match stack.items() {
            [Item::Rate { rate, .. }]
                if rate.whole_ns()
                    && rate.refill_ns() + Span::from(max_delay(stack))
                        <= Span::from(TAT_RECORD_MAX_REFILL) =>
            {
                RecordLayout::Tat
            }
            [Item::Rate { .. }] => RecordLayout::Rate,
            _ => RecordLayout::Stack,
        }
    }
}

/// The longest wait `stack`'s delay mode accepts (0 without delay mode).
fn max_delay(stack: &Stack) -> Nanos {
    match stack.on_limit() {
        OnLimit::Delay { max_delay } => max_delay,
        OnLimit::Reject => 0,
    }
}

/// Runs `$body` with `$m` bound to whichever map `$records` holds.
macro_rules! on_map {
    ($records:expr, $m:ident => $body:expr) => {
        match $records {
            Records::Tat($m) => $body,
            Records::Rate($m) => $body,
            Records::Stack($m) => $body,
        }
    };
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
    map: Records<K>,
    clock: C,
}

/// One step on `key`'s item states under its shard's lock; the time is read by
/// `now` once the record's memory is being fetched (see [`ShardedMap::with_now`]).
fn step<K, V, Q, R>(
    map: &ShardedMap<K, V>,
    stack: &Stack,
    key: &Q,
    now: impl FnOnce() -> Nanos,
    f: impl FnOnce(&mut [ItemState], Nanos) -> R,
) -> R
where
    K: Hash + Eq + std::borrow::Borrow<Q>,
    V: Slots,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    map.with_now(
        key,
        now,
        stack,
        || V::fresh(stack),
        |rec, now| rec.with_states(|states| f(states, now)),
    )
}

/// The denial of `cost` on `key`, decided from its published TAT without a
/// lock or a write, as governor's is (one atomic read), when the key is hot
/// (it has been denied since it last changed, see [`ShardedMap::published`])
/// and its one `rate` item denies; `None` otherwise, having changed nothing.
/// The TAT read is the one the last operation on the key left, so the
/// verdict is the one the locked path gives at `now`.
#[inline]
fn deny_published<K, Q>(
    map: &ShardedMap<K, TatRecord>,
    stack: &Stack,
    key: &Q,
    cost: u64,
    now: impl FnOnce() -> Nanos,
) -> Option<Verdict>
where
    K: Hash + Eq + std::borrow::Borrow<Q>,
    Q: Hash + Eq + ?Sized,
{
    // Delay mode debits when it allows late: only plain denials here.
    if cost == 0 || stack.on_limit() != OnLimit::Reject {
        return None;
    }
    let rate = one_rate(stack)?;
    let st = RateState::from_ns(map.published(key)?);
    let now = now();
    let p = rate.probe(&st, now, cost);
    (!p.allowed).then(|| Verdict {
        allowed: false,
        delay: 0,
        retry_after: rate.retry_after(&p, now, cost),
    })
}

/// [`Stack::admit`] on `key`'s record (see [`step`]).
fn admit_step<K, V, Q>(
    map: &ShardedMap<K, V>,
    stack: &Stack,
    key: &Q,
    now: impl FnOnce() -> Nanos,
    cost: u64,
) -> Verdict
where
    K: Hash + Eq + std::borrow::Borrow<Q>,
    V: Slots,
    Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
{
    map.with_now(
        key,
        now,
        stack,
        || V::fresh(stack),
        |rec, now| rec.admit(stack, now, cost),
    )
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
        let (budget, shards) = (options.memory_budget, options.shards);
        let map = match RecordLayout::for_stack(&stack) {
            RecordLayout::Tat => Records::Tat(ShardedMap::new(budget, shards)),
            RecordLayout::Rate => Records::Rate(ShardedMap::new(budget, shards)),
            RecordLayout::Stack => Records::Stack(ShardedMap::new(budget, shards)),
        };
        KeyedLimiter { stack, map, clock }
    }

    /// The compiled policy (for item names and kinds when reporting).
    pub fn stack(&self) -> &Stack {
        &self.stack
    }

    /// The record layout this limiter's policy gets.
    pub fn record_layout(&self) -> RecordLayout {
        match &self.map {
            Records::Tat(_) => RecordLayout::Tat,
            Records::Rate(_) => RecordLayout::Rate,
            Records::Stack(_) => RecordLayout::Stack,
        }
    }

    /// One step on `key`'s item states at the time `now` gives.
    fn on_states<Q, R>(
        &self,
        key: &Q,
        now: impl FnOnce() -> Nanos,
        f: impl FnOnce(&Stack, &mut [ItemState], Nanos) -> R,
    ) -> R
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let stack = &self.stack;
        on_map!(&self.map, m => step(m, stack, key, now, |st, now| f(stack, st, now)))
    }

    /// Decides `cost` units for `key` now and debits them if allowed.
    pub fn check<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_as(key, cost, Priority::Default)
    }

    /// [`KeyedLimiter::check`] for a request of class `class`: items with
    /// priorities decide it as that class sees them (docs/semantics.md §2.5).
    pub fn check_as<Q>(&self, key: &Q, cost: u64, class: Priority) -> Decision
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // Only the decision leaves the closure: carrying the (empty) pending part
        // out too would copy a few hundred bytes more per call.
        self.on_states(
            key,
            || self.clock.now(),
            |stack, st, now| stack.decide_as(st, now, cost, Hold::Immediate, class).0,
        )
    }

    /// Like [`KeyedLimiter::check`] (the same decision and debit) without the
    /// per-item figures: allowed or not, the delay, and when to retry.
    pub fn admit<Q>(&self, key: &Q, cost: u64) -> Verdict
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let (stack, now) = (&self.stack, || self.clock.now());
        if let Records::Tat(m) = &self.map
            && let Some(v) = deny_published(m, stack, key, cost, now)
        {
            return v;
        }
        on_map!(&self.map, m => admit_step(m, stack, key, now, cost))
    }

    /// Like [`KeyedLimiter::check`], but holds the debit as pending until
    /// `ttl` from now; the returned [`Pending`] (present when allowed and
    /// cost > 0) releases or commits it.
    pub fn reserve<Q>(&self, key: &Q, cost: u64, ttl: Nanos) -> (Decision, Option<Pending>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.reserve_as(key, cost, ttl, Priority::Default)
    }

    /// [`KeyedLimiter::reserve`] for a request of class `class`.
    pub fn reserve_as<Q>(
        &self,
        key: &Q,
        cost: u64,
        ttl: Nanos,
        class: Priority,
    ) -> (Decision, Option<Pending>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_states(
            key,
            || self.clock.now(),
            |stack, st, now| {
                let deadline = now.saturating_add(ttl);
                stack.decide_as(st, now, cost, Hold::Reserve { deadline }, class)
            },
        )
    }

    /// Undoes a reservation's pending debits.
    pub fn release<Q>(&self, key: &Q, pending: &Pending)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.release_reporting(key, pending, None)
    }

    /// [`KeyedLimiter::release`] with what happened to the work the
    /// reservation admitted: the stack's adaptive items take `sample`
    /// first (docs/adaptive.md).
    pub fn release_reporting<Q>(&self, key: &Q, pending: &Pending, sample: Option<Sample>)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_states(
            key,
            || self.clock.now(),
            |stack, st, now| {
                if let Some(s) = sample {
                    stack.take_sample(st, pending, s, now);
                }
                stack.release(st, pending, now)
            },
        )
    }

    /// Makes a reservation's pending debits permanent at `final_cost`.
    pub fn commit<Q>(&self, key: &Q, pending: &Pending, final_cost: u64)
    where
        K: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.on_states(
            key,
            || self.clock.now(),
            |stack, st, now| stack.commit(st, pending, final_cost, now),
        )
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        on_map!(&self.map, m => m.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by the limiter's records (tables and record heap).
    pub fn memory_bytes(&self) -> usize {
        on_map!(&self.map, m => m.memory_bytes())
    }

    /// Eviction counters.
    pub fn stats(&self) -> &MapStats {
        on_map!(&self.map, m => m.stats())
    }

    /// Drops every key whose state is back to fresh; returns how many.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        on_map!(&self.map, m => m.sweep(now, &self.stack))
    }

    /// `key`'s published TAT, if a slot holds it (tests).
    #[cfg(test)]
    fn map_published(&self, key: &K) -> Option<u64> {
        match &self.map {
            Records::Tat(m) => m.published(key),
            _ => None,
        }
    }

    /// Records one shard may hold (for tests and sizing).
    pub fn shard_capacity(&self) -> usize {
        on_map!(&self.map, m => m.shard_capacity())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{MS, SECOND};
    use crate::limits::rate::Rate;

    /// splitmix64, for a repeatable stream.
    fn mix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The one-rate fast path gives `Stack::admit`'s verdict and state on
    /// random streams: allowed and denied requests, peeks, costs over the
    /// burst, whole-ns and fractional intervals, reject and delay modes, and
    /// through both compact records.
    #[test]
    fn admit_rate_is_stack_admit() {
        let rates = [
            Rate::new(1000, SECOND, 1000),
            Rate::new(3, SECOND, 5),
            Rate::new(7, 60 * SECOND, 2),
            Rate::new(1, MS, 1),
        ];
        let modes = [
            OnLimit::Reject,
            OnLimit::Delay { max_delay: 1 },
            OnLimit::Delay {
                max_delay: 400 * MS,
            },
        ];
        let mut seed = 0u64;
        for rate in &rates {
            for &mode in &modes {
                let item = Item::Rate {
                    rate: rate.clone(),
                    kind: crate::limits::Kind::Rate,
                };
                let stack = Stack::new(vec![item], vec!["r".to_owned()], mode);
                let layout = RecordLayout::for_stack(&stack);
                let mut want = stack.fresh_state();
                let mut tat = TatRecord(0);
                let mut rec = RateRecord::default();
                let mut now = 1_700_000_000 * SECOND;
                for _ in 0..5_000 {
                    seed += 1;
                    let r = mix(seed);
                    now += r % (300 * MS);
                    let cost = (r >> 32) % 7;
                    let v = stack.admit(&mut want, now, cost);
                    assert_eq!(rec.admit(&stack, now, cost), v, "{rate:?} {mode:?}");
                    assert_eq!(norm(&[ItemState::Rate(rec.0)]), norm(&want));
                    if layout == RecordLayout::Tat {
                        assert_eq!(tat.admit(&stack, now, cost), v, "{rate:?} {mode:?}");
                        // The same TAT, in ns (the forms differ: a TatRecord
                        // reads its ns as whole ns, a decision sets it scaled).
                        let ns = |s: &[ItemState]| match s {
                            [ItemState::Rate(r)] => r.unit_ns(),
                            _ => 0,
                        };
                        tat.with_states(|s| assert_eq!(ns(s), ns(&want)));
                    }
                }
            }
        }
    }

    /// A limiter of `policy` (JSON) on `u64` keys and a manual clock.
    fn manual(
        policy: &str,
        opts: LimiterOptions,
    ) -> (
        KeyedLimiter<u64, std::sync::Arc<crate::clock::ManualClock>>,
        std::sync::Arc<crate::clock::ManualClock>,
    ) {
        let policy: PolicyDef = crate::model::from_json(policy).unwrap();
        let clock = std::sync::Arc::new(crate::clock::ManualClock::new(1_700_000_000 * SECOND));
        let lim = KeyedLimiter::with_clock(&policy, opts, clock.clone()).unwrap();
        (lim, clock)
    }

    /// Denials read from a hot key's published TAT (no lock) give the
    /// locked path's verdicts on a random stream over many keys (slots shared
    /// and taken over), with reservations released (the TAT moving back),
    /// sweeps, and time moving.
    #[test]
    fn published_denials_are_the_locked_verdicts() {
        let opts = LimiterOptions {
            memory_budget: 1 << 20,
            shards: 4,
        };
        let (lim, clock) = manual(
            r#"{"limits": [{"kind": "rate", "rate": 10, "per": "1s", "burst": 5}]}"#,
            opts,
        );
        assert_eq!(lim.record_layout(), RecordLayout::Tat);
        let stack = lim.stack().clone();
        let mut want: std::collections::HashMap<u64, Vec<ItemState>> = Default::default();
        let mut fast = 0;
        for i in 0..200_000u64 {
            let r = mix(i);
            let key = r % 40;
            if r.is_multiple_of(97) {
                clock.advance(((r >> 8) % 400) * MS);
            }
            let now = crate::clock::Clock::now(&clock);
            let st = want.entry(key).or_insert_with(|| stack.fresh_state());
            match (r >> 16) % 10 {
                0 => {
                    // Reserved, then released: the TAT moves back.
                    let (d, pending) = lim.reserve(&key, 1, SECOND);
                    let hold = Hold::Reserve {
                        deadline: now + SECOND,
                    };
                    let (w, wp) = stack.decide(st, now, 1, hold);
                    assert_eq!(d.allowed, w.allowed, "step {i} key {key}");
                    if let (Some(p), Some(q)) = (pending, wp) {
                        lim.release(&key, &p);
                        stack.release(st, &q, now);
                    }
                }
                1 if r.is_multiple_of(13) => {
                    lim.sweep();
                }
                _ => {
                    let cost = (r >> 24) % 3;
                    fast += usize::from(cost > 0 && lim.map_published(&key).is_some());
                    let v = lim.admit(&key, cost);
                    assert_eq!(v, stack.admit(st, now, cost), "step {i} key {key}");
                }
            }
        }
        assert!(fast > 10_000, "{fast} decisions could read a published TAT");
    }

    /// Threads denied on one hot key without a lock never let more through
    /// than the limit.
    #[test]
    fn a_hot_key_admits_exactly_its_burst_across_threads() {
        let (lim, clock) = manual(
            r#"{"limits": [{"kind": "rate", "rate": 1000, "per": "1s", "burst": 1000}]}"#,
            LimiterOptions::default(),
        );
        for round in 0..3u64 {
            let allowed = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..20_000 {
                            if lim.admit(&7, 1).allowed {
                                allowed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    });
                }
            });
            // The first round gets the burst; each later one the 250 units
            // that 250 ms refill.
            let want = if round == 0 { 1000 } else { 250 };
            assert_eq!(allowed.into_inner(), want, "round {round}");
            clock.advance(250 * MS);
        }
    }

    /// States with `Fresh` written as the all-zero rate state it reads as.
    fn norm(states: &[ItemState]) -> Vec<ItemState> {
        states
            .iter()
            .map(|s| match s {
                ItemState::Fresh => ItemState::Rate(RateState::default()),
                s => s.clone(),
            })
            .collect()
    }
}
