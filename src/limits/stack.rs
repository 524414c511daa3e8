//! The stack evaluator: a request is allowed only if every item allows it, and then
//! every item is debited; a denied request debits nothing (docs/semantics.md §3).

use smallvec::SmallVec;

use crate::clock::{Nanos, Span};
use crate::limits::adaptive::Sample;
use crate::limits::priority::{Classes, Priority};
use crate::limits::{Hold, Item, ItemFigures, ItemState, Kind, PendingItem};

/// What to do when a request is denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// Deny.
    Reject,
    /// Shape instead of police: when every denying item is `rate` or `gap` and
    /// the wait is at most `max_delay`, debit the future slot and allow with a
    /// delay.
    Delay { max_delay: Nanos },
}

/// A compiled policy: its items in definition order, with their reported names.
#[derive(Debug, Clone, PartialEq)]
pub struct Stack {
    items: Vec<Item>,
    /// Reported names: the given `name`, or `<kind>-<index>`.
    names: Vec<String>,
    on_limit: OnLimit,
    /// Whether a record of this stack's states can own heap memory (several
    /// items are boxed; a log, budget or concurrency state allocates). Lets the
    /// keyed map skip measuring plain one-item records on every access.
    records_own_heap: bool,
    /// The API's `RateLimit-Policy` field value: it depends on the stack
    /// alone and is sent with every decision, so it is built once (see
    /// [`Stack::policy_field`]).
    policy_field: std::sync::OnceLock<Box<str>>,
    /// Per item, how each priority class sees it (docs/semantics.md §2.5);
    /// `None` when no item names a class, so a stack without priorities
    /// decides exactly as before.
    classes: Option<Box<[Option<Classes>]>>,
}

/// A decision and every item's figures.
///
/// Items live in a `SmallVec` so the common stacks (up to four items) are decided
/// without a heap allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// How long the caller should wait before acting (delay mode), else 0.
    pub delay: Nanos,
    /// For a denial: the max over denying items, `None` if any says never.
    pub retry_after: Option<Span>,
    /// The least `remaining` over items.
    pub remaining: u64,
    /// `reset_after` of the item with the least remaining (ties: the larger).
    pub reset_after: Span,
    /// Per item, in definition order.
    pub items: SmallVec<[ItemFigures; 4]>,
}

impl Decision {
    /// Index of the item whose figures go into the `RateLimit` header: the one
    /// with the least remaining, ties to the larger reset_after.
    pub fn tightest(&self) -> usize {
        if self.items.len() <= 1 {
            return 0;
        }
        let mut best = 0;
        for (i, f) in self.items.iter().enumerate().skip(1) {
            let b = &self.items[best];
            if (f.remaining, std::cmp::Reverse(f.reset_after))
                < (b.remaining, std::cmp::Reverse(b.reset_after))
            {
                best = i;
            }
        }
        best
    }
}

/// The outcome of [`Stack::admit`]: a decision without per-item figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// How long to wait before acting (delay mode), else 0.
    pub delay: Nanos,
    /// For a denial: when the same request could pass, `None` if never.
    pub retry_after: Option<Span>,
}

impl Verdict {
    const ALLOWED: Verdict = Verdict {
        allowed: true,
        delay: 0,
        retry_after: None,
    };
}

/// The pending debits of one reservation on one stack: enough to release or
/// commit it exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The cost reserved (every item was debited this much).
    pub cost: u64,
    /// Per item, in definition order.
    pub items: SmallVec<[PendingItem; 4]>,
}

impl Stack {
    /// A stack of already-validated items. `names[i]` is item i's reported name.
    pub fn new(items: Vec<Item>, names: Vec<String>, on_limit: OnLimit) -> Self {
        debug_assert_eq!(items.len(), names.len());
        let records_own_heap = items.len() > 1
            || items.iter().any(|i| match i {
                Item::Rate { .. } => false,
                Item::Window(w) => {
                    matches!(w.layout, crate::limits::window::Layout::Rolling { .. })
                }
                Item::Budget(_) | Item::Concurrency(_) | Item::Adaptive(_) => true,
            });
        Stack {
            items,
            names,
            on_limit,
            records_own_heap,
            policy_field: std::sync::OnceLock::new(),
            classes: None,
        }
    }

    /// The same stack with each item's priority classes (one per item, as
    /// compiled from its `priorities`).
    pub fn with_classes(mut self, classes: Vec<Option<Classes>>) -> Self {
        debug_assert_eq!(classes.len(), self.items.len());
        if classes.iter().any(Option::is_some) {
            self.classes = Some(classes.into_boxed_slice());
        }
        self
    }

    /// Item `i` as class `p` sees it: what it is probed, reported and
    /// retried against. Debits always go through the item itself, whose
    /// state every class shares.
    pub fn item_for(&self, i: usize, p: Priority) -> &Item {
        match &self.classes {
            Some(c) => crate::limits::priority::item_for(&self.items[i], c[i].as_ref(), p),
            None => &self.items[i],
        }
    }

    /// Whether any item names a priority class.
    pub fn has_classes(&self) -> bool {
        self.classes.is_some()
    }

    /// Item `i`'s classes, if it has any.
    pub fn classes_of(&self, i: usize) -> Option<&Classes> {
        self.classes.as_ref().and_then(|c| c[i].as_ref())
    }

    /// Whether a record of this stack's states can own heap memory.
    /// The `RateLimit-Policy` field value of this stack, built by `build` on
    /// the first call and kept. The API formats it (headers are its concern);
    /// the stack only keeps it, as it keeps the reported names.
    pub fn policy_field(&self, build: impl FnOnce(&Stack) -> String) -> &str {
        self.policy_field.get_or_init(|| build(self).into())
    }

    pub fn records_own_heap(&self) -> bool {
        self.records_own_heap
    }

    pub fn items(&self) -> &[Item] {
        &self.items
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    pub fn on_limit(&self) -> OnLimit {
        self.on_limit
    }

    /// A fresh state for this stack: one [`ItemState`] per item.
    pub fn fresh_state(&self) -> Vec<ItemState> {
        vec![ItemState::Fresh; self.items.len()]
    }

    /// Decides a request of `cost` at `now` over `states` (one per item, as from
    /// [`Stack::fresh_state`]) and, if allowed, debits every item. With
    /// `Hold::Reserve`, an allowed non-zero request returns the [`Pending`]
    /// needed to release or commit it later.
    ///
    /// Atomicity is the caller's: `states` is borrowed mutably for the whole
    /// step, so whoever holds it (a lock on the record) makes the step atomic.
    pub fn decide(
        &self,
        states: &mut [ItemState],
        now: Nanos,
        cost: u64,
        hold: Hold,
    ) -> (Decision, Option<Pending>) {
        self.decide_as(states, now, cost, hold, Priority::Default)
    }

    /// [`Stack::decide`] for a request of class `class`: an item with
    /// priorities is decided and reported as that class sees it
    /// (docs/semantics.md §2.5).
    pub fn decide_as(
        &self,
        states: &mut [ItemState],
        now: Nanos,
        cost: u64,
        hold: Hold,
        class: Priority,
    ) -> (Decision, Option<Pending>) {
        debug_assert_eq!(states.len(), self.items.len());
        let reserve = matches!(hold, Hold::Reserve { .. });
        let mut pending = SmallVec::new();
        let delay = if cost == 0 {
            // A peek: always allowed, reserves and debits nothing.
            return (self.report(states, now, true, class, |_| None), None);
        } else {
            self.try_apply(
                states,
                now,
                cost,
                hold,
                class,
                reserve.then_some(&mut pending),
            )
        };
        let Some(delay) = delay else {
            let d = self.report(states, now, false, class, |i| {
                let (item, st) = (self.item_for(i, class), &states[i]);
                let p = item.probe(st, now, cost);
                (!p.allowed).then(|| item.retry(st, &p, now, cost))
            });
            return (d, None);
        };
        let mut decision = self.report(states, now, true, class, |_| None);
        decision.delay = delay;
        let pending = reserve.then_some(Pending {
            cost,
            items: pending,
        });
        (decision, pending)
    }

    /// The lean form of an immediate [`Stack::decide`]: the same decision and the
    /// same debit, without the per-item figures. This is what a caller that only
    /// needs allow / deny / retry (as governor's `check` gives) should use.
    pub fn admit(&self, states: &mut [ItemState], now: Nanos, cost: u64) -> Verdict {
        if cost == 0 {
            return Verdict::ALLOWED;
        }
        if let Some(delay) =
            self.try_apply(states, now, cost, Hold::Immediate, Priority::Default, None)
        {
            return Verdict {
                allowed: true,
                delay,
                retry_after: None,
            };
        }
        let mut retry_after = Some(0);
        for (i, st) in states.iter().enumerate() {
            let item = self.item_for(i, Priority::Default);
            let p = item.probe(st, now, cost);
            if !p.allowed {
                retry_after = match (retry_after, item.retry(st, &p, now, cost)) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
        Verdict {
            allowed: false,
            delay: 0,
            retry_after,
        }
    }

    /// Probes every item; if all allow (or delay mode accepts the wait), debits
    /// every item and returns the delay (0 unless delayed). Returns `None`, having
    /// changed nothing, for a denial. Pending items are pushed to `pending` when
    /// given.
    ///
    /// Probes are not kept between the two passes: recomputing one is a few
    /// multiplications, cheaper than storing them.
    fn try_apply(
        &self,
        states: &mut [ItemState],
        now: Nanos,
        cost: u64,
        hold: Hold,
        class: Priority,
        mut pending: Option<&mut SmallVec<[PendingItem; 4]>>,
    ) -> Option<Nanos> {
        let mut delay = 0;
        for (i, st) in states.iter().enumerate() {
            let item = self.item_for(i, class);
            let p = item.probe(st, now, cost);
            if p.allowed {
                continue;
            }
            // Delay mode: only rate and gap items may deny, and the wait must be
            // short enough. The wait of a denying rate item is its retry_after.
            let OnLimit::Delay { max_delay } = self.on_limit else {
                return None;
            };
            let shapeable = matches!(item.kind(), Kind::Rate | Kind::Gap);
            match item.retry(st, &p, now, cost) {
                Some(wait) if shapeable && wait <= Span::from(max_delay) => {
                    // At most max_delay, so it fits in Nanos.
                    delay = delay.max(Nanos::try_from(wait).unwrap_or(max_delay))
                }
                _ => return None,
            }
        }
        for (item, st) in self.items.iter().zip(states.iter_mut()) {
            let p = item.apply(st, now, cost, hold);
            if let Some(pending) = pending.as_deref_mut() {
                pending.push(p);
            }
        }
        Some(delay)
    }

    /// Builds the decision from the states as they are. `retry(i)` is `None` for
    /// an item that allows, `Some(retry_after)` for one that denies.
    fn report(
        &self,
        states: &[ItemState],
        now: Nanos,
        allowed: bool,
        class: Priority,
        retry: impl Fn(usize) -> Option<Option<Span>>,
    ) -> Decision {
        let mut items = SmallVec::new();
        let mut retry_after = Some(0);
        for (i, st) in states.iter().enumerate() {
            let item = self.item_for(i, class);
            let (remaining, reset_after) = item.figures(st, now);
            let r = retry(i);
            if let Some(r) = r {
                // The decision's retry is the max over denying items; one that
                // never passes makes the whole request never pass.
                retry_after = match (retry_after, r) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
            items.push(ItemFigures {
                allowed: r.is_none(),
                limit: item.limit_at(st),
                remaining,
                reset_after,
                retry_after: r.flatten(),
            });
        }
        let mut d = Decision {
            allowed,
            delay: 0,
            retry_after: if allowed { None } else { retry_after },
            remaining: 0,
            reset_after: 0,
            items,
        };
        if !d.items.is_empty() {
            let t = d.tightest();
            d.remaining = d.items[t].remaining;
            d.reset_after = d.items[t].reset_after;
        }
        d
    }

    /// Debits `cost` on every item at `now` even past its limit: usage that
    /// already happened and is only reported (docs/rls.md, "Reports and
    /// refunds"), as an unchecked impression is counted. Nothing is held.
    pub fn force(&self, states: &mut [ItemState], now: Nanos, cost: u64) {
        if cost == 0 {
            return;
        }
        for (item, st) in self.items.iter().zip(states.iter_mut()) {
            item.apply(st, now, cost, Hold::Immediate);
        }
    }

    /// Gives `cost` back on every item at `now`, floored at nothing used
    /// ([`Item::credit`]).
    pub fn credit(&self, states: &mut [ItemState], now: Nanos, cost: u64) {
        for (item, st) in self.items.iter().zip(states.iter_mut()) {
            item.credit(st, cost, now);
        }
    }

    /// Whether an item is `adaptive`: its callers should hold a
    /// reservation while their work runs and release it with a sample.
    pub fn has_adaptive(&self) -> bool {
        self.items.iter().any(|i| matches!(i, Item::Adaptive(_)))
    }

    /// Gives the adaptive items the `sample` a reservation's release or
    /// commit carries, before that settles it.
    pub fn take_sample(&self, states: &mut [ItemState], pending: &Pending, s: Sample, now: Nanos) {
        for ((item, st), p) in self.items.iter().zip(states).zip(&pending.items) {
            item.report(st, p, s, now);
        }
    }

    /// Undoes a reservation's pending debits as of `now` (a release, or its
    /// expiry with `now` = the deadline).
    pub fn release(&self, states: &mut [ItemState], pending: &Pending, now: Nanos) {
        for ((item, st), p) in self.items.iter().zip(states).zip(&pending.items) {
            item.release(st, p, pending.cost, now);
        }
    }

    /// Makes a reservation's pending debits permanent at `final_cost`.
    pub fn commit(&self, states: &mut [ItemState], pending: &Pending, final_cost: u64, now: Nanos) {
        for ((item, st), p) in self.items.iter().zip(states).zip(&pending.items) {
            item.commit(st, p, pending.cost, final_cost, now);
        }
    }

    /// The first instant from which every item's state equals a fresh one: a
    /// record idle from then on can be dropped without changing any answer.
    pub fn idle_at(&self, states: &[ItemState]) -> Nanos {
        self.items
            .iter()
            .zip(states)
            .map(|(item, st)| item.idle_at(st))
            .max()
            .unwrap_or(0)
    }
}
